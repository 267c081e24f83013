"""The device plugin's gRPC service for one resource (:class:`DevicePluginServicer`),
and its server on a unix socket (:class:`Endpoint`).

Every answer comes from :mod:`agent.deviceplugin.devices`; this module reads the
request's fields, bounds them, and turns refusals into gRPC errors: INVALID_ARGUMENT
for a request that is wrong in itself, FAILED_PRECONDITION for one the GPUs' state
forbids now, INTERNAL (logged) for a fault of ours. No request, however large or
strange, ends the server: gRPC caps a message at 4 MiB, and the lists in it at
:data:`~agent.deviceplugin.devices.MAX_IDS` IDs and
:data:`~agent.deviceplugin.devices.MAX_CONTAINERS` containers.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from agent.deviceplugin import api_pb2, api_pb2_grpc
from agent.deviceplugin.devices import (
    HEALTHY,
    MAX_CONTAINERS,
    MAX_IDS,
    SHARES,
    UNHEALTHY,
    Answer,
    Device,
    Refused,
    check_shares,
    check_whole,
    preferred_shares,
    preferred_whole,
    share_answer,
    whole_answer,
)
from agent.deviceplugin.state import PluginState
from gpu_scheduler.textclip import clip_text

log = logging.getLogger("gpu_scheduler.agent")

#: ListAndWatch streams served at once per resource (the kubelet holds one); a new one
#: past this ends the oldest, which is the one a restarted kubelet left behind.
MAX_STREAMS = 4
#: Threads per server: the streams, and room for every unary call beside them.
WORKERS = 16
#: How often a stream looks whether its client is gone, when nothing changed.
STREAM_CHECK_S = 0.5
MAX_MESSAGE = 4 << 20


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, resource: str, state: PluginState) -> None:
        self.resource = resource
        self.state = state
        self._streams: list[threading.Event] = []
        self._lock = threading.Lock()

    # --- the RPCs ---------------------------------------------------------------------
    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    def ListAndWatch(self, request: Any, context: Any) -> Any:
        """The list at once, then each time it differs from the one last sent."""
        ended = self._open_stream()
        context.add_callback(lambda: (ended.set(), self.state.poke()))
        try:
            sent = None
            while True:
                version, devices = self.state.devices(self.resource)
                if devices != sent:
                    yield api_pb2.ListAndWatchResponse(devices=[_device(d) for d in devices])
                    sent = devices
                if ended.is_set() or self.state.closed or not context.is_active():
                    return
                self.state.wait(version, STREAM_CHECK_S)
        finally:
            with self._lock:
                if ended in self._streams:
                    self._streams.remove(ended)

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return self._answer(context, self._preferred, request)

    def Allocate(self, request: Any, context: Any) -> Any:
        return self._answer(context, self._allocate, request)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return api_pb2.PreStartContainerResponse()

    # --- the work ---------------------------------------------------------------------
    def _preferred(self, request: Any) -> Any:
        # What is allocated, read now: the kubelet asks right after it dropped the
        # deleted pods' devices, which a view read before would still count.
        self.state.refresh()
        view = self.state.view()
        answers = []
        for container in _containers(request):
            size = int(container.allocation_size)
            available = _bounded(container.available_deviceIDs, "available_deviceIDs")
            must = _bounded(container.must_include_deviceIDs, "must_include_deviceIDs")
            if self.resource == SHARES:
                # The kubelet's available IDs of this resource are exact (its own count
                # of what it allocated); what the other resource holds is ours to say.
                ids = preferred_shares(view.gpus, available, must, size, view.whole)
                if len(ids) < size:
                    log.warning(
                        "device plugin: no preferred allocation on one GPU; the kubelet "
                        "will choose, and Allocate refuses IDs on two GPUs",
                        extra={"resource": self.resource, "size": size, "must": len(must)},
                    )
            else:
                ids = preferred_whole(view.gpus, available, must, size, view.shared)
            answers.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=answers)

    def _allocate(self, request: Any) -> Any:
        containers = _containers(request)
        if not containers:
            raise Refused("no container to allocate for")
        self.state.refresh()  # as in _preferred: the deleted pods' devices are free now
        with self.state.allocating:
            view = self.state.view()
            answers: list[Answer] = []
            given: list[str] = []
            for container in containers:
                ids = _bounded(container.devices_ids, "devices_ids")
                if self.resource == SHARES:
                    gpu, units = check_shares(view.gpus, ids, view.whole)
                    answers.append(share_answer(gpu, units, view.options))
                else:
                    gpus = check_whole(view.gpus, ids, view.shared)
                    answers.append(whole_answer(gpus, view.options))
                given.extend(ids)
            self.state.handed_out(self.resource, given)
        log.info(
            "device plugin: allocated",
            extra={"resource": self.resource, "devices": clip_text(",".join(given), 500)},
        )
        return api_pb2.AllocateResponse(container_responses=[_container(a) for a in answers])

    def _answer(self, context: Any, work: Callable[[Any], Any], request: Any) -> Any:
        try:
            return work(request)
        except Refused as exc:
            code = (
                grpc.StatusCode.FAILED_PRECONDITION
                if exc.precondition
                else grpc.StatusCode.INVALID_ARGUMENT
            )
            message = f"{self.resource}: {exc}"
            log.warning("device plugin: request refused", extra={"error": clip_text(message)})
        except Exception as exc:  # a fault of ours: logged, and answered, never fatal
            log.exception("device plugin: request failed", extra={"resource": self.resource})
            code, message = grpc.StatusCode.INTERNAL, f"{self.resource}: internal error: {exc!r}"
        context.abort(code, clip_text(message, 1000))

    def _open_stream(self) -> threading.Event:
        ended = threading.Event()
        with self._lock:
            while len(self._streams) >= MAX_STREAMS:
                self._streams.pop(0).set()
            self._streams.append(ended)
        self.state.poke()
        return ended


def _containers(request: Any) -> Sequence[Any]:
    containers = request.container_requests
    if len(containers) > MAX_CONTAINERS:
        raise Refused(f"{len(containers)} containers in one request (at most {MAX_CONTAINERS})")
    return containers


def _bounded(ids: Sequence[str], what: str) -> list[str]:
    if len(ids) > MAX_IDS:
        raise Refused(f"{what}: {len(ids)} device IDs (at most {MAX_IDS})")
    return list(ids)


def _device(device: Device) -> Any:
    out = api_pb2.Device(ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY)
    if device.numa is not None:
        out.topology.nodes.add(ID=device.numa)
    return out


def _container(answer: Answer) -> Any:
    return api_pb2.ContainerAllocateResponse(
        envs=dict(answer.envs),
        mounts=[
            api_pb2.Mount(
                container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
            )
            for m in answer.mounts
        ],
        cdi_devices=[api_pb2.CDIDevice(name=name) for name in answer.cdi_devices],
    )


# --- the server on its socket -------------------------------------------------------
def file_identity(path: Path) -> tuple[int, int, int] | None:
    """(device, inode, ctime) of ``path``, None when there is none: a file re-created
    under the same name is another file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class Endpoint:
    """One resource's gRPC server on its own unix socket, ``path``."""

    def __init__(self, path: Path, servicer: DevicePluginServicer) -> None:
        self.path = path
        self.servicer = servicer
        self._server: grpc.Server | None = None
        self._identity: tuple[int, int, int] | None = None

    def start(self) -> Endpoint:
        """Serve on a fresh socket (a stale one of that name is removed). Raises
        OSError or RuntimeError when it cannot bind."""
        _remove_socket(self.path)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="device-plugin"),
            maximum_concurrent_rpcs=WORKERS,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", MAX_MESSAGE),
            ],
        )
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server)
        try:
            server.add_insecure_port(f"unix://{self.path.absolute()}")
            server.start()
        except Exception:
            server.stop(0)
            raise
        self._server = server
        self._identity = file_identity(self.path)
        return self

    def alive(self) -> bool:
        """Whether our socket file is still there: the kubelet removes every socket
        in its directory when it starts."""
        return self._identity is not None and file_identity(self.path) == self._identity

    def stop(self, grace: float = 0.0) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait(1.0)
        if self._identity is not None and file_identity(self.path) == self._identity:
            _remove_socket(self.path)
        self._identity = None


def _remove_socket(path: Path) -> None:
    """Remove ``path`` if it is a socket (never another kind of file)."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            path.unlink()
    except FileNotFoundError:
        pass
