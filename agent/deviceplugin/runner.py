"""The device plugin as the agent runs it: both resources served and registered, the
sources read every ``poll_s`` (and at once on :meth:`DevicePlugin.notify`), the
kubelet's restarts followed; started and stopped from any thread, stopped within a
second.

    plugin = DevicePlugin(PluginConfig(options=Options(mode="mps")), gpus, allocated,
                          unhealthy).start()
    ...
    plugin.notify()   # the GPUs' health changed: relist now
    plugin.stop()
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.deviceplugin.devices import RESOURCES, SHARES, TIME_SLICING, WHOLE, Options
from agent.deviceplugin.register import DEFAULT_DIR, Registrar
from agent.deviceplugin.server import DevicePluginServicer
from agent.deviceplugin.state import (
    DEFAULT_GRACE_S,
    AllocatedSource,
    GpuSource,
    HealthSource,
    PluginState,
)
from gpu_scheduler import contract

log = logging.getLogger("gpu_scheduler.agent")

#: Each resource's socket in the kubelet's device-plugin directory.
SOCKETS: Mapping[str, str] = {
    SHARES: "gpu-scheduler-gpu-memory.sock",
    WHOLE: "gpu-scheduler-gpu.sock",
}


def sharing_mode(labels: Mapping[str, Any]) -> str | None:
    """The node's sharing mode from its ``gpu-scheduler.io/gpu-sharing`` label, None
    when it has none (or one of no known mode): then the plugin does not run under
    ``--device-plugin auto``."""
    value = labels.get(contract.LABEL_GPU_SHARING)
    return value if value in contract.SHARING_MODES else None


@dataclass(frozen=True, slots=True)
class PluginConfig:
    kubelet_dir: Path = DEFAULT_DIR
    options: Options = field(default_factory=Options)
    poll_s: float = 1.0
    grace_s: float = DEFAULT_GRACE_S
    register_timeout_s: float = 5.0
    retry_max_s: float = 30.0


class DevicePlugin:
    def __init__(
        self,
        config: PluginConfig,
        gpus: GpuSource,
        allocated: AllocatedSource,
        unhealthy: HealthSource,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.state = PluginState(
            gpus, allocated, unhealthy, config.options, grace_s=config.grace_s, monotonic=monotonic
        )
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # start and stop
        self._round = threading.Lock()  # a round's registrations, and stop's closing
        self._thread: threading.Thread | None = None
        self.registrars = {
            resource: Registrar(
                config.kubelet_dir,
                SOCKETS[resource],
                resource,
                DevicePluginServicer(resource, self.state),
                self._stop,
                monotonic,
                poll_s=config.poll_s,
                retry_max_s=config.retry_max_s,
                timeout_s=config.register_timeout_s,
            )
            for resource in RESOURCES
        }

    # --- control ----------------------------------------------------------------------
    def start(self) -> DevicePlugin:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            self._stop.clear()
            self.state.reopen()
            self._thread = threading.Thread(target=self._run, name="device-plugin", daemon=True)
            self._thread.start()
        log.info(
            "device plugin started",
            extra={
                "dir": str(self.config.kubelet_dir),
                "mode": self.state.options.mode,
                "cdi": self.state.options.cdi,
            },
        )
        return self

    def stop(self, timeout: float = 1.0) -> None:
        """End the loop, the streams and both servers (their sockets removed)."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
            self._wake.set()
            self.state.close()
            if thread is not None:
                thread.join(timeout)
            with self._round:
                for registrar in self.registrars.values():
                    registrar.close()

    def follow(self, labels: Mapping[str, Any], setting: str) -> None:
        """Run as ``--device-plugin`` says, given the node's labels: ``auto`` while the
        node carries ``gpu-scheduler.io/gpu-sharing`` (in its mode), ``on`` always (in
        the label's mode, time-slicing without one), ``off`` never."""
        mode = sharing_mode(labels)
        if setting == "off" or (setting == "auto" and mode is None):
            if self.running:
                log.info("device plugin stopping", extra={"setting": setting})
                self.stop()
            return
        self.set_mode(mode or TIME_SLICING)
        if not self.running:
            self.start()

    def notify(self) -> None:
        """Read the sources now (the agent saw the GPUs' health change)."""
        self._wake.set()

    def set_mode(self, mode: str) -> None:
        """The node's sharing mode changed: Allocate answers for ``mode`` from now."""
        options = self.state.options
        if mode != options.mode:
            self.state.options = dataclasses.replace(options, mode=mode)
            log.info("device plugin: sharing mode changed", extra={"mode": mode})

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def registered(self) -> dict[str, bool]:
        """Each resource: served and registered with the kubelet now."""
        return {r: reg.registered_with is not None for r, reg in self.registrars.items()}

    # --- the loop ---------------------------------------------------------------------
    def tick(self) -> None:
        """One round: read the sources, then serve and register what needs it."""
        self.state.refresh()
        with self._round:
            if self._stop.is_set():  # stopping: serve nothing again
                return
            for registrar in self.registrars.values():
                registrar.ensure()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # a bug of ours: logged, and the next round tries again
                log.exception("device plugin: round failed")
            self._wake.wait(self.config.poll_s)
            self._wake.clear()
