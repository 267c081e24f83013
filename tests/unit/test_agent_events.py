"""The NVML event loop against a scripted NVML: registration where events are
supported, XIDs and ECC errors to the tracker (waking the loop only when a GPU is
marked), a wait that times out, a session NVML ends, and an event NVML cannot name."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from agent.events import ECC_DOUBLE, ECC_SINGLE, XID_CRITICAL, NvmlEvents
from agent.health import HealthTracker


class ScriptedNvml:
    """NVML's event calls over ``gpus`` (uuid -> supported event mask, or None: the
    query is not supported), answering waits from ``script`` (events, or NVMLError
    codes); when the script runs out it sets ``stop``."""

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self, gpus: dict[str, int | None], script: list[Any], stop: threading.Event):
        self.gpus = list(gpus.items())
        self.script = script
        self.stop = stop
        self.inits = self.shutdowns = self.freed = 0
        self.registered: list[tuple[str, int]] = []

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return self.gpus[index][0]

    def nvmlDeviceGetSupportedEventTypes(self, handle: str) -> int:
        mask = dict(self.gpus)[handle]
        if mask is None:
            raise self.NVMLError(3)
        return mask

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlEventSetFree(self, events: str) -> None:
        self.freed += 1

    def nvmlDeviceRegisterEvents(self, handle: str, mask: int, events: str) -> None:
        self.registered.append((handle, mask))

    def nvmlDeviceGetUUID(self, handle: str) -> bytes:
        if handle == "nameless":
            raise self.NVMLError(999)
        return handle.encode()

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        if not self.script:
            self.stop.set()
            raise self.NVMLError(10)
        step = self.script.pop(0)
        if isinstance(step, int):
            raise self.NVMLError(step)
        return step


def event(device: str, kind: int, data: int = 0) -> Any:
    return SimpleNamespace(device=device, eventType=kind, eventData=data)


def loop(gpus, script, tracker=None):
    stop, wake = threading.Event(), threading.Event()
    nvml = ScriptedNvml(gpus, script, stop)
    tracker = tracker or HealthTracker(quiet_s=60)
    events = NvmlEvents(
        nvml, tracker, wake, stop, wall=lambda: 1000.0, monotonic=lambda: 5.0, backoff_s=(0, 0)
    )
    return nvml, tracker, wake, stop, events


def test_registration_where_supported_and_events_to_the_tracker():
    gpus = {
        "GPU-a": XID_CRITICAL | ECC_SINGLE | ECC_DOUBLE | 0x100,
        "GPU-b": ECC_SINGLE,
        "old": None,
    }
    nvml, tracker, wake, _stop, events = loop(gpus, [event("GPU-a", XID_CRITICAL, 13), 10])
    events.run()
    assert nvml.registered == [("GPU-a", 0xB), ("GPU-b", ECC_SINGLE)]
    assert events.registered == 2
    assert not tracker.marked() and not wake.is_set()  # XID 13: an application error
    assert nvml.inits == nvml.shutdowns == nvml.freed == 1


def test_a_critical_xid_and_a_double_bit_error_mark_and_wake_a_single_bit_one_does_not():
    gpus = {"GPU-a": 0xB, "GPU-b": 0xB, "GPU-c": 0xB}
    script = [
        event("GPU-c", ECC_SINGLE),
        event("GPU-a", XID_CRITICAL, 79),
        event("GPU-b", ECC_DOUBLE),
        10,  # a wait that timed out: waiting goes on
        event("nameless", XID_CRITICAL, 79),  # NVML cannot name the GPU: nothing marked
    ]
    _nvml, tracker, wake, _stop, events = loop(gpus, script)
    events.run()
    marks = tracker.marked()
    assert set(marks) == {"GPU-a", "GPU-b"} and wake.is_set()
    assert marks["GPU-a"].xid == 79 and marks["GPU-a"].since == 1000.0
    assert marks["GPU-b"].xid is None and "double-bit ECC" in marks["GPU-b"].reason


def test_an_error_ends_the_session_and_a_new_one_starts():
    gpus = {"GPU-a": 0xB}
    script = [18, event("GPU-a", XID_CRITICAL, 48)]  # 18: NVML_ERROR_GPU_IS_LOST
    nvml, tracker, _wake, _stop, events = loop(gpus, script)
    events.run()
    assert nvml.inits == 2 and nvml.shutdowns == 2 and nvml.freed == 2
    assert tracker.marked()["GPU-a"].xid == 48


def test_garbage_from_nvml_is_survived():
    stop, wake = threading.Event(), threading.Event()

    class Broken(ScriptedNvml):
        def nvmlDeviceGetCount(self) -> int:
            stop.set()
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    nvml = Broken({}, [], stop)
    NvmlEvents(nvml, HealthTracker(), wake, stop, backoff_s=(0, 0)).run()
    assert nvml.inits == 1 and nvml.shutdowns == 1  # ended cleanly, no thread death
