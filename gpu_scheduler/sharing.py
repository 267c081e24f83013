"""GPU sharing: what a pod asks of one GPU's memory, and the one fit rule that says
which GPU each container gets. The extender (placing a pod) and the agent's device
plugin (the kubelet's ``GetPreferredAllocation``) both call :func:`fit`, so a node and
its scheduler never disagree on the rule.

A container asks for a share with ``gpu-scheduler.io/gpu-memory: N``: N units of
:data:`UNIT_MIB` (1 GiB) of one GPU's memory. A GPU of M MiB offers ``M // 1024``
units (an H200's 143,771 MiB make 140; eight of them advertise 1,120 device IDs, not
a million). Each of a node's GPUs is one row: its capacity in units, what is free for
shares (0 on a GPU that is sick or given whole), and whether it is wholly free (what a
whole-GPU pod needs). A pod may ask for whole GPUs in some containers and shares in
others, never both in one container.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_scheduler import contract
from gpu_scheduler.fields import expect_object, list_at
from gpu_scheduler.jsondecode import decode_json
from gpu_scheduler.podspec import container_request
from gpu_scheduler.textclip import clip_text

#: One unit of ``gpu-scheduler.io/gpu-memory``: 1 GiB of one GPU's memory.
UNIT_MIB = 1024
#: No GPU made has more memory than this (units); a request above it is a mistake
#: (most often ``16Gi``, read by the API server as 17,179,869,184 units).
MAX_UNITS = 1024
#: A node with more GPUs than this is not read as shared (its annotation is refused).
MAX_GPUS = 64
#: A device ID of the plugin: ``<GPU UUID>::<unit>``; the GPU's part names it, so
#: the node never has to guess which GPU (or which pod) an ID belongs to.
ID_SEPARATOR = "::"
#: What the agent's ANN_GPU_SHARES says a pod holds of a GPU when it holds it whole.
WHOLE = "whole"
#: A pod's key in ANN_GPU_SHARES is its UID (at most this long; never a ``/``: a key
#: with one is an older agent's ``namespace/name``, and such a report is not read).
MAX_POD_KEY = 128
MAX_SHARES_ANNOTATION = 256 << 10


class ShareError(ValueError):
    """A share request that no GPU could ever meet, in words for the user."""


def gpu_units(memory_mib: int | None, reserved_mib: int = 0) -> int:
    """The units of sharing one GPU of ``memory_mib`` MiB offers (0 if unknown), less
    ``reserved_mib`` kept back for what no share asks (the driver's reserved memory,
    the MPS server, each tenant's CUDA context; the agent's ``--gpu-memory-reserve``,
    published per GPU as ``contract.GPU_RESERVED_MIB``)."""
    if memory_mib is None or memory_mib <= 0:
        return 0
    return min(max(memory_mib - max(reserved_mib, 0), 0) // UNIT_MIB, MAX_UNITS)


@dataclass(frozen=True, slots=True)
class ShareRequest:
    """What a pod asks of shared GPUs: one entry per container that asks a share
    (units, in the kubelet's order: sidecars in spec order, then app containers in
    spec order, the order in which the kubelet allocates them and :func:`fit` places
    them), and the container's name for messages."""

    units: tuple[int, ...]
    containers: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.units)

    def __bool__(self) -> bool:
        return bool(self.units)


NO_SHARES = ShareRequest(())


