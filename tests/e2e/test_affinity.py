"""Hard GPU constraints as node affinity, on the real control plane: the webhook's
mutated pod, placed by kube-scheduler's default profile (no extender: what an
autoscaler's simulation or another scheduler sees) and by our profile (extender),
is refused on the same nodes."""

from __future__ import annotations

import time

from gpu_scheduler import contract
from tests.e2e.kube import (
    core,
    create_node,
    create_pod,
    delete_pod,
    events,
    gpu_labels,
    pod_manifest,
    unique,
)
from tests.e2e.scenarios import GPU_TAINT

HOSTNAME = "kubernetes.io/hostname"
NODES = {
    "h100-gke-spot": ("NVIDIA-H100-80GB-HBM3", 81559, {"cloud.google.com/gke-spot": "true"}),
    "h100-od": ("NVIDIA-H100-80GB-HBM3", 81559, {"eks.amazonaws.com/capacityType": "ON_DEMAND"}),
    "l4-aks-spot": ("NVIDIA-L4", 23034, {"kubernetes.azure.com/scalesetpriority": "spot"}),
    "l4-shared": ("NVIDIA-L4-SHARED", 23034, {}),
    "a100-preempt": ("NVIDIA-A100-SXM4-40GB", 40960, {"cloud.google.com/gke-preemptible": "true"}),
}
CONSTRAINTS = {
    "only-l4": {contract.ANN_GPU_PRODUCTS: "NVIDIA-L4"},
    "40gi": {contract.ANN_MIN_GPU_MEMORY: "40Gi"},
    "no-spot": {contract.ANN_SPOT: "forbid"},
    "spot-h100": {contract.ANN_SPOT: "require", contract.ANN_GPU_PRODUCTS: "NVIDIA-H100-80GB-HBM3"},
}


def placed(stack, name: str, timeout: float = 30) -> bool:
    """Bound (True), or refused by the scheduler (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if core(stack).read_namespaced_pod(name, "default").spec.node_name:
            return True
        if any(e.startswith("FailedScheduling") for e in events(stack, name)):
            return False
        time.sleep(0.2)
    raise AssertionError(f"{name}: neither bound nor refused in {timeout}s")


def test_default_profile_and_ours_refuse_the_same_nodes(stack):
    case = unique("affinity")
    nodes = {
        short: create_node(
            stack,
            unique(short),
            case=case,
            gpus=8,
            taints=GPU_TAINT,
            labels=gpu_labels(8, product, mib, **extra),
        )
        for short, (product, mib, extra) in NODES.items()
    }
    outcome: dict[tuple[str, str], tuple[bool, bool]] = {}
    created: list[str] = []
    try:
        for label, annotations in CONSTRAINTS.items():
            for short, node in nodes.items():
                ours = unique(f"{label}-ours")
                pod = pod_manifest(
                    ours, 1, case=case, annotations=annotations, node_selector={HOSTNAME: node}
                )
                created.append(ours)
                stored = create_pod(stack, pod)  # through the webhook: mutated
                assert stored["spec"]["schedulerName"] == contract.SCHEDULER_NAME
                terms = stored["spec"]["affinity"]["nodeAffinity"][
                    "requiredDuringSchedulingIgnoredDuringExecution"
                ]["nodeSelectorTerms"]
                assert terms, stored["spec"]["affinity"]
                # The same mutated spec on the default profile, past the webhook.
                plain = unique(f"{label}-default")
                twin = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": plain,
                        "annotations": {**annotations, contract.ANN_SKIP_MUTATION: "true"},
                    },
                    "spec": {**stored["spec"], "schedulerName": contract.DEFAULT_SCHEDULER},
                }
                for key in ("nodeName", "enableServiceLinks", "preemptionPolicy", "priority"):
                    twin["spec"].pop(key, None)
                created.append(plain)
                create_pod(stack, twin)
                outcome[label, short] = (placed(stack, ours), placed(stack, plain))
    finally:
        for name in created:
            delete_pod(stack, name)
    differ = {k: v for k, v in outcome.items() if v[0] != v[1]}
    assert not differ, f"(ours, default profile) differ: {differ}"
    accepted = {k for k, (ours, _) in outcome.items() if ours}
    assert accepted == {
        ("only-l4", "l4-aks-spot"),
        ("only-l4", "l4-shared"),
        ("40gi", "h100-gke-spot"),
        ("40gi", "h100-od"),
        ("40gi", "a100-preempt"),
        ("no-spot", "h100-od"),
        ("no-spot", "l4-shared"),
        ("spot-h100", "h100-gke-spot"),
    }
