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
Unhealthy in MPS mode (no supervisor: no daemon a share could reach), for the kubelet
(the device lists) and for the extender alike (:func:`sharing_desired`: the GPU's
entry in ANN_GPUS says ``healthy: false``, so no share is placed on it).

What the plugin offers and the agent reports is never more than is free: the IDs
the kubelet's checkpoint gives to plain init containers count as allocated while
their pod is active (PodResources does not list them), each GPU keeps
``--gpu-memory-reserve-mib`` back from its shares (published in ANN_GPUS, so the
extender counts the same units), and the shares report names pods by UID.
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
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent import kubelet_checkpoint
from agent.inventory import Inventory
from agent.labels import Desired, desired_state
from gpu_scheduler import contract, sharing

log = logging.getLogger("gpu_scheduler.agent")

#: MiB of each GPU no share is given (``--gpu-memory-reserve-mib``): what NVML counts
#: in a GPU's total but no tenant can allocate: the driver's reserved memory (about
#: 0.5 GiB on Hopper), the MPS server's context, and the CUDA context (0.3-0.5 GiB)
#: of the tenant holding the last units. 2 GiB: 2.5% of an 80 GiB GPU.
DEFAULT_RESERVE_MIB = 2048

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
    if now - at > HEALTH_STALE_S:  # the same words each round: no annotation churn
        return dict.fromkeys(gpus, f"MPS supervisor silent for over {HEALTH_STALE_S:.0f}s")
    out = {g: str(sick[g])[:200] for g in gpus if g in sick}
    for gpu in gpus:
        if gpu not in out and gpu not in known:
            out[gpu] = "the MPS supervisor does not run a daemon for it yet"
    return out


def with_mps_health(inventory: Inventory, root: str, now: float) -> Inventory:
    """The read with each GPU whose MPS daemon cannot serve it marked unhealthy (why,
    from the supervisor's health file), as ANN_GPUS then says of it."""
    sick = read_health(root, [g.uuid for g in inventory.gpus if not g.mig_enabled], now)
    if not sick:
        return inventory
    gpus = tuple(
        replace(g, healthy=False, reason=f"MPS: {sick[g.uuid]}")
        if g.uuid in sick and g.healthy
        else g
        for g in inventory.gpus
    )
    return replace(inventory, gpus=gpus)


def sharing_desired(agent: Any, inventory: Inventory) -> Desired:
    """What a node shared by our device plugin should carry (agent.loop's desired
    state there): in MPS mode each GPU without a daemon unhealthy, each GPU's reserve,
    and the shares report (ANN_GPU_SHARES) while the kubelet answers."""
    config = agent.config
    root = config.mps_root
    # mps, and the MPS directory mounted (the sharing agent's pod; a plain agent on a
    # node labelled by mistake says nothing of MPS it does not run beside).
    if agent.sharing == contract.SHARING_MODES[0] and root and os.path.isdir(root):
        inventory = with_mps_health(inventory, root, agent.clock().timestamp())
    desired = desired_state(
        inventory,
        manage_capacity=config.manage_capacity,
        reserve_mib=config.gpu_memory_reserve_mib,
    )
    shares = _shares(agent, [g.uuid for g in inventory.gpus])
    if shares is not None:
        desired.annotations[contract.ANN_GPU_SHARES] = shares
    return desired


