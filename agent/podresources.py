"""The kubelet's PodResources API v1: which devices the kubelet gave each pod's
containers, read over its unix socket (``List``), and what the agent makes of it.

- :class:`PodResourcesClient` asks ``List`` with a hard deadline (2 s) and a cap on
  the answer's size (16 MiB, the kubelet's own client's cap). It never raises: a
  missing socket, a kubelet that does not answer in time, an answer too big or not
  decodable is an error in words on the :class:`Answer`, which still carries the
  last good answer, marked stale, and how old it is.
- :func:`shares_report` (pure) turns an answer into the node's ANN_GPU_SHARES: GPU
  UUID -> pod UID -> the units of ``gpu-scheduler.io/gpu-memory`` the pod holds there
  (distinct device IDs ``<UUID>::<k>`` of that GPU, over all its containers), or
  ``"whole"`` for a GPU given whole as ``nvidia.com/gpu`` (its ID is the GPU's UUID).
  PodResources names a pod ``namespace/name`` only; its UID is the one the kubelet's
  device checkpoint gives its device IDs (agent/kubelet_checkpoint.py), so a pod
  recreated under the same name never inherits the old one's GPU. IDs not of this
  node's GPUs (another plugin's, an unknown UUID, malformed) and pods whose UID is not
  known are left out and counted (:func:`read_shares`). :func:`encode_report`
  writes it the one way (sorted keys, compact), so "changed" is a string compare,
  and refuses what :func:`gpu_scheduler.sharing.read_report` would refuse.
- :func:`current_shares` (pure): the report while the answer is recent enough.
- :func:`allocated_ids` (pure): each resource's device IDs in use, for the device
  plugin.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import grpc

from agent import podresources_pb2 as pb
from agent import podresources_pb2_grpc as pb_grpc
from gpu_scheduler import contract, sharing
from gpu_scheduler.textclip import clip_text

log = logging.getLogger("gpu_scheduler.agent")

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_TIMEOUT_S = 2.0
#: The kubelet's own PodResources client refuses answers over 16 MiB.
MAX_RESPONSE_BYTES = 16 << 20

Response = pb.ListPodResourcesResponse

# Why a device ID was left out of the report (the keys of Shares.skipped).
MALFORMED = "malformed device ID"
NOT_OURS = "not one of this node's GPUs"
OVER = f"over {sharing.MAX_UNITS} units on one GPU"
NO_UID = "pod whose UID the kubelet's device checkpoint does not give"


# --- what a call gives --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Answer:
    """One ``List``: ``response`` is this call's answer when ``error`` is None; else
    the last good one (None when there never was one), and ``error`` says why this
    call got none. ``at``: when (monotonic) ``response`` was received."""

    response: Response | None
    error: str | None = None
    at: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def stale(self) -> bool:
        """A last good answer stands in for this call's."""
        return self.error is not None and self.response is not None

    def age(self, now: float) -> float | None:
        return None if self.at is None else now - self.at


# --- what the agent makes of it: pure ---------------------------------------------
@dataclass(frozen=True, slots=True)
class Shares:
    """What :func:`read_shares` made of an answer: the report, and how many device
    IDs it left out, by reason."""

    report: dict[str, dict[str, int | str]]
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def encoded(self) -> str | None:
        return encode_report(self.report)


def _devices(pod: pb.PodResources) -> Iterator[tuple[str, str]]:
    """(resource, device ID) for every device of every container of ``pod``."""
    for container in pod.containers:
        for devices in container.devices:
            for device in devices.device_ids:
                yield devices.resource_name, device


