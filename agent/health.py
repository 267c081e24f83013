"""GPU health over time: XIDs mark a GPU unhealthy at once; a quiet period of good
reads marks it healthy again.

NVML answers two questions. A *read* (:mod:`agent.nvml`) says what a GPU looks
like now: pages or rows waiting for retirement, uncorrectable ECC errors since the
driver loaded, a GPU NVML can no longer query. An *event* (an XID, a double-bit ECC
error) says something happened, once, and is gone: the GPU may read fine a second
later and still be broken. :class:`HealthTracker` keeps what the events said, so the
agent publishes an unhealthy GPU with the XID that made it so and since when.

Recovery. Neither anchor recovers a GPU by itself (the device plugin: "there is no
way to recover from the Unhealthy state" but a restart; the DRA driver's taint stays
until removed). Here, with recovery on (the default), a GPU marked by an event is
healthy again once ``quiet_s`` (default 10 minutes) has passed since its last critical
event while every read of it was good; a read that is not good (or another critical
XID) starts the period again. A driver reload, which the agent sees as NVML coming back
after it failed, clears every mark: the events were the old driver's. With recovery
off, a mark stays until the agent restarts (the anchors' behaviour).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from agent import metrics
from agent import xid as xids
from agent.inventory import Gpu, Inventory
from gpu_scheduler.timestamps import rfc3339

log = logging.getLogger("gpu_scheduler.agent")

#: Seconds of good reads without a critical event before a GPU is healthy again.
DEFAULT_QUIET_S = 600.0
#: At most this many GPUs are tracked (more than any node has; garbage is bounded).
MAX_TRACKED = 256


@dataclass(frozen=True, slots=True)
class Mark:
    """Why a GPU is unhealthy: its XID (None for an event that is not one), in words,
    since when (wall clock, for the annotation), and the last time (monotonic) an
    event or a read said so."""

    xid: int | None
    reason: str
    since: float
    last_bad: float


class HealthTracker:
    def __init__(
        self,
        policy: xids.XidPolicy | None = None,
        quiet_s: float = DEFAULT_QUIET_S,
        recover: bool = True,
    ) -> None:
        self.policy = policy or xids.XidPolicy()
        self.quiet_s = quiet_s
        self.recover = recover
        self._marks: dict[str, Mark] = {}
        self._lock = threading.Lock()

    # --- what happened ---------------------------------------------------------------
    def xid(self, uuid: str, number: int, wall: float, mono: float) -> bool:
        """An XID on ``uuid``. True when it is critical (the GPU is unhealthy now)."""
        critical = self.policy.critical(number)
        metrics.XIDS.labels("true" if critical else "false").inc()
        if not critical:
            log.info("application XID: the GPU stays healthy", extra={"uuid": uuid, "xid": number})
            return False
        what = "GPU lost: " if number == xids.LOST else ""
        self._mark(uuid, number, what + xids.describe(number), wall, mono)
        return True

    def event(self, uuid: str, reason: str, wall: float, mono: float) -> None:
        """A critical event that is not an XID (a double-bit ECC error)."""
        self._mark(uuid, None, reason, wall, mono)

    def driver_reloaded(self) -> None:
        """NVML came back after failing: the marks were the old driver's."""
        with self._lock:
            cleared, self._marks = len(self._marks), {}
        metrics.UNHEALTHY_MARKS.set(0)
        if cleared:
            log.info("driver reloaded: GPU health marks cleared", extra={"cleared": cleared})

    def _mark(self, uuid: str, number: int | None, reason: str, wall: float, mono: float) -> None:
        with self._lock:
            before = self._marks.get(uuid)
            if before is None and len(self._marks) >= MAX_TRACKED:
                return
            since = before.since if before is not None else wall
            self._marks[uuid] = Mark(number, reason, since, mono)
            metrics.UNHEALTHY_MARKS.set(len(self._marks))
        if before is None:
            log.warning("GPU unhealthy", extra={"uuid": uuid, "xid": number, "reason": reason})

    # --- what the agent publishes ----------------------------------------------------
    def apply(self, inventory: Inventory, mono: float) -> Inventory:
        """``inventory`` (a read) with the marks laid over it; marks whose quiet period
        has passed with good reads are cleared first. A GPU that the read itself
        finds unhealthy keeps the read's reason and restarts its mark's period."""
        gpus = []
        changed = False
        for gpu in inventory.gpus:
            mark = self._current(gpu, mono)
            if mark is not None:
                gpu = replace(
                    gpu,
                    healthy=False,
                    reason=gpu.reason if not gpu.healthy else mark.reason,
                    xid=mark.xid,
                    since=rfc3339(datetime.fromtimestamp(mark.since, UTC)),
                )
                changed = True
            gpus.append(gpu)
        return replace(inventory, gpus=tuple(gpus)) if changed else inventory

    def _current(self, gpu: Gpu, mono: float) -> Mark | None:
        with self._lock:
            mark = self._marks.get(gpu.uuid)
            if mark is None:
                return None
            if not gpu.healthy:  # the read agrees: the period starts again
                mark = self._marks[gpu.uuid] = replace(mark, last_bad=mono)
                return mark
            if self.recover and mono - mark.last_bad >= self.quiet_s:
                del self._marks[gpu.uuid]
                metrics.UNHEALTHY_MARKS.set(len(self._marks))
            else:
                return mark
        log.info(
            "GPU healthy again",
            extra={"uuid": gpu.uuid, "xid": mark.xid, "quiet_s": self.quiet_s},
        )
        return None

    def marked(self) -> dict[str, Mark]:
        with self._lock:
            return dict(self._marks)
