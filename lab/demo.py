"""``python -m lab`` (``make demo``): the whole product on a local control plane.

Starts the control plane (built by ``make controlplane``), our extender, webhook and
kube-scheduler profile, creates a handful of nodes whose GPUs our agent publishes from
fake inventories, creates a mix of GPU and CPU pods, and prints where each landed and
why, then the cluster's GPU inventory (``gpu-scheduler status``).
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpu_scheduler import contract, podspec, sharing

log = logging.getLogger(__name__)

H100 = {"name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "computeCapability": "9.0"}
A100 = {"name": "NVIDIA A100-SXM4-40GB", "memoryMiB": 40960, "computeCapability": "8.0"}
L4 = {"name": "NVIDIA L4", "memoryMiB": 23034, "computeCapability": "8.9"}
L40S = {"name": "NVIDIA L40S", "memoryMiB": 46068, "computeCapability": "8.9"}
GPU_TAINT = {"key": contract.RESOURCE_GPU, "value": "present", "effect": "NoSchedule"}


@dataclass(frozen=True)
class DemoNode:
    name: str
    gpu: dict[str, Any] | None = None
    count: int = 0
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def sharing(self) -> bool:
        """Labelled for shares of a GPU (``gpu-scheduler.io/gpu-memory``)."""
        return contract.LABEL_GPU_SHARING in self.labels

    def share_units(self) -> int:
        """The gpu-memory units the node's device plugin would advertise (no reserve:
        the demo's agent runs without the device plugin, and the extender counts from
        its annotation)."""
        assert self.gpu is not None
        return sharing.gpu_units(self.gpu["memoryMiB"]) * self.count


SPOT = {contract.LABEL_KARPENTER_CAPACITY_TYPE: "spot"}
ON_DEMAND = {contract.LABEL_EKS_CAPACITY_TYPE: "ON_DEMAND"}


def where(zone: str, capacity: dict[str, str] | None = None) -> dict[str, str]:
    """A demo node's labels: its zone and, for GPU nodes, its capacity type."""
    return {contract.LABEL_ZONE: zone, **(capacity or {})}


NODES = (
    DemoNode("h100-spot-a1", H100, 8, where("zone-a", SPOT)),
    DemoNode("h100-spot-a2", H100, 8, where("zone-a", SPOT)),
    DemoNode("a100-od-b1", A100, 4, where("zone-b", ON_DEMAND)),
    DemoNode("a100-od-b2", A100, 4, where("zone-b", ON_DEMAND)),
    DemoNode("l4-od-c1", L4, 2, where("zone-c", ON_DEMAND)),
    # Shares of a GPU (docs/concepts/sharing.md): the demo plays its device plugin.
    DemoNode(
        "l40s-share-c3",
        L40S,
        2,
        {**where("zone-c", ON_DEMAND), contract.LABEL_GPU_SHARING: "time-slicing"},
    ),
    DemoNode("cpu-c1", None, 0, where("zone-c")),
)

#: Not an annotation: a PODS entry's annotations with this key ask that many GiB of one
#: GPU (``gpu-scheduler.io/gpu-memory``) instead of whole GPUs.
SHARE = contract.RESOURCE_GPU_MEMORY
#: The demo keeps its sharing node for shares: whole-GPU pods would take its GPUs
#: first, and the pods that ask a share tolerate this.
SHARE_TAINT = {"key": contract.LABEL_GPU_SHARING, "value": "time-slicing", "effect": "NoSchedule"}
# (name, GPUs, annotations, what the pod shows)
PODS: tuple[tuple[str, int, dict[str, str], str], ...] = (
    (
        "pretrain",
        8,
        {contract.ANN_MIN_GPU_MEMORY: "79Gi", contract.ANN_SPOT: "prefer"},
        "8 big GPUs, spot welcome",
    ),
    ("embed", 1, {contract.ANN_GPU_PRODUCTS: "NVIDIA-L4"}, "only L4"),
    ("ddp-worker-0", 2, {contract.ANN_GROUP: "ddp"}, "placement group"),
    ("ddp-worker-1", 2, {contract.ANN_GROUP: "ddp"}, "placement group"),
    ("ddp-worker-2", 2, {contract.ANN_GROUP: "ddp"}, "placement group"),
    ("notebook", 1, {}, "1 GPU, on-demand"),
    ("infer-share", 0, {SHARE: "20"}, "20 GiB of one GPU"),
    ("batch-spot", 4, {contract.ANN_SPOT: "require"}, "spot only"),
    ("web", 0, {}, "CPU pod"),
    ("needs-b200", 1, {contract.ANN_GPU_PRODUCTS: "NVIDIA-B200"}, "impossible on purpose"),
)