def pod_shares(spec: Any) -> ShareRequest:
    """The shares a pod spec (JSON form) asks for. Raises :class:`FieldError` for a
    malformed field and :class:`ShareError` for a request that can never be met: a
    fractional or absurd size, whole GPUs and a share in one container, a share on a
    plain init container (it runs alone before the others, and the kubelet hands its
    devices on to them: the share would be counted twice or not at all)."""
    if spec is None:
        return NO_SHARES
    spec = expect_object(spec, "spec")
    units: list[int] = []
    names: list[str] = []
    # The kubelet's order (devicemanager's Allocate: init containers, sidecars among
    # them, in spec order, then app containers in spec order): fit places in it.
    kinds = (("initContainers", True), ("containers", False))
    for key, init in kinds:
        for i, container in enumerate(list_at(spec, key, f"spec.{key}")):
            where = f"spec.{key}[{i}]"
            container = expect_object(container, where)
            amount = container_request(container, contract.RESOURCE_GPU_MEMORY, where)
            name = container.get("name")
            name = name if isinstance(name, str) else where
            if amount == 0:
                if _names(container, contract.RESOURCE_GPU_MEMORY):
                    raise ShareError(
                        f"container {name} asks 0 {contract.RESOURCE_GPU_MEMORY}: ask at "
                        "least 1 (GiB), or leave the resource out"
                    )
                continue
            if init and container.get("restartPolicy") != "Always":
                raise ShareError(
                    f"init container {name} asks {contract.RESOURCE_GPU_MEMORY}: only app "
                    "containers and sidecars (restartPolicy: Always) may ask a GPU share"
                )
            units.append(_units(amount, name))
            if container_request(container, contract.RESOURCE_GPU, where) != 0:
                raise ShareError(
                    f"container {name} asks both {contract.RESOURCE_GPU} and "
                    f"{contract.RESOURCE_GPU_MEMORY}: a container gets whole GPUs or a "
                    "share of one, not both"
                )
            names.append(name)
    return ShareRequest(tuple(units), tuple(names))


def _names(container: Mapping[str, Any], resource: str) -> bool:
    """Whether the container names ``resource`` in its requests or limits (the fields
    already read well-typed by :func:`container_request`)."""
    resources = container.get("resources") or {}
    return any(resource in (resources.get(kind) or {}) for kind in ("requests", "limits"))


def order_refusal(spec: Mapping[str, Any]) -> str | None:
    """Why the kubelet would place this pod otherwise than :func:`fit` does, or None.

    The kubelet allocates a pod's devices container by container: init containers
    (sidecars among them) in spec order, then app containers in spec order. :func:`fit`
    takes the pod's whole GPUs first; where a container asking a share comes before one
    that takes new whole GPUs, the share is placed first and may break the GPU the
    extender counted whole. A container that only reuses whole GPUs a plain init
    container held before (the kubelet's ``devicesToReuse``) takes none. Read after
    :func:`pod_shares` and ``pod_gpu_request`` accepted the spec."""
    share_first: str | None = None
    reusable = 0  # whole GPUs of plain init containers not yet taken on by another
    for key in ("initContainers", "containers"):
        for i, container in enumerate(list_at(spec, key, f"spec.{key}")):
            where = f"spec.{key}[{i}]"
            if not isinstance(container, Mapping):
                continue
            name = container.get("name")
            name = name if isinstance(name, str) else where
            if container_request(container, contract.RESOURCE_GPU_MEMORY, where) != 0:
                share_first = share_first or name
                continue
            asked = int(container_request(container, contract.RESOURCE_GPU, where))
            new = max(asked - reusable, 0)
            if key == "initContainers" and container.get("restartPolicy") != "Always":
                reusable += new  # a plain init container hands all it holds on
            else:
                reusable -= asked - new  # those it reused are its own from now
            if share_first and new:
                return (
                    f"container {clip_text(share_first, 64)} asks {contract.RESOURCE_GPU_MEMORY} "
                    f"before container {clip_text(name, 64)} asks {contract.RESOURCE_GPU}: the "
                    "kubelet allocates in order (init containers first), the scheduler "
                    "whole GPUs first: ask whole GPUs in the earlier containers"
                )
    return None


def reserved_env(spec: Mapping[str, Any]) -> str | None:
    """Why a pod asking a share may not be admitted as written: a container that sets
    an environment variable the device plugin sets (contract.SHARE_ENV), or None. A
    value from ``envFrom`` cannot be seen here (see the sharing limits)."""
    for key in ("containers", "initContainers"):
        for container in list_at(spec, key, f"spec.{key}"):
            if not isinstance(container, Mapping):
                continue
            env = container.get("env")
            for entry in env if isinstance(env, list) else ():
                name = entry.get("name") if isinstance(entry, Mapping) else None
                if isinstance(name, str) and (
                    name in contract.SHARE_ENV or name.startswith(contract.SHARE_ENV_PREFIXES)
                ):
                    who = container.get("name")
                    return (
                        f"container {who if isinstance(who, str) else '?'} sets {name[:64]}: "
                        f"on a GPU share the device plugin sets it (which GPU, MPS limits)"
                    )
    return None


