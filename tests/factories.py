"""Node and Pod objects in their JSON form, as kube-scheduler sends them; the DRA
objects (DeviceClass, ResourceSlice, ResourceClaim) as the NVIDIA DRA driver and
kube-scheduler write them."""

from __future__ import annotations

import uuid
from typing import Any

from gpu_scheduler import contract, dra
from lab.kubelet_shim import node_object


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
    """A Node as the API server lists it to the extender's cache: the lab's Node (what a kubelet
    registers, lab.kubelet_shim.node_object) with GFD-style GPU labels, the metadata the
    API server adds (uid, resourceVersion) and the kubelet's node info."""
    labels: dict[str, str] = {}
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
    node = node_object(
        name,
        labels=labels,
        annotations={"node.alpha.kubernetes.io/ttl": "0"},
        gpus=gpus or None,
        cpu=cpu,
        memory=memory,
    )
    node["metadata"].update({"uid": f"uid-{name}", "resourceVersion": "1"})
    node["spec"]["podCIDR"] = "10.0.0.0/24"
    node["status"]["nodeInfo"] = {"kubeletVersion": "v1.37.2", "architecture": "amd64"}
    return node


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


def admission_review(obj: Any, **request: Any) -> dict[str, Any]:
    """An AdmissionReview (admission.k8s.io/v1) for a Pod CREATE, as the API server sends
    it; ``request`` fields replace the defaults."""
    req = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": "",
        "namespace": "ns",
        "operation": "CREATE",
        "userInfo": {"username": "admin", "groups": ["system:authenticated"]},
        "object": obj,
        "oldObject": None,
        "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        **request,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


# --- DRA ---------------------------------------------------------------------------------

GPU_SELECTOR = (
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
)


def device_class(
    name: str = "gpu.nvidia.com",
    resource: str | None = contract.RESOURCE_GPU,
    selector: str = GPU_SELECTOR,
    created: str = "2026-11-01T00:00:00Z",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": selector}}]}
    if resource:
        spec["extendedResourceName"] = resource
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": spec,
    }


def gpu_device(i: int, product: str = "NVIDIA H100 80GB HBM3", mib: int = 81559, **extra: Any):
    return {
        "name": f"gpu-{i}",
        "attributes": {
            "type": {"string": extra.pop("type", "gpu")},
            "uuid": {"string": f"GPU-{i:04d}"},
            "productName": {"string": product},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{i:02x}:00.0"},
        },
        "capacity": {"memory": {"value": f"{mib}Mi"}},
    }


def resource_slice(node: str, devices: list[dict[str, Any]], generation: int = 1) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com-{generation}"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _resource_claim(
    name: str, request: dict[str, Any], results: list[dict[str, Any]] | None, **meta: Any
) -> dict[str, Any]:
    """A ResourceClaim of one request in ``default``; allocated ``results`` if given."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", **meta},
        "spec": {"devices": {"requests": [request]}},
    }
    if results is not None:
        obj["status"] = {"allocation": {"devices": {"results": results}}}
    return obj


def claim(
    name: str, node: str, devices: list[str], extended: bool = True, pool: str | None = None
) -> dict:
    """An allocated ResourceClaim holding ``devices`` of ``pool`` (the node's own by
    default)."""
    request = {
        "name": "container-0-request-0",
        "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "allocationMode": "ExactCount",
            "count": len(devices),
        },
    }
    results = [
        {"request": request["name"], "driver": "gpu.nvidia.com", "pool": pool or node, "device": d}
        for d in devices
    ]
    annotations = {dra.ANN_EXTENDED_RESOURCE_CLAIM: "true"} if extended else {}
    return _resource_claim(name, request, results, annotations=annotations)


def shared_device(i: int, gib: int = 80) -> dict[str, Any]:
    """A GPU that allows multiple allocations (DRA consumable capacity)."""
    device = gpu_device(i, mib=gib * 1024)
    device["allowMultipleAllocations"] = True
    return device


def share_claim(
    name: str,
    node: str | None,
    consumed: dict[str, str],
    asks: str = "20Gi",
    pool: str | None = None,
):
    """A claim asking ``asks`` of a shareable GPU's memory; with a ``node``, allocated
    there (its ``pool``, the node's own by default), consuming ``consumed`` per device."""
    request = {
        "name": "gpu",
        "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "capacity": {"requests": {"memory": asks}},
        },
    }
    results = None
    if node is not None:
        results = [
            {
                "request": "gpu",
                "driver": "gpu.nvidia.com",
                "pool": pool or node,
                "device": device,
                "shareID": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{name}/{device}")),  # a UID
                "consumedCapacity": {"memory": amount},
            }
            for device, amount in consumed.items()
        ]
    return _resource_claim(name, request, results)


def hold_claim(pod: dict[str, Any], claim: str) -> dict[str, Any]:
    """``pod`` with one ResourceClaim (from a template), which is ``claim``."""
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim}]
    return pod


def claim_pod(name: str, claim: str) -> dict[str, Any]:
    """A pod whose one ResourceClaim (from a template) is ``claim``."""
    return hold_claim(make_pod(name, 0), claim)