def read_shares(
    response: Response,
    our_gpus: Collection[str],
    uids: Mapping[str, str],
    init: Iterable[tuple[str, str, str]] = (),
) -> Shares:
    """The ANN_GPU_SHARES report of ``response`` (see the module), over ``our_gpus``
    (this node's GPU UUIDs: each is a key, ``{}`` when nothing is held there), each
    pod named by the UID ``uids`` (device ID -> pod UID) gives all its device IDs.
    ``init``: (pod UID, resource, device ID) that plain init containers of active
    pods hold (the kubelet's checkpoint; PodResources does not list them)."""
    ours = set(our_gpus)
    skipped: Counter[str] = Counter()
    units: dict[str, dict[str, set[str]]] = {uuid: {} for uuid in ours}
    whole: dict[str, set[str]] = {uuid: set() for uuid in ours}
    holders: list[tuple[str | None, list[tuple[str, str]]]]
    holders = [(None, list(_devices(pod))) for pod in response.pod_resources]
    by_uid: dict[str, list[tuple[str, str]]] = {}
    for uid, resource, device in init:
        by_uid.setdefault(uid, []).append((resource, device))
    holders.extend(by_uid.items())
    for given, devices in holders:
        held: list[tuple[str, str, str]] = []  # (resource, device ID, GPU UUID)
        for resource, device in devices:
            uuid = _gpu_of(resource, device, skipped)
            if uuid is None:
                continue
            if uuid not in ours:
                skipped[NOT_OURS] += 1
            else:
                held.append((resource, device, uuid))
        ids = [device for _, device, _ in held]
        key = _pod_uid(uids, ids) if given is None else _pod_uid({d: given for d in ids}, ids)
        if key is None:
            skipped[NO_UID] += len(held)
            continue
        for resource, device, uuid in held:
            if resource == contract.RESOURCE_GPU:
                whole[uuid].add(key)
            else:
                units[uuid].setdefault(key, set()).add(device)
    report: dict[str, dict[str, int | str]] = {}
    for uuid in sorted(ours):
        counts: dict[str, int | str] = {}
        for key, ids in units[uuid].items():
            if len(ids) > sharing.MAX_UNITS:
                skipped[OVER] += len(ids) - sharing.MAX_UNITS
            counts[key] = min(len(ids), sharing.MAX_UNITS)
        for key in whole[uuid]:
            counts[key] = sharing.WHOLE
        report[uuid] = dict(sorted(counts.items()))
    return Shares(report, dict(sorted(skipped.items())))


def _gpu_of(resource: str, device: str, skipped: Counter[str]) -> str | None:
    """The GPU UUID a device ID of ours names; None for another resource's, and for a
    malformed one (counted)."""
    if resource == contract.RESOURCE_GPU:
        return device
    if resource != contract.RESOURCE_GPU_MEMORY:
        return None  # another resource: not a GPU of ours at all
    try:
        return sharing.id_gpu(device)
    except ValueError:
        skipped[MALFORMED] += 1
        return None


def _pod_uid(uids: Mapping[str, str], devices: list[str]) -> str | None:
    """The one UID all of a pod's device IDs name; None when any names none, they
    name several, or it is not one a reader takes (sharing.read_report)."""
    found = {uids.get(device) for device in devices}
    if len(found) != 1:
        return None
    uid = found.pop()
    if not uid or len(uid) > sharing.MAX_POD_KEY or "/" in uid:
        return None
    return uid


def shares_report(
    response: Response, our_gpus: Collection[str], uids: Mapping[str, str]
) -> dict[str, dict[str, int | str]]:
    """The ANN_GPU_SHARES structure of ``response`` (:func:`read_shares`)."""
    return read_shares(response, our_gpus, uids).report


