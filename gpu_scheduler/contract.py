"""The one place where the names other components and users rely on are spelled.

Node labels follow NVIDIA GPU Feature Discovery (names and units), so clusters that
already run GFD work with the extender unchanged. Project-owned keys use the prefix
``gpu-scheduler.io/``. Nothing else in the project re-spells a key or re-parses pod
resources: import from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from gpu_scheduler.quantity import QuantityError, parse_quantity

# --- resources ---------------------------------------------------------------------
RESOURCE_GPU = "nvidia.com/gpu"
SCHEDULER_NAME = "gpu-scheduler"
DEFAULT_SCHEDULER = "default-scheduler"

# --- node labels (GPU Feature Discovery names and units) ---------------------------
NVIDIA = "nvidia.com/"
LABEL_GPU_PRESENT = "nvidia.com/gpu.present"
LABEL_GPU_COUNT = "nvidia.com/gpu.count"
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB per GPU
LABEL_GPU_FAMILY = "nvidia.com/gpu.family"
LABEL_GPU_COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
LABEL_GPU_COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
LABEL_DRIVER_MAJOR = "nvidia.com/cuda.driver-version.major"
LABEL_DRIVER_MINOR = "nvidia.com/cuda.driver-version.minor"
LABEL_DRIVER_REVISION = "nvidia.com/cuda.driver-version.revision"
LABEL_RUNTIME_MAJOR = "nvidia.com/cuda.runtime-version.major"
LABEL_RUNTIME_MINOR = "nvidia.com/cuda.runtime-version.minor"
LABEL_MIG_CAPABLE = "nvidia.com/mig.capable"
# Older label some clusters still carry (MiB); read as a fallback only.
LABEL_GPU_MEMORY_LEGACY = "gpu.nvidia.com/memory"

#: Every label the agent owns: it may add, change or remove these and no others.
AGENT_LABELS: tuple[str, ...] = (
    LABEL_GPU_PRESENT,
    LABEL_GPU_COUNT,
    LABEL_GPU_PRODUCT,
    LABEL_GPU_MEMORY,
    LABEL_GPU_FAMILY,
    LABEL_GPU_COMPUTE_MAJOR,
    LABEL_GPU_COMPUTE_MINOR,
    LABEL_DRIVER_MAJOR,
    LABEL_DRIVER_MINOR,
    LABEL_DRIVER_REVISION,
    LABEL_RUNTIME_MAJOR,
    LABEL_RUNTIME_MINOR,
    LABEL_MIG_CAPABLE,
)

# Well-known labels written by others and read by the extender.
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_EKS_CAPACITY_TYPE = "eks.amazonaws.com/capacityType"  # SPOT / ON_DEMAND
LABEL_KARPENTER_CAPACITY_TYPE = "karpenter.sh/capacity-type"  # spot / on-demand
# Labels that mark a GPU node before our agent runs there (the agent DaemonSet's affinity).
LABEL_NFD_NVIDIA_PCI = "feature.node.kubernetes.io/pci-10de.present"
LABEL_EKS_ACCELERATOR = "k8s.amazonaws.com/accelerator"

# --- project-owned keys ------------------------------------------------------------
PREFIX = "gpu-scheduler.io/"
# Pod annotations (the pod-facing knobs).
ANN_SKIP_MUTATION = "gpu-scheduler.io/skip-mutation"
ANN_MIN_GPU_MEMORY = "gpu-scheduler.io/min-gpu-memory"
ANN_GPU_PRODUCTS = "gpu-scheduler.io/gpu-products"
ANN_PLACEMENT = "gpu-scheduler.io/placement"
ANN_SPOT = "gpu-scheduler.io/spot"
ANN_GROUP = "gpu-scheduler.io/group"
# Node annotations written by the agent.
ANN_GPUS = "gpu-scheduler.io/gpus"
ANN_HEARTBEAT = "gpu-scheduler.io/agent-heartbeat"
AGENT_ANNOTATIONS: tuple[str, ...] = (ANN_GPUS, ANN_HEARTBEAT)

# --- the GPU taint and toleration --------------------------------------------------
GPU_TOLERATION: dict[str, str] = {
    "key": RESOURCE_GPU,
    "operator": "Exists",
    "effect": "NoSchedule",
}

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def container_request(container: Mapping[str, Any], resource: str) -> Decimal:
    """A container's request for ``resource``; a limit implies the request.

    The API server defaults a missing request to the limit, and extended resources
    cannot be overcommitted, so ``limits`` alone counts exactly like ``requests``.
    Raises :class:`QuantityError` for a value that is not a quantity.
    """
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    value = requests.get(resource)
    if value is None:
        value = (resources.get("limits") or {}).get(resource)
    if value is None:
        return Decimal(0)
    return parse_quantity(value)


def pod_request(spec: Mapping[str, Any], resource: str) -> Decimal:
    """A pod's effective request for one resource, as kube-scheduler computes it.

    ``max(sum(containers) + sum(sidecars), max over init containers of (own request +
    sidecars started before it))`` plus ``overhead``, following
    ``k8s.io/component-helpers/resource.PodRequests``: restartable (sidecar) init
    containers keep running beside the app containers, so they add to the sum; a plain
    init container runs alone, beside only the sidecars started before it.
    """
    total = sum(
        (container_request(c, resource) for c in _containers(spec.get("containers"))),
        Decimal(0),
    )
    sidecars = Decimal(0)
    init_peak = Decimal(0)
    for init in _containers(spec.get("initContainers")):
        own = container_request(init, resource)
        if init.get("restartPolicy") == "Always":
            total += own
            sidecars += own
            during = sidecars
        else:
            during = own + sidecars
        init_peak = max(init_peak, during)
    total = max(total, init_peak)
    overhead = (spec.get("overhead") or {}).get(resource)
    if overhead is not None:
        total += parse_quantity(overhead)
    return total


def pod_gpu_request(spec: Mapping[str, Any] | None) -> int:
    """How many whole GPUs (``nvidia.com/gpu``) a pod spec requests.

    ``spec`` is the pod's ``spec`` in its JSON form. Raises :class:`QuantityError` for
    a malformed or fractional quantity (the API server rejects those too).
    """
    if not spec:
        return 0
    value = pod_request(spec, RESOURCE_GPU)
    if value != value.to_integral_value():
        raise QuantityError(f"{RESOURCE_GPU} must be a whole number, got {value}")
    return int(value)


def _containers(value: Any) -> Iterable[Mapping[str, Any]]:
    if not value:
        return ()
    if not isinstance(value, list):
        raise QuantityError("containers must be a list")
    return [c for c in value if isinstance(c, Mapping)]


def parse_mib(value: str) -> int:
    """GPU memory as a user writes it: ``40Gi``/``80G``/``512Mi``, or a plain MiB integer."""
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    quantity = parse_quantity(text)
    if quantity < 0:
        raise QuantityError(f"memory must not be negative: {value!r}")
    return int(quantity / (1 << 20))


def capacity_type(labels: Mapping[str, str]) -> str | None:
    """``spot`` or ``on-demand`` from the well-known capacity-type labels, else None."""
    eks = labels.get(LABEL_EKS_CAPACITY_TYPE)
    if eks:
        return "spot" if eks.upper() == "SPOT" else "on-demand"
    karpenter = labels.get(LABEL_KARPENTER_CAPACITY_TYPE)
    if karpenter:
        return "spot" if karpenter.lower() == "spot" else "on-demand"
    return None


def node_gpu_memory_mib(labels: Mapping[str, str]) -> int | None:
    """MiB per GPU from ``nvidia.com/gpu.memory``, falling back to the legacy label."""
    for key in (LABEL_GPU_MEMORY, LABEL_GPU_MEMORY_LEGACY):
        value = labels.get(key)
        if value is not None and value.isdigit():
            return int(value)
    return None


def product_label_value(name: str) -> str:
    """An NVML product name as GFD writes it into ``nvidia.com/gpu.product``."""
    return "-".join(name.strip().split())