def _units(amount: Any, name: str) -> int:
    if amount != amount.to_integral_value():
        raise ShareError(
            f"container {name}: {contract.RESOURCE_GPU_MEMORY} must be a whole number of "
            f"GiB, got {amount}"
        )
    if amount > MAX_UNITS:
        hint = " (the unit is 1 GiB: write 16, not 16Gi)" if amount >= 1 << 20 else ""
        raise ShareError(
            f"container {name}: {contract.RESOURCE_GPU_MEMORY}={amount} is more than any "
            f"GPU has (at most {MAX_UNITS} GiB){hint}"
        )
    return int(amount)


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU of a shared node: its UUID, its capacity in units, what is free for
    shares (0 when sick or given whole), and whether a whole-GPU pod may take it."""

    uuid: str
    capacity: int
    free: int
    whole_free: bool


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a pod goes on one node: indexes of the GPUs it takes whole, and of the GPU
    each of its shares goes to (in the request's container order)."""

    whole: tuple[int, ...]
    shares: tuple[int, ...]


def fit(gpus: Sequence[Gpu], shares: Sequence[int], whole: int = 0) -> Placement | None:
    """Where on these GPUs a pod asking ``whole`` GPUs and ``shares`` goes, or None.

    The rule is the kubelet's, container by container, as the device plugin's
    ``GetPreferredAllocation`` steers it: whole GPUs are the wholly free ones, lowest
    index first; then each share, in the order given (:func:`pod_shares` gives the
    kubelet's), goes to the GPU with the least free memory that holds it (best fit;
    ties to the lowest index), never to one this pod takes whole. Best fit packs
    within GPUs: a partly used GPU is filled before a free one is broken into. The
    kubelet takes a pod's whole GPUs first only where no share container comes before
    one that takes new whole GPUs: the webhook refuses the others (:func:`order_refusal`).
    """
    free = [g.free for g in gpus]
    taken: list[int] = []
    if whole:
        taken = [i for i, g in enumerate(gpus) if g.whole_free][:whole]
        if len(taken) < whole:
            return None
        for i in taken:
            free[i] = -1
    where = [0] * len(shares)
    for k, need in enumerate(shares):
        best = -1
        for i, left in enumerate(free):
            if left >= need and (best < 0 or left < free[best]):
                best = i
        if best < 0:
            return None
        free[best] -= need
        where[k] = best
    return Placement(tuple(taken), tuple(where))


def after(gpus: Sequence[Gpu], placement: Placement, shares: Sequence[int]) -> tuple[Gpu, ...]:
    """The GPUs once ``placement`` of ``shares`` is made."""
    out = list(gpus)
    for i in placement.whole:
        out[i] = Gpu(out[i].uuid, out[i].capacity, 0, False)
    for i, need in zip(placement.shares, shares, strict=True):
        g = out[i]
        out[i] = Gpu(g.uuid, g.capacity, g.free - need, False)
    return tuple(out)


def largest_piece(gpus: Iterable[Gpu]) -> int:
    """The most units one share could still be given on these GPUs."""
    return max((g.free for g in gpus), default=0)


# --- device IDs ------------------------------------------------------------------
def device_id(uuid: str, unit: int) -> str:
    return f"{uuid}{ID_SEPARATOR}{unit}"


def id_gpu(device: str) -> str:
    """The GPU UUID a device ID names. Raises ValueError for an ID not of ours."""
    uuid, sep, unit = device.rpartition(ID_SEPARATOR)
    if not sep or not uuid or not unit.isascii() or not unit.isdigit():
        raise ValueError(f"{device!r} is not a {contract.RESOURCE_GPU_MEMORY} device ID")
    return uuid


# --- what the node reports: the agent's ANN_GPU_SHARES ------------------------------
Report = Mapping[str, Mapping[str, "int | str"]]


def read_report(value: Any) -> dict[str, dict[str, int | str]] | None:
    """The agent's ``gpu-scheduler.io/gpu-shares`` annotation: GPU UUID → pod UID →
    units it holds there, or ``"whole"``. None when absent or unreadable (then the
    extender fits every bound pod itself), and for an older agent's report keyed by
    ``namespace/name``: a pod recreated under the same name would inherit what the
    old one held, so such a report is recomputed, never matched by name."""
    if not isinstance(value, str) or not value or len(value) > MAX_SHARES_ANNOTATION:
        return None
    try:
        data = decode_json(value)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or len(data) > MAX_GPUS:
        return None
    report: dict[str, dict[str, int | str]] = {}
    for uuid, pods in data.items():
        if not isinstance(pods, dict):
            return None
        held: dict[str, int | str] = {}
        for pod, units in pods.items():
            if not pod or len(pod) > MAX_POD_KEY or "/" in pod:
                return None
            ok = units == WHOLE or (
                isinstance(units, int) and not isinstance(units, bool) and 0 < units <= MAX_UNITS
            )
            if not ok:
                return None
            held[pod] = units
        report[uuid] = held
    return report