def encode_report(report: dict[str, dict[str, int | str]]) -> str | None:
    """The annotation's value: JSON with sorted keys and no spaces, so that an unchanged
    report is an unchanged string. None when a reader would refuse it (more GPUs
    than :data:`sharing.MAX_GPUS`, longer than :data:`sharing.MAX_SHARES_ANNOTATION`):
    then the node says nothing, and the extender fits each bound pod itself, which
    is safe where a truncated report would not be."""
    if len(report) > sharing.MAX_GPUS:
        return None
    text = json.dumps(report, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= sharing.MAX_SHARES_ANNOTATION else None


def current_shares(
    answer: Answer,
    our_gpus: Collection[str],
    now: float,
    max_age_s: float,
    uids: Mapping[str, str],
    init: Iterable[tuple[str, str, str]] = (),
) -> Shares | None:
    """The report of ``answer``'s response while it is at most ``max_age_s`` old (a
    stale one stands in that long); None when there is none or it is older."""
    age = answer.age(now)
    if answer.response is None or age is None or age > max_age_s:
        return None
    return read_shares(answer.response, our_gpus, uids, init)


def allocated_ids(response: Response) -> dict[str, set[str]]:
    """Each resource's device IDs that the kubelet has given to some container."""
    out: dict[str, set[str]] = {}
    for pod in response.pod_resources:
        for resource, device in _devices(pod):
            if resource and device:
                out.setdefault(resource, set()).add(device)
    return out


# --- the client: I/O ---------------------------------------------------------------
class PodResourcesError(Exception):
    """Why ``List`` got no answer, in words."""


class PodResourcesClient:
    """The kubelet's PodResources ``List`` over its unix socket. Thread-safe; one call
    at a time. The channel is made on the first call and dropped after a failed one
    (the next call connects anew: a kubelet that restarted makes a new socket)."""

    def __init__(
        self,
        socket: str = SOCKET,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_bytes: int = MAX_RESPONSE_BYTES,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket = socket
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.PodResourcesListerStub | None = None
        self._last: tuple[Response, float] | None = None
        self._failing: str | None = None

    def list(self) -> Answer:
        """Ask ``List`` now. Never raises."""
        with self._lock:
            try:
                response = self._call()
            except Exception as exc:  # grpc, decoding, the OS: never past the caller
                return self._failed(self._describe(exc))
            now = self.monotonic()
            self._last = (response, now)
            if self._failing is not None:
                log.info("the kubelet's PodResources API answers again", extra=self._extra())
                self._failing = None
            return Answer(response, None, now)

    def last(self) -> Answer:
        """The last good answer without asking (stale when the last call failed)."""
        with self._lock:
            response, at = self._last if self._last else (None, None)
            return Answer(response, self._failing, at)

    def close(self) -> None:
        with self._lock:
            self._drop()

    # --- inside --------------------------------------------------------------------
    def _call(self) -> Response:
        try:
            mode = os.stat(self.socket).st_mode
        except FileNotFoundError:
            raise PodResourcesError(
                f"no socket at {self.socket} (is the kubelet's pod-resources directory "
                "mounted into the agent's pod?)"
            ) from None
        if not stat.S_ISSOCK(mode):
            raise PodResourcesError(f"{self.socket} is not a socket")
        if self._stub is None:
            self._channel = grpc.insecure_channel(
                f"unix://{os.path.abspath(self.socket)}",
                options=[
                    ("grpc.max_receive_message_length", self.max_bytes),
                    ("grpc.enable_http_proxy", 0),
                ],
            )
            self._stub = pb_grpc.PodResourcesListerStub(self._channel)
        return self._stub.List(pb.ListPodResourcesRequest(), timeout=self.timeout_s)

    def _failed(self, error: str) -> Answer:
        self._drop()
        if self._failing is None:
            log.warning(
                "cannot read the kubelet's PodResources API",
                extra={**self._extra(), "error": error, "stale": self._last is not None},
            )
        self._failing = error
        response, at = self._last if self._last else (None, None)
        return Answer(response, error, at)

    def _describe(self, exc: Exception) -> str:
        if isinstance(exc, PodResourcesError):
            return str(exc)
        if isinstance(exc, grpc.RpcError) and isinstance(exc, grpc.Call):
            code, details = exc.code(), clip_text(str(exc.details() or ""), 200)
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return f"the kubelet gave no answer within {self.timeout_s:g}s ({self.socket})"
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                return f"the kubelet's answer is over {self.max_bytes} bytes: {details}"
            if code == grpc.StatusCode.UNAVAILABLE:
                return f"cannot reach the kubelet at {self.socket}: {details}"
            return f"PodResources List failed ({code.name}): {details}"
        return f"PodResources List failed: {type(exc).__name__}: {clip_text(str(exc), 200)}"

    def _drop(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

    def _extra(self) -> dict[str, object]:
        return {"socket": self.socket, "timeout_s": self.timeout_s}
