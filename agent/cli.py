"""``gpu-scheduler agent``: publish this node's GPUs as labels and capacity."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gpu_scheduler.cli import fail


def configure(parser: argparse.ArgumentParser) -> None:
    _node_flags(parser.add_argument_group("the node and its heartbeat"))
    _writing_flags(parser.add_argument_group("what it reads and writes"))
    _health_flags(parser.add_argument_group("GPU health"))
    _sharing_flags(parser.add_argument_group("GPU sharing"))
    _serving_flags(parser.add_argument_group("serving and the API"))


def _node_flags(parser: Any) -> None:
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="the Node to label (default: $NODE_NAME, from the downward API in a pod)",
    )
    parser.add_argument(
        "--interval", default="60s", help="how often to read the GPUs and compare (default 60s)"
    )
    parser.add_argument(
        "--heartbeat-interval",
        default="5m",
        help="renew the node's heartbeat Lease this often (default 5m; keep it well "
        "below the extender's heartbeatWindow, default 15m)",
    )
    parser.add_argument(
        "--resync-interval",
        default="10m",
        help="read the Node and repair its labels this often even when the GPUs did not "
        "change (default 10m; a change of the GPUs is written at the next --interval)",
    )
    parser.add_argument(
        "--pod-namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="the agent's pod (default $POD_NAMESPACE): the heartbeat Lease's namespace",
    )
    parser.add_argument(
        "--pod-name",
        default=os.environ.get("POD_NAME"),
        help="the agent's pod (default $POD_NAME): owns the heartbeat Lease",
    )
    parser.add_argument(
        "--pod-uid",
        default=os.environ.get("POD_UID"),
        help="the agent's pod UID (default $POD_UID). Without the pod's namespace, name "
        "and UID there is no heartbeat, and the node counts as not agent-managed",
    )


def _writing_flags(parser: Any) -> None:
    parser.add_argument(
        "--once", action="store_true", help="one round, then exit (non-zero on any failure)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="make no API call: print the labels, annotations and capacity as JSON on stdout",
    )
    parser.add_argument(
        "--fake-gpus",
        metavar="FILE",
        help="read the GPUs from this YAML file instead of NVML (tests and the demo)",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then ~/.kube)")
    parser.add_argument(
        "--capacity",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="advertise status.capacity nvidia.com/gpu (off by default): only for nodes "
        "with no NVIDIA device plugin and no DRA driver; pods then get GPUs counted, "
        "but no device is assigned to any container. Never written where a device "
        "plugin or a DRA driver already provides the GPUs.",
    )
    parser.add_argument(
        "--gfd-labels",
        choices=("auto", "always", "never"),
        default="auto",
        help="write GPU Feature Discovery's nvidia.com/ label keys: auto (default) unless "
        "GFD labels the node (nvidia.com/gfd.timestamp), always, or never",
    )


def _sharing_flags(parser: Any) -> None:
    parser.add_argument(
        "--device-plugin",
        choices=("auto", "on", "off"),
        default="auto",
        help="serve the kubelet device plugin for gpu-scheduler.io/gpu-memory and "
        "nvidia.com/gpu: auto (default) while the node is labelled "
        "gpu-scheduler.io/gpu-sharing, on, off",
    )
    parser.add_argument(
        "--kubelet-dir",
        default="/var/lib/kubelet/device-plugins",
        help="the kubelet's device-plugin directory (its kubelet.sock)",
    )
    parser.add_argument(
        "--mps-pipe-root",
        default="/run/gpu-scheduler/mps",
        help="host directory of the MPS daemons: a pipe directory per GPU (<root>/<UUID>), "
        "their /dev/shm (<root>/shm), the supervisor's health.json",
    )
    parser.add_argument(
        "--cdi",
        action="store_true",
        help="name a container's GPU as a CDI device (nvidia.com/gpu=<UUID>) instead of "
        "NVIDIA_VISIBLE_DEVICES",
    )
    parser.add_argument(
        "--mps-control",
        default="nvidia-cuda-mps-control",
        help="the MPS control program (default: nvidia-cuda-mps-control, found on $PATH)",
    )
    parser.add_argument(
        "--mps-supervisor",
        action="store_true",
        help="run only the MPS control daemons of this node's GPUs and write their health "
        "(the sharing DaemonSet's second container); no Node writes",
    )
    parser.add_argument(
        "--pod-resources-socket",
        default="/var/lib/kubelet/pod-resources/kubelet.sock",
        help="the kubelet's PodResources socket, read on nodes labelled "
        "gpu-scheduler.io/gpu-sharing for the gpu-shares annotation ('': never read)",
    )
    parser.add_argument(
        "--shares-stale-after",
        default="5m",
        help="while the kubelet does not answer, its last answer stands this long; then "
        "the gpu-shares annotation is removed (default 5m)",
    )
    parser.add_argument(
        "--gpu-memory-reserve-mib",
        type=int,
        default=2048,
        help="MiB of each shared GPU that no share is given: the driver's reserved "
        "memory, the MPS server's and the tenants' CUDA contexts (default 2048; "
        "published in the gpus annotation, so the extender counts the same units)",
    )


def _health_flags(parser: Any) -> None:
    parser.add_argument(
        "--xid-ignore",
        metavar="LIST",
        help="XIDs that leave a GPU healthy (application errors), comma-separated; "
        "replaces the default 13,31,43,45,68,109 (NVIDIA's device plugin's); '' ignores none",
    )
    parser.add_argument(
        "--xid-critical",
        metavar="LIST",
        default="",
        help="XIDs taken off the ignore list: they mark the GPU unhealthy",
    )
    parser.add_argument(
        "--recovery",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a GPU an XID marked unhealthy is healthy again after --recovery-quiet-period "
        "of good reads (default on; off: until the agent restarts, as the device plugin)",
    )
    parser.add_argument(
        "--recovery-quiet-period",
        default="10m",
        help="good reads without a critical event before recovery (default 10m)",
    )
    parser.add_argument(
        "--unhealthy-after",
        default="5m",
        help="/healthz answers 503 after this long without a good NVML read, so the "
        "kubelet restarts the agent (a driver upgraded under it; default 5m)",
    )


def _serving_flags(parser: Any) -> None:
    parser.add_argument("--host", default="0.0.0.0", help="address for --port (default 0.0.0.0)")
    parser.add_argument(
        "--port",
        type=int,
        default=8090,
        help="port for /healthz, /readyz, /metrics (default 8090; 0: no server)",
    )
    parser.add_argument(
        "--request-timeout", default="10s", help="timeout of one API call (default 10s)"
    )


def run(args: argparse.Namespace) -> int:
    from agent.xid import XidPolicy
    from gpu_scheduler.durations import parse_duration

    try:
        interval = parse_duration(args.interval)
        heartbeat = parse_duration(args.heartbeat_interval)
        resync = parse_duration(args.resync_interval)
        timeout = parse_duration(args.request_timeout)
        quiet = parse_duration(args.recovery_quiet_period)
        unhealthy_after = parse_duration(args.unhealthy_after)
        shares_stale = parse_duration(args.shares_stale_after)
        xid_policy = XidPolicy.configured(args.xid_ignore, args.xid_critical)
    except ValueError as exc:
        return fail("agent", exc)
    if min(interval, heartbeat, resync, timeout) <= 0:
        return fail(
            "agent",
            "--interval, --heartbeat-interval, --resync-interval and --request-timeout must be > 0",
        )
    if not args.dry_run and not args.node_name:
        return fail("agent", "--node-name (or $NODE_NAME) is required unless --dry-run")
    if not 0 <= args.gpu_memory_reserve_mib <= 64 << 10:
        return fail("agent", "--gpu-memory-reserve-mib must be between 0 and 65536")

    import logging
    import threading

    from agent.fake import FakeBackend
    from agent.heartbeat import PodIdentity
    from agent.inventory import Backend
    from agent.kubelet_checkpoint import FILE as CHECKPOINT_FILE
    from agent.loop import AgentConfig
    from agent.nvml import NvmlBackend

    log = logging.getLogger("gpu_scheduler.agent")
    if heartbeat < interval:
        log.warning(
            "--heartbeat-interval is shorter than --interval; the heartbeat is refreshed "
            "at most once per interval",
            extra={"interval_s": interval, "heartbeat_interval_s": heartbeat},
        )
    backend: Backend = FakeBackend(args.fake_gpus) if args.fake_gpus else NvmlBackend()
    config = AgentConfig(
        node_name=args.node_name or "",
        interval_s=interval,
        heartbeat_interval_s=heartbeat,
        resync_interval_s=resync,
        pod=PodIdentity.from_values(args.pod_namespace, args.pod_name, args.pod_uid),
        manage_capacity=args.capacity,
        gfd_labels=args.gfd_labels,
        xid_policy=xid_policy,
        recover=args.recovery,
        recovery_quiet_s=quiet,
        unhealthy_after_s=unhealthy_after,
        pod_resources_socket=args.pod_resources_socket or None,
        shares_stale_s=shares_stale,
        kubelet_checkpoint=os.path.join(args.kubelet_dir, CHECKPOINT_FILE),
        mps_root=args.mps_pipe_root if args.device_plugin != "off" else None,
        gpu_memory_reserve_mib=args.gpu_memory_reserve_mib,
    )
    stop = threading.Event()
    if args.mps_supervisor:
        return _run_mps(args, backend, stop, interval, log)
    if args.once:
        return _run_once(args, config, backend, stop, timeout)
    return _run_forever(args, config, backend, stop, timeout, log)


def _run_mps(args: argparse.Namespace, backend: Any, stop: Any, interval: float, log: Any) -> int:
    """``--mps-supervisor``: until SIGTERM/SIGINT."""
    import signal
    import time

    from agent.sharing_node import run_mps_supervisor

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal received; quitting the MPS daemons", extra={"signal": signum})
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return run_mps_supervisor(args, backend, stop, min(interval, 10.0), time.time)


def _node_api(args: argparse.Namespace, timeout: float) -> Any:
    """The Kubernetes client for the Node, or a message why there is none."""
    from kubernetes.config import ConfigException

    from agent.kubeapi import KubeNodeApi

    try:
        return KubeNodeApi.from_kubeconfig(args.kubeconfig, timeout)
    except ConfigException as exc:
        return f"no Kubernetes configuration: {exc}"


def _run_once(
    args: argparse.Namespace, config: Any, backend: Any, stop: Any, timeout: float
) -> int:
    """``--once``: read, print (``--dry-run``) or write once, and exit."""
    from agent.inventory import InventoryError
    from agent.kubeapi import ApiError
    from agent.loop import Agent

    agent = Agent(config, backend, None, stop=stop)
    try:
        inventory = agent.read_inventory()
    except InventoryError as exc:
        return fail("agent", f"cannot read the GPUs: {exc}", 1)
    if args.dry_run:
        import json

        print(json.dumps(agent.desired(inventory).as_json(), indent=2), flush=True)
        return 0
    api = _node_api(args, timeout)
    if isinstance(api, str):
        return fail("agent", api, 1)
    agent.api = api
    try:
        agent.sync_once(inventory)
        if config.pod is not None:
            agent.renew_heartbeat()
    except ApiError as exc:
        return fail("agent", f"node {args.node_name}: {exc}", 1)
    return 0


def _run_forever(
    args: argparse.Namespace, config: Any, backend: Any, stop: Any, timeout: float, log: Any
) -> int:
    """The loop, with the ops server, until SIGTERM/SIGINT."""
    import signal
    import threading

    from agent.loop import Agent
    from agent.nvml import NvmlBackend

    wake = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal received; finishing the write in flight", extra={"signal": signum})
        stop.set()
        wake.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    api = None
    if not args.dry_run:
        api = _node_api(args, timeout)
        if isinstance(api, str):
            return fail("agent", api, 1)
    agent = Agent(config, backend, api, stop=stop)
    from agent.sharing_node import start_device_plugin

    plugin = start_device_plugin(args, agent)
    if isinstance(backend, NvmlBackend):  # a fake file scripts its XIDs in the reads
        from agent.events import NvmlEvents
        from agent.inventory import InventoryError

        try:
            nvml = backend.module()
        except InventoryError as exc:  # the reads say so too, every round
            log.error("no NVML event loop", extra={"error": str(exc)})
        else:
            agent.wake = wake
            NvmlEvents(nvml, agent.health, wake, stop).start()
    server = None
    if args.port:
        from gpu_scheduler.opsserver import start_ops_server

        server = start_ops_server(args.host, args.port, agent.ready, agent.alive)
    log.info(
        "agent started",
        extra={
            "node": args.node_name,
            "backend": "fake:" + args.fake_gpus if args.fake_gpus else "nvml",
            "interval_s": config.interval_s,
            "heartbeat_interval_s": config.heartbeat_interval_s,
            "resync_interval_s": config.resync_interval_s,
            "heartbeat_lease": (f"{config.pod.namespace}/{args.node_name}" if config.pod else None),
            "capacity": args.capacity,
            "gfd_labels": args.gfd_labels,
            "dry_run": args.dry_run,
            "port": args.port,
        },
    )
    try:
        if args.dry_run:
            return agent.run_dry(sys.stdout, once=False)
        return agent.run_forever()
    finally:
        if plugin is not None:
            plugin.stop()
        if agent.pod_resources is not None:
            agent.pod_resources.close()
        if server is not None:
            server.shutdown()
