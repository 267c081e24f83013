"""Node and Pod objects in their JSON form, as kube-scheduler sends them."""

from __future__ import annotations

from typing import Any

from gpu_scheduler import contract


def make_node(
    name: str,
    gpus: int = 0,
    *,
    product: str | None = None,
    memory_mib: int | None = None,
    capacity_type: str | None = None,
    karpenter: str | None = None,
    zone: str | None = None,
    cpu: str = "32",
    memory: str = "256Gi",
    extra_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    labels: dict[str, str] = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
    if gpus:
        labels[contract.LABEL_GPU_PRESENT] = "true"
        labels[contract.LABEL_GPU_COUNT] = str(gpus)
    if product:
        labels[contract.LABEL_GPU_PRODUCT] = product
    if memory_mib is not None:
        labels[contract.LABEL_GPU_MEMORY] = str(memory_mib)
    if capacity_type:
        labels[contract.LABEL_EKS_CAPACITY_TYPE] = capacity_type
    if karpenter:
        labels[contract.LABEL_KARPENTER_CAPACITY_TYPE] = karpenter
    if zone:
        labels[contract.LABEL_ZONE] = zone
    labels.update(extra_labels or {})
    annotations = {"node.alpha.kubernetes.io/ttl": "0"}
    resources = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        resources[contract.RESOURCE_GPU] = str(gpus)
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"kubeletVersion": "v1.37.2", "architecture": "amd64"},
        },
    }


def make_pod(
    name: str = "p",
    gpus: int = 1,
    *,
    namespace: str = "default",
    annotations: dict[str, str] | None = None,
    node: str | None = None,
    phase: str = "Pending",
    use_limits: bool = False,
) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    if gpus:
        # The API requires a limit for extended resources; a request, when given,
        # must equal it. use_limits: the limit alone (the request is implied).
        resources["limits"] = {contract.RESOURCE_GPU: str(gpus)}
        if not use_limits:
            resources["requests"][contract.RESOURCE_GPU] = str(gpus)
    spec: dict[str, Any] = {
        "schedulerName": contract.SCHEDULER_NAME,
        "containers": [{"name": "main", "image": "busybox", "resources": resources}],
    }
    if node:
        spec["nodeName"] = node
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def make_lease(node: str, renewed: str | None, namespace: str = "gpu-scheduler") -> dict[str, Any]:
    """An agent's heartbeat Lease for ``node``, last renewed at ``renewed`` (a MicroTime
    or any RFC 3339 time; None: never renewed), as the API server lists it."""
    spec: dict[str, Any] = {"holderIdentity": node, "leaseDurationSeconds": 900}
    if renewed is not None:
        spec["renewTime"] = renewed
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": namespace,
            "uid": f"lease-{node}",
            "resourceVersion": "1",
            "labels": {contract.LEASE_LABEL: contract.LEASE_LABEL_VALUE},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": f"agent-{node}", "uid": "pod-uid"}
            ],
        },
        "spec": spec,
    }
