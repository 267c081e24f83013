"""The agent on a node whose GPUs it shares (``gpu-scheduler.io/gpu-sharing``).

Two processes, two containers of the sharing DaemonSet's pod, so that a restart of
the agent's container never takes the MPS servers from under running pods:

- the agent (``gpu-scheduler agent``) serves the kubelet device plugin
  (agent/deviceplugin/), fed by its own reads (the GPUs, their health with the XID
  marks), by the kubelet's PodResources (what is allocated) and, in MPS mode, by the
  MPS supervisor's health file (a GPU whose daemon cannot run is Unhealthy);
- the MPS supervisor (``gpu-scheduler agent --mps-supervisor``) runs one MPS control
  daemon per GPU (agent/mps.py) and writes their health to ``<root>/health.json``
  every ``interval``.

The health file is the only thing the two share besides the MPS directories. A file
that is missing, unreadable or older than :data:`HEALTH_STALE_S` marks every GPU
Unhealthy in MPS mode (no supervisor: no daemon a share could reach).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("gpu_scheduler.agent")

HEALTH_FILE = "health.json"
#: The supervisor writes every few seconds; a file older than this is not believed.
HEALTH_STALE_S = 60.0
MAX_HEALTH_BYTES = 1 << 20


def write_health(
    root: str, unhealthy: Mapping[str, str], gpus: Collection[str], now: float
) -> None:
    """The supervisor's word, written atomically (a reader never sees half a file)."""
    body = json.dumps(
        {"at": now, "gpus": sorted(gpus), "unhealthy": dict(sorted(unhealthy.items()))},
        separators=(",", ":"),
    )
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".health-")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(body)
        os.replace(tmp, os.path.join(root, HEALTH_FILE))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_health(root: str, gpus: Collection[str], now: float) -> dict[str, str]:
    """GPU UUID -> why its MPS daemon cannot serve it, for ``gpus``: the supervisor's
    word, or every GPU when the file is missing, unreadable, stale, or does not name
    a GPU (a supervisor that started before the GPU appeared)."""
    path = Path(root) / HEALTH_FILE
    try:
        if path.stat().st_size > MAX_HEALTH_BYTES:
            raise ValueError("too large")
        data = json.loads(path.read_text())
        at, known, sick = data["at"], data["gpus"], data["unhealthy"]
        if not isinstance(at, int | float) or not isinstance(sick, dict):
            raise ValueError("malformed")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return dict.fromkeys(gpus, f"no MPS supervisor health ({path}: {exc})")
    if now - at > HEALTH_STALE_S:
        return dict.fromkeys(gpus, f"MPS supervisor silent for {now - at:.0f}s")
    out = {g: str(sick[g])[:200] for g in gpus if g in sick}
    for gpu in gpus:
        if gpu not in out and gpu not in known:
            out[gpu] = "the MPS supervisor does not run a daemon for it yet"
    return out


def start_device_plugin(args: Any, agent: Any) -> Any:
    """The device plugin, following the node's sharing label (``--device-plugin
    auto``) or on/off; None when off or on a dry run."""
    if args.device_plugin == "off" or args.dry_run:
        return None
    from agent.deviceplugin.devices import MPS, Options, gpus_from_inventory
    from agent.deviceplugin.runner import DevicePlugin, PluginConfig
    from agent.podresources import PodResourcesClient, allocated_ids

    pods = agent.pod_resources or PodResourcesClient(args.pod_resources_socket)
    root = args.mps_pipe_root

    def gpus() -> Any:
        inventory = agent.last_inventory
        return gpus_from_inventory(inventory) if inventory is not None else ()

    def unhealthy() -> set[str]:
        inventory = agent.last_inventory
        if inventory is None:
            return set()
        sick = {g.uuid for g in inventory.gpus if not g.healthy}
        if plugin.state.options.mode == MPS:
            sick |= set(read_health(root, [g.uuid for g in inventory.gpus], time.time()))
        return sick

    def allocated() -> Any:
        answer = pods.list()
        if not answer.ok:  # the plugin keeps its last answer
            raise ConnectionError(answer.error)
        return allocated_ids(answer.response)

    options = Options(cdi=args.cdi, mps_root=root, mps_container_pipe=root)
    config = PluginConfig(kubelet_dir=Path(args.kubelet_dir), options=options)
    plugin = DevicePlugin(config, gpus, allocated, unhealthy)
    plugin.follow({}, args.device_plugin)  # on: now; auto: once the label is read
    agent.on_node = lambda node: plugin.follow(node.labels, args.device_plugin)
    return plugin


def run_mps_supervisor(
    args: Any,
    backend: Any,
    stop: threading.Event,
    interval_s: float,
    clock: Callable[[], float],
) -> int:
    """``--mps-supervisor``: the daemons of this node's GPUs, checked every
    ``interval_s`` and their health written, until ``stop``; each quit on the way out."""
    from agent.inventory import InventoryError
    from agent.mps import MpsSupervisor

    root = args.mps_pipe_root
    os.makedirs(root, exist_ok=True)
    supervisor: MpsSupervisor | None = None
    gpus: tuple[str, ...] = ()
    try:
        while not stop.is_set():
            try:
                now_gpus = tuple(sorted(g.uuid for g in backend.read().gpus if not g.mig_enabled))
            except InventoryError as exc:
                log.warning("MPS supervisor: cannot read the GPUs", extra={"error": str(exc)})
                now_gpus = gpus
            if now_gpus != gpus or supervisor is None:
                if supervisor is not None:
                    supervisor.stop()
                gpus = now_gpus
                command = (args.mps_control, "-d")
                supervisor = MpsSupervisor(gpus, root, os.path.join(root, "log"), command)
                log.info("MPS supervisor: daemons for", extra={"gpus": list(gpus)})
            supervisor.check()
            write_health(root, supervisor.unhealthy(), gpus, clock())
            stop.wait(interval_s)
    finally:
        if supervisor is not None:
            supervisor.stop()
    return 0