def _shares(agent: Any, uuids: list[str]) -> str | None:
    """ANN_GPU_SHARES, None when it cannot be said (the key is then removed: no report
    is safe, an old one is not): no PodResources client, no answer for
    ``shares_stale_s``, or no kubelet checkpoint to name the pods by UID."""
    from agent.podresources import allocated_ids, current_shares

    config = agent.config
    if agent.pod_resources is None or not config.kubelet_checkpoint:
        return None
    try:  # read first: a pod allocated since is left out (the extender fits it)
        entries = kubelet_checkpoint.read(config.kubelet_checkpoint)
    except kubelet_checkpoint.CheckpointError as exc:
        log.warning("no GPU shares report", extra={"node": config.node_name, "error": str(exc)})
        return None
    uids = kubelet_checkpoint.device_uids(entries)
    answer = agent.pod_resources.list()
    init: list[tuple[str, str, str]] = []  # what plain init containers hold, by pod UID
    if answer.response is not None:
        reported = allocated_ids(answer.response)
        for entry in kubelet_checkpoint.init_entries(entries, reported):
            init.extend((entry.uid, entry.resource, device) for device in entry.ids)
    now, stale_s = agent.monotonic(), config.shares_stale_s
    shares = current_shares(answer, uuids, now, stale_s, uids, init)
    if shares is not None and shares.skipped != agent.skipped:
        agent.skipped = shares.skipped
        log.warning(
            "PodResources device IDs left out of the GPU shares report",
            extra={"node": config.node_name, "skipped": shares.skipped},
        )
    return None if shares is None else shares.encoded


def start_device_plugin(args: Any, agent: Any) -> Any:
    """The device plugin, following the node's sharing label (``--device-plugin
    auto``) or on/off; None when off or on a dry run."""
    if args.device_plugin == "off" or args.dry_run:
        return None
    from agent.deviceplugin.devices import MPS, Options, gpus_from_inventory
    from agent.deviceplugin.runner import DevicePlugin, PluginConfig
    from agent.podresources import PodResourcesClient

    pods = agent.pod_resources or PodResourcesClient(args.pod_resources_socket)
    root = args.mps_pipe_root
    reserve = getattr(args, "gpu_memory_reserve_mib", DEFAULT_RESERVE_MIB)
    checkpoint = os.path.join(args.kubelet_dir, kubelet_checkpoint.FILE)

    def gpus() -> Any:
        inventory = agent.last_inventory
        if inventory is None:
            return ()
        memory = {g.uuid: g.memory_mib for g in inventory.gpus}
        return tuple(
            replace(g, units=sharing.gpu_units(memory.get(g.uuid), reserve)) if g.units else g
            for g in gpus_from_inventory(inventory)
        )

    def unhealthy() -> set[str]:
        inventory = agent.last_inventory
        if inventory is None:
            return set()
        sick = {g.uuid for g in inventory.gpus if not g.healthy}
        if plugin.state.options.mode == MPS:
            sick |= set(read_health(root, [g.uuid for g in inventory.gpus], time.time()))
        return sick

    def allocated() -> Any:
        return allocated_now(pods, checkpoint)

    options = Options(cdi=args.cdi, mps_root=root, mps_container_pipe=root)
    config = PluginConfig(kubelet_dir=Path(args.kubelet_dir), options=options)
    plugin = DevicePlugin(config, gpus, allocated, unhealthy)
    plugin.follow({}, args.device_plugin)  # on: now; auto: once the label is read
    agent.on_node = lambda node: plugin.follow(node.labels, args.device_plugin)
    return plugin


def allocated_now(pods: Any, checkpoint: str) -> dict[str, set[str]]:
    """The device plugin's allocated source: what PodResources reports, and what the
    kubelet's checkpoint gives to plain init containers of pods PodResources reports
    active (the kubelet holds those IDs as long; PodResources does not list them; a
    deleted pod's entries, which the checkpoint keeps until the kubelet's next write,
    do not count). Raises when either cannot be read: the plugin then keeps its last
    answer (fail closed)."""
    from agent.podresources import allocated_ids

    entries = kubelet_checkpoint.read(checkpoint)
    answer = pods.list()
    if not answer.ok:
        raise ConnectionError(answer.error)
    ids = allocated_ids(answer.response)
    held = kubelet_checkpoint.init_held(entries, ids)
    for resource, devices in held.items():
        ids.setdefault(resource, set()).update(devices)
    return ids


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