@dataclass(frozen=True, slots=True)
class BoundPod:
    """A pod bound to a shared node, as the usage below needs it."""

    key: str  # the pod's UID, as the agent's report names it
    whole: int
    shares: tuple[int, ...]


def node_state(gpus: Iterable[tuple[str, int, bool]]) -> tuple[Gpu, ...]:
    """GPUs given as (UUID, capacity units, healthy), nothing placed on them yet."""
    return tuple(
        Gpu(uuid, cap, cap if healthy else 0, healthy and cap > 0) for uuid, cap, healthy in gpus
    )


def usage(
    gpus: Sequence[tuple[str, int, bool]],
    report: Report | None,
    pods: Sequence[BoundPod],
) -> tuple[tuple[Gpu, ...], int]:
    """Each GPU's state on a shared node: ``gpus`` as (UUID, capacity units, healthy),
    less what the node reported each pod holds (pods no longer bound are dropped from
    the report), less the bound pods it has not reported yet, fitted in the order
    given by :func:`fit`. Returns the GPUs and how many bound pods did not fit (a
    node the kubelet over-committed, or facts that changed under it)."""
    index = {uuid: i for i, (uuid, _, _) in enumerate(gpus)}
    empty = node_state(gpus)
    free = [g.free for g in empty]
    whole_free = [g.whole_free for g in empty]
    bound = {pod.key for pod in pods}
    reported: set[str] = set()
    for uuid, held in (report or {}).items():
        i = index.get(uuid)
        if i is None:
            continue
        for key, units in held.items():
            if key not in bound:
                continue
            reported.add(key)
            whole_free[i] = False
            free[i] = 0 if units == WHOLE else max(free[i] - int(units), 0)
    state = [Gpu(g.uuid, g.capacity, f, w) for g, f, w in zip(empty, free, whole_free, strict=True)]
    misfits = 0
    for pod in pods:
        if pod.key in reported:
            continue
        placement = fit(state, pod.shares, pod.whole)
        if placement is None:
            misfits += 1
            continue
        state = list(after(state, placement, pod.shares))
    return tuple(state), misfits


def node_gpus(
    annotation: Any, count: int | None, memory_mib: int | None
) -> tuple[tuple[str, int, bool], ...]:
    """A shared node's GPUs as (UUID, capacity units, healthy), in index order: from
    the agent's ANN_GPUS (each GPU's UUID, memory and health; a GPU in MIG mode is not
    shared), else ``count`` GPUs of ``memory_mib`` each from the labels, named
    ``gpu-0``, ``gpu-1``… (a node the agent does not label: its report cannot name
    them, so every pod on it is fitted). Empty when neither can be read."""
    gpus: list[tuple[str, int, bool]] = []
    entries = None
    if isinstance(annotation, str) and 0 < len(annotation) <= contract.MAX_GPUS_ANNOTATION:
        try:
            entries = decode_json(annotation)
        except (ValueError, RecursionError):
            entries = None
    if isinstance(entries, list) and 0 < len(entries) <= MAX_GPUS:
        for entry in entries:
            if not isinstance(entry, Mapping):
                return ()
            uuid, memory = entry.get(contract.GPU_UUID), entry.get(contract.GPU_MEMORY_MIB)
            if not isinstance(uuid, str) or not uuid or len(uuid) > 128:
                return ()
            reserved = entry.get(contract.GPU_RESERVED_MIB)
            reserved = reserved if type(reserved) is int and reserved > 0 else 0
            units = gpu_units(memory, reserved) if type(memory) is int else 0
            mig = entry.get(contract.GPU_MIG_ENABLED) is True
            healthy = entry.get(contract.GPU_HEALTHY) is not False and not mig
            gpus.append((uuid, 0 if mig else units, healthy))
        return tuple(gpus)
    if count is None or not 0 < count <= MAX_GPUS:
        return ()
    units = gpu_units(memory_mib)
    return tuple((f"gpu-{i}", units, units > 0) for i in range(count))
