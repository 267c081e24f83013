"""The NVML event loop: XIDs and ECC errors as they happen, not at the next read.

A thread of its own (NVML's wait blocks): initialise NVML, create an event set,
register every GPU for critical XIDs and for single- and double-bit ECC errors where
it supports them (``nvmlDeviceGetSupportedEventTypes``), then wait on the set with a
timeout, so that a stop is seen within it. Each event goes to the
:class:`~agent.health.HealthTracker` and wakes the agent's loop, which publishes at
once: an XID the table counts critical, and a double-bit ECC error, mark the GPU;
an application XID and a corrected (single-bit) error are counted and logged only.

Anything else NVML says (the driver unloaded, a library/driver mismatch after an
upgrade, a GPU gone from the bus) ends the session: the set is freed, NVML shut down,
and the loop starts again after a backoff (2 s doubling to 5 minutes), the way the
agent's reads recover. The device plugin, when its wait fails, marks every GPU
unhealthy; here the reads decide that (a GPU NVML cannot query reads unhealthy), so a
failing event loop never takes a healthy node out by itself.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from agent import metrics
from agent.health import HealthTracker
from agent.loop import backoff_delay
from agent.nvml import describe_error, text

log = logging.getLogger("gpu_scheduler.agent")

XID_CRITICAL, ECC_SINGLE, ECC_DOUBLE = 0x8, 0x1, 0x2  # nvmlEventType*
WANTED = XID_CRITICAL | ECC_SINGLE | ECC_DOUBLE
TIMEOUT = 10  # NVML_ERROR_TIMEOUT
WAIT_MS = 5000


@dataclass(eq=False)
class NvmlEvents:
    nvml: Any
    tracker: HealthTracker
    wake: threading.Event
    stop: threading.Event
    _: KW_ONLY
    wall: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    wait_ms: int = WAIT_MS
    backoff_s: tuple[float, float] = (2.0, 300.0)
    #: GPUs registered in the current session (None: no session yet).
    registered: int | None = field(default=None, init=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    def start(self) -> NvmlEvents:
        self._thread = threading.Thread(target=self.run, name="nvml-events", daemon=True)
        self._thread.start()
        return self

    def run(self) -> None:
        failures = 0
        while not self.stop.is_set():
            try:
                self.session()
                failures = 0
            except Exception as exc:  # NVMLError, OSError (no libnvidia-ml), garbage
                failures += 1
                metrics.EVENT_LOOP_ERRORS.inc()
                delay = backoff_delay(failures, *self.backoff_s)
                log.warning(
                    "NVML event loop stopped; starting again",
                    extra={"error": describe_error(exc), "retry_in_s": delay},
                )
                self.registered = None
                self.stop.wait(delay)

    def session(self) -> None:
        """One NVML session: register, then wait for events until stopped. Raises
        whatever NVML raises other than a wait's timeout."""
        nvml = self.nvml
        nvml.nvmlInit()
        events = None
        try:
            events = nvml.nvmlEventSetCreate()
            self.registered = self._register(events)
            metrics.EVENT_LOOP_GPUS.set(self.registered)
            log.info("NVML event loop registered", extra={"gpus": self.registered})
            while not self.stop.is_set():
                try:
                    data = nvml.nvmlEventSetWait_v2(events, self.wait_ms)
                except nvml.NVMLError as exc:
                    if getattr(exc, "value", None) == TIMEOUT:
                        continue
                    raise
                self.handle(data)
        finally:
            if events is not None:
                with contextlib.suppress(Exception):
                    nvml.nvmlEventSetFree(events)
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()

    def _register(self, events: Any) -> int:
        nvml = self.nvml
        registered = 0
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            try:
                mask = WANTED & int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                if mask:
                    nvml.nvmlDeviceRegisterEvents(handle, mask, events)
                    registered += 1
            except nvml.NVMLError as exc:  # too old for events: its reads still count
                log.warning(
                    "GPU cannot report events", extra={"gpu": index, "error": describe_error(exc)}
                )
        return registered

    def handle(self, data: Any) -> None:
        """One event: to the tracker, and wake the loop when it marks a GPU."""
        kind = int(getattr(data, "eventType", 0) or 0)
        try:
            uuid = text(self.nvml.nvmlDeviceGetUUID(data.device))
        except Exception as exc:
            metrics.EVENTS.labels("unattributed").inc()
            log.warning("NVML event for a GPU it cannot name", extra={"error": describe_error(exc)})
            return
        wall, mono = self.wall(), self.monotonic()
        if kind & XID_CRITICAL:
            xid = int(getattr(data, "eventData", 0) or 0)
            metrics.EVENTS.labels("xid").inc()
            if self.tracker.xid(uuid, xid, wall, mono):
                self.wake.set()
        elif kind & ECC_DOUBLE:
            metrics.EVENTS.labels("ecc-double").inc()
            self.tracker.event(uuid, "double-bit ECC error (uncorrectable)", wall, mono)
            self.wake.set()
        elif kind & ECC_SINGLE:
            metrics.EVENTS.labels("ecc-single").inc()  # corrected: counted, not held
        else:
            metrics.EVENTS.labels("other").inc()
