"""What both resources' servers read: the node's GPUs, which are sick, which IDs are
allocated; their device lists, and a version that changes when a list changes.

Three injected sources feed it, each read by :meth:`PluginState.refresh` (the
runner calls it every second, and at once when the agent says the GPUs' health
changed): the GPUs (:class:`GpuSource`), the UUIDs of the unhealthy ones
(:class:`HealthSource`: the agent's reads with its XID marks laid over them,
agent/health.py) and the IDs allocated per resource (:class:`AllocatedSource`: the
kubelet's PodResources ``List``). A source that raises leaves its last answer in
place.

To what the kubelet reports, the IDs this plugin handed out in Allocate are added,
since PodResources shows a container's devices only some time after its Allocate (the
kubelet asks for a pod's next container at once: its preferred allocation must already
see what the previous one was given):
each stays counted until the allocated source reports it (from then on the source
alone says when it is released) or, when it never does (the pod failed to start),
for ``grace_s``.

Until the allocated source has answered once, every ID is listed Unhealthy (fail
closed): a GPU whose shares are held must not be offered whole, nor the reverse,
because the plugin started before the kubelet could say so.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from agent.deviceplugin.devices import (
    RESOURCES,
    SHARES,
    WHOLE,
    Device,
    GpuInfo,
    Options,
    device_lists,
    remember_units,
    shared_gpus,
)
from gpu_scheduler.textclip import clip_text

log = logging.getLogger("gpu_scheduler.agent")

#: An ID handed out in Allocate that the kubelet never reports is forgotten after this.
DEFAULT_GRACE_S = 120.0


class AllocatedSource(Protocol):
    """The device IDs allocated on this node now, by resource name (the kubelet's
    PodResources ``List``: every container's devices of ``gpu-scheduler.io/gpu-memory``
    and ``nvidia.com/gpu``). Raises when it cannot tell."""

    def __call__(self) -> Mapping[str, Collection[str]]: ...


class HealthSource(Protocol):
    """The UUIDs of the GPUs the agent reads unhealthy now."""

    def __call__(self) -> Collection[str]: ...


class GpuSource(Protocol):
    """The node's GPUs (devices.gpus_from_inventory of the agent's last read)."""

    def __call__(self) -> Sequence[GpuInfo]: ...


@dataclass(frozen=True, slots=True)
class View:
    """One consistent reading for a request: the GPUs, the IDs allocated per resource
    (reported and handed out), the GPUs with a share in use, the GPUs given whole."""

    gpus: tuple[GpuInfo, ...]
    allocated: Mapping[str, frozenset[str]]
    shared: frozenset[str]
    whole: frozenset[str]
    options: Options


class PluginState:
    def __init__(
        self,
        gpus: GpuSource,
        allocated: AllocatedSource,
        unhealthy: HealthSource,
        options: Options | None = None,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sources = (gpus, allocated, unhealthy)
        self.options = options or Options()
        self.grace_s = grace_s
        self.monotonic = monotonic
        self._cond = threading.Condition()
        #: Held by Allocate from its checks to its record (the two servers may answer
        #: at once; only one may give a GPU's last free state away).
        self.allocating = threading.Lock()
        self._gpus: tuple[GpuInfo, ...] = ()
        self._unhealthy: frozenset[str] = frozenset()
        self._reported: dict[str, frozenset[str]] = {r: frozenset() for r in RESOURCES}
        #: Whether the allocated source ever answered: until then nothing is offered.
        self.allocated_known = False
        self._recent: dict[tuple[str, str], float] = {}
        self._lists = device_lists((), ())
        self._errors: dict[str, str] = {}
        self.version = 0
        self.closed = False

    # --- reading the sources -----------------------------------------------------------
    def refresh(self) -> bool:
        """Read the three sources; True when a device list changed."""
        gpus_source, allocated_source, health_source = self._sources
        gpus = self._read("gpus", lambda: tuple(gpus_source()))
        unhealthy = self._read("health", lambda: frozenset(health_source()))
        reported = self._read("allocated", lambda: _by_resource(allocated_source()))
        with self._cond:
            if gpus is not None:
                self._gpus = remember_units(self._gpus, sorted(gpus, key=lambda g: g.index))
            if unhealthy is not None:
                self._unhealthy = unhealthy
            if reported is not None:
                self._reported = reported
                self.allocated_known = True
            self._forget(self.monotonic(), reported is not None)
            return self._relist()

    def _read(self, what: str, read: Callable[[], object]):  # -> the value, None on failure
        try:
            value = read()
        except Exception as exc:
            text = clip_text(f"{type(exc).__name__}: {exc}", 300)
            if self._errors.get(what) != text:
                log.warning(
                    "device plugin: cannot read a source; its last answer stays",
                    extra={"source": what, "error": text},
                )
            self._errors[what] = text
            return None
        if self._errors.pop(what, None) is not None:
            log.info("device plugin: source read again", extra={"source": what})
        return value

    def _forget(self, now: float, reported: bool) -> None:
        """Drop the handed-out IDs the source now reports, and those past grace; none
        while the source cannot be read (the pods that hold them may well run)."""
        if not reported:
            return
        for key, at in list(self._recent.items()):
            resource, device = key
            if device in self._reported[resource] or now - at >= self.grace_s:
                del self._recent[key]

    def _relist(self) -> bool:
        unhealthy = self._unhealthy
        if not self.allocated_known:  # fail closed: what is held is not known yet
            unhealthy = frozenset(g.uuid for g in self._gpus)
        lists = device_lists(self._gpus, unhealthy)
        if lists == self._lists:
            return False
        self._lists = lists
        self.version += 1
        self._cond.notify_all()
        return True

    def _allocated(self) -> dict[str, frozenset[str]]:
        out = {r: set(self._reported[r]) for r in RESOURCES}
        for resource, device in self._recent:
            out[resource].add(device)
        return {r: frozenset(ids) for r, ids in out.items()}

    # --- what the servers ask -------------------------------------------------------
    def view(self) -> View:
        with self._cond:
            allocated = self._allocated()
            return View(
                self._gpus,
                allocated,
                frozenset(shared_gpus(allocated[SHARES])),
                allocated[WHOLE],
                self.options,
            )

    def devices(self, resource: str) -> tuple[int, tuple[Device, ...]]:
        """The version and the device list of ``resource``."""
        with self._cond:
            return self.version, self._lists[resource]

    def handed_out(self, resource: str, ids: Iterable[str]) -> None:
        """Allocate gave these IDs to a container: they count as allocated from now."""
        now = self.monotonic()
        with self._cond:
            for device in ids:
                self._recent[(resource, device)] = now
            self._relist()

    def wait(self, version: int, timeout: float) -> int:
        """Until the version is not ``version`` (or ``timeout``, or close); the version."""
        with self._cond:
            self._cond.wait_for(lambda: self.version != version or self.closed, timeout)
            return self.version

    def poke(self) -> None:
        """Wake every waiter (a stream that should look at its own state)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def reopen(self) -> None:
        with self._cond:
            self.closed = False


def _by_resource(reported: Mapping[str, Collection[str]]) -> dict[str, frozenset[str]]:
    return {r: frozenset(str(i) for i in reported.get(r, ())) for r in RESOURCES}