# --real-node: one more node, run by a real kubelet and containerd (lab.realnode), and
# a pod only it can take, which really runs there (from the image `make image` built).
# The pod goes first and takes the node's one GPU, so the rest of the story is the same
# with and without it.
REAL_NODE = DemoNode("l40s-real-c2", L40S, 1, where("zone-c", ON_DEMAND))
REAL_POD = ("render", 1, {contract.ANN_GPU_PRODUCTS: "NVIDIA-L40S"}, "only L40S: a real node")
REAL_COMMAND = ["python3", "-c", "import socket; print('ran on', socket.gethostname())"]


def inventory(node: DemoNode) -> dict[str, Any]:
    assert node.gpu is not None
    return {
        "driverVersion": "550.54.15",
        "cudaDriverVersion": "12.4",
        "gpus": [
            {
                **node.gpu,
                "uuid": f"GPU-{node.name}-{i}",
                "migEnabled": False,
                "healthy": True,
            }
            for i in range(node.count)
        ],
    }


def pod_manifest(
    name: str, gpus: int, annotations: dict[str, str], image: str | None = None
) -> dict[str, Any]:
    """A demo pod; with ``image``, one that runs to completion (for the real node)."""
    resources: dict[str, Any] = {"requests": {"cpu": "500m", "memory": "512Mi"}}
    annotations = dict(annotations)
    share = annotations.pop(SHARE, None)
    if gpus:
        resources["limits"] = {contract.RESOURCE_GPU: str(gpus)}
    elif share:
        resources["limits"] = {contract.RESOURCE_GPU_MEMORY: share}
        tolerations = [{"key": SHARE_TAINT["key"], "operator": "Exists"}]
    main: dict[str, Any] = {"name": "main", "image": "registry.k8s.io/pause:3.10"}
    if image:
        main = {"name": "main", "image": image, "command": REAL_COMMAND}
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "restartPolicy": "Never",
        "containers": [{**main, "resources": resources}],
    }
    if share:
        spec["tolerations"] = tolerations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations, "labels": {"app": "demo"}},
        "spec": spec,
    }


def why(pod: dict[str, Any], events: list[tuple[str, str]]) -> str:
    """The placement in the extender's own words (its GPUPlacement Event, without the
    leading "N GPUs on NODE: "), or why the pod is pending."""
    placed = [message for reason, message in events if reason == "GPUPlacement"]
    if placed:  # without "N GPUs on NODE: " and the weights; a share keeps its GPU
        head, _, text = placed[-1].partition(": ")
        gpu = re.search(r"GiB share of (\S+) on ", head)
        text = re.sub(r"; weights [^)]*\)", ")", text or head)
        return f"{gpu.group(1)}: {text}" if gpu else text
    if not pod["spec"].get("nodeName"):
        failed = [message for reason, message in events if reason == "FailedScheduling"]
        return f"FailedScheduling: {failed[-1]}"[:160] if failed else "pending"
    try:
        gpus = podspec.pod_gpu_request(pod["spec"])
    except ValueError:
        gpus = 0
    if not gpus:
        return "no GPUs asked: default scheduler; GPU nodes are tainted"
    return "placed; the extender's explanation has not arrived (rate-limited?)"


def run_demo(workdir: Path, keep: bool, real_node: bool = False) -> int:
    from kubernetes import client

    from extender.status import cluster_status
    from gpu_scheduler.table import render_table
    from lab import realnode
    from lab.kubelet_shim import node_object
    from lab.stack import start_stack

    print(
        "starting the control plane and gpu-scheduler (extender, webhook, scheduler)...", flush=True
    )
    started = time.monotonic()
    stack = start_stack(workdir, real_node=real_node)
    real = None
    nodes, pods = ((*NODES, REAL_NODE), (REAL_POD, *PODS)) if real_node else (NODES, PODS)
    try:
        core = client.CoreV1Api(stack.api)
        print(f"  up in {time.monotonic() - started:.0f}s; creating nodes and agents", flush=True)
        for node in nodes:
            taints = [GPU_TAINT] if node.gpu else []
            if node.sharing:  # kept for shares, as an admin would (SHARE_TAINT)
                taints.append(SHARE_TAINT)
            if node is REAL_NODE:
                print("  starting a real node: containerd, runc, CNI and a kubelet", flush=True)
                real = realnode.start_real_node(
                    stack.cluster, node.name, node.labels, taints=taints
                )
            else:
                core.create_node(node_object(node.name, labels=node.labels, taints=taints))
            if node.gpu:
                path = workdir / f"{node.name}-gpus.yaml"
                path.write_text(yaml.safe_dump(inventory(node)))
                # the lab runs no device plugin: its sockets would be the host's
                stack.start_agent(node.name, path, extra=["--device-plugin", "off"])
            if node.sharing:
                _play_share_plugin(core, node)
        _wait_for_capacity(core, [n for n in nodes if n.gpu])
        print("  agents published labels and capacity; creating pods", flush=True)
        image = realnode.images().get("GPU_SCHEDULER_IMAGE")
        for name, gpus, annotations, _ in pods:
            runs = image if name == REAL_POD[0] else None
            core.create_namespaced_pod("default", pod_manifest(name, gpus, annotations, runs))
            _wait_pod(core, name, 30 if "b200" not in name else 8)
        _wait_explanations(core, [name for name, gpus, a, _ in pods if gpus or SHARE in a])
        rows = []
        for name, gpus, annotations, note in pods:
            pod = stack.api.sanitize_for_serialization(core.read_namespaced_pod(name, "default"))
            events = [
                (e.reason, e.message)
                for e in core.list_namespaced_event(
                    "default", field_selector=f"involvedObject.name={name}"
                ).items
            ]
            node_name = pod["spec"].get("nodeName")
            asked = f"{annotations[SHARE]} GiB" if SHARE in annotations else str(gpus)
            rows.append((name, node_name or "(Pending)", asked, note, why(pod, events)))
        print()
        print(render_table(("POD", "NODE", "GPUS", "ASKED FOR", "WHY THAT NODE"), rows))
        print()
        print(cluster_status(stack.api))
        if real is not None:
            print(_real_pod_report(core, REAL_POD[0]))
        if keep:
            print(
                f"\nThe cluster keeps running. kubeconfig: {stack.cluster.kubeconfig}\n"
                f"  {stack.cluster.binary} kubectl --kubeconfig {stack.cluster.kubeconfig} "
                "get pods -o wide\n"
                f"  gpu-scheduler status --kubeconfig {stack.cluster.kubeconfig}\n"
                f"Component logs: {workdir / 'logs'}. Press Ctrl-C to stop it.",
                flush=True,
            )
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        return 0
    finally:
        print("stopping...", flush=True)
        stack.stop()
        if real is not None:
            real.stop()


def _real_pod_report(core: Any, name: str, timeout: float = 120) -> str:
    """What became of the pod on the real node: its phase and what it printed."""
    deadline = time.monotonic() + timeout
    pod = core.read_namespaced_pod(name, "default")
    while pod.status.phase not in ("Succeeded", "Failed") and time.monotonic() < deadline:
        time.sleep(1)
        pod = core.read_namespaced_pod(name, "default")
    out = ""
    if pod.status.phase in ("Succeeded", "Failed"):
        out = core.read_namespaced_pod_log(name, "default").strip()
    return (
        f"\nOn the real node {pod.spec.node_name}: pod {name} {pod.status.phase}"
        f"{f', it printed: {out!r}' if out else ''}"
    )


def _wait_explanations(core: Any, names: list[str], timeout: float = 10) -> None:
    """Until every placed GPU pod has its GPUPlacement Event (the extender writes it
    just after the binding)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = core.list_namespaced_event("default", field_selector="reason=GPUPlacement").items
        explained = {e.involved_object.name for e in events}
        placed = {n for n in names if core.read_namespaced_pod(n, "default").spec.node_name}
        if placed <= explained:
            return
        time.sleep(0.3)


def _play_share_plugin(core: Any, node: DemoNode) -> None:
    """What the kubelet writes when our device plugin registers a sharing node's
    units (the demo's nodes have no kubelet)."""
    units = str(node.share_units())
    resources = {contract.RESOURCE_GPU_MEMORY: units}
    patch = {"status": {"capacity": resources, "allocatable": resources}}
    core.patch_node_status(node.name, patch, field_manager="kubelet")


def _wait_for_capacity(core: Any, nodes: list[DemoNode], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    waiting = {n.name for n in nodes}
    while waiting and time.monotonic() < deadline:
        for name in list(waiting):
            node = core.read_node(name)
            allocatable = (node.status.allocatable or {}).get(contract.RESOURCE_GPU)
            if allocatable and int(allocatable) > 0:
                waiting.discard(name)
        time.sleep(0.5)
    if waiting:
        raise RuntimeError(f"agents did not publish GPUs for {sorted(waiting)} in {timeout}s")


def _wait_pod(core: Any, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if core.read_namespaced_pod(name, "default").spec.node_name:
            return
        time.sleep(0.2)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep", action="store_true", help="leave the cluster running until Ctrl-C"
    )
    parser.add_argument(
        "--workdir", help="where the cluster's files and logs go (default: a temp dir)"
    )
    parser.add_argument(
        "--real-node",
        action="store_true",
        help="add one node run by a real kubelet and containerd, where a pod really runs "
        "(root, containerd, runc, CNI plugins, `make image`)",
    )


def run(args: argparse.Namespace) -> int:
    from lab.controlplane import find_binary

    if find_binary() is None:
        print("python -m lab: no control-plane binary; run `make demo` (it builds one with Go)")
        return 2
    if args.real_node:
        from lab.realnode import missing

        reason = missing()
        if reason:
            print(f"python -m lab --real-node: {reason}")
            return 2
    logging.getLogger().setLevel(logging.WARNING)
    workdir = (
        Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="gpu-scheduler-demo-"))
    )
    try:
        return run_demo(workdir, args.keep, args.real_node)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
