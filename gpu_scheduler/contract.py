"""The one place where the names other components and users rely on are spelled.

Node labels follow NVIDIA GPU Feature Discovery (names and units), so clusters that
already run GFD work with the extender unchanged. Project-owned keys use the prefix
``gpu-scheduler.io/``. Nothing else in the project re-spells a key: import from here
(and what a pod spec asks for from :mod:`gpu_scheduler.podspec`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpu_scheduler.jsondecode import decode_json
from gpu_scheduler.quantity import QuantityError, mib, parse_quantity, type_name
from gpu_scheduler.textclip import clip, clip_text

# --- resources ---------------------------------------------------------------------
RESOURCE_GPU = "nvidia.com/gpu"
#: A share of one GPU, by its memory: 1 unit = 1 GiB (gpu_scheduler/sharing.py). Served
#: by the agent's device plugin on nodes labelled LABEL_GPU_SHARING.
RESOURCE_GPU_MEMORY = "gpu-scheduler.io/gpu-memory"
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
LABEL_DRIVER_FULL = "nvidia.com/cuda.driver-version.full"
LABEL_RUNTIME_FULL = "nvidia.com/cuda.runtime-version.full"
LABEL_GPU_REPLICAS = "nvidia.com/gpu.replicas"  # > 1: time-slicing or MPS
LABEL_GPU_SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"  # none|time-slicing|mps
LABEL_GPU_MODE = "nvidia.com/gpu.mode"  # compute|graphics|unknown (PCI class)
LABEL_MPS_CAPABLE = "nvidia.com/mps.capable"
#: GFD writes this on every node it labels; the agent's ``--gfd-labels auto`` then
#: leaves GFD's keys to GFD.
LABEL_GFD_TIMESTAMP = "nvidia.com/gfd.timestamp"
# Older label some clusters still carry (MiB); read as a fallback only.
LABEL_GPU_MEMORY_LEGACY = "gpu.nvidia.com/memory"
#: GFD's product suffix for a time-sliced or MPS-shared GPU (not renamed).
SHARED_SUFFIX = "-SHARED"
#: In a product label, the part GFD's MIG single strategy adds (``…-MIG-1g.10gb``).
MIG_PART = "-MIG-"

#: The GPU Feature Discovery label keys the agent writes (unless GFD labels the node):
#: it may add, change or remove these and no others.
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
    LABEL_DRIVER_FULL,
    LABEL_RUNTIME_MAJOR,
    LABEL_RUNTIME_MINOR,
    LABEL_RUNTIME_FULL,
    LABEL_MIG_CAPABLE,
    LABEL_GPU_REPLICAS,
    LABEL_GPU_SHARING_STRATEGY,
    LABEL_GPU_MODE,
    LABEL_MPS_CAPABLE,
)

#: The project's own Node label: how many of the node's GPUs the agent reads unhealthy,
#: absent when none. The extender reads the per-GPU annotation; this label is there so
#: that a change of health is a Node label change, which kube-scheduler's queue reacts
#: to (a pod pending on a sick GPU is retried when it recovers), and so that
#: ``kubectl get nodes -l gpu-scheduler.io/gpus-unhealthy`` finds the sick nodes.
LABEL_GPUS_UNHEALTHY = "gpu-scheduler.io/gpus-unhealthy"
#: Set by the admin: the node's GPUs are shared by the agent's device plugin, which
#: then serves RESOURCE_GPU_MEMORY and RESOURCE_GPU both (NVIDIA's device plugin must
#: not run there). ``mps``: each share is held to its memory by MPS; ``time-slicing``:
#: shares are bookkeeping only. Absent: whole GPUs from NVIDIA's plugin.
LABEL_GPU_SHARING = "gpu-scheduler.io/gpu-sharing"
SHARING_MODES = ("mps", "time-slicing")
#: Environment variables the device plugin sets in a container given a share (which
#: GPU, its MPS limits and pipe): a pod asking a share may not set these itself (the
#: kubelet puts the pod's own env after the plugin's, and the runtime keeps the last).
SHARE_ENV = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
SHARE_ENV_PREFIXES = ("CUDA_MPS_", "GPU_SCHEDULER_")
#: Labels the agent writes whether or not GPU Feature Discovery labels the node.
AGENT_OWN_LABELS: tuple[str, ...] = (LABEL_GPUS_UNHEALTHY,)

# Well-known labels written by others and read by the extender.
LABEL_ZONE = "topology.kubernetes.io/zone"
#: Network-topology node labels, the tightest domain first: the levels along which the
#: ``group`` policy packs a placement group by default (extender ``groupLevels``).
#: NVIDIA's NVLink domain (GFD and the DRA driver write it on GB200-class systems);
#: GKE's sub-block, then block; AWS's network layers from the node's (3) up (1); zone.
LABEL_GPU_CLIQUE = "nvidia.com/gpu.clique"
TOPOLOGY_LEVELS: tuple[str, ...] = (
    LABEL_GPU_CLIQUE,
    "cloud.google.com/gce-topology-subblock",
    "cloud.google.com/gce-topology-block",
    "topology.k8s.aws/network-node-layer-3",
    "topology.k8s.aws/network-node-layer-2",
    "topology.k8s.aws/network-node-layer-1",
    LABEL_ZONE,
)
LABEL_EKS_CAPACITY_TYPE = "eks.amazonaws.com/capacityType"  # SPOT / ON_DEMAND
LABEL_KARPENTER_CAPACITY_TYPE = "karpenter.sh/capacity-type"  # spot / on-demand / reserved
LABEL_GKE_SPOT = "cloud.google.com/gke-spot"  # "true" on Spot VMs
LABEL_GKE_PREEMPTIBLE = "cloud.google.com/gke-preemptible"  # "true" on preemptible VMs
LABEL_AKS_PRIORITY = "kubernetes.azure.com/scalesetpriority"  # "spot" on spot pools

#: Each cloud's spot label and the one value that marks spot capacity, as the platform
#: writes it (exact, case included): EKS managed node groups, Karpenter (any cloud),
#: GKE Spot and preemptible VMs, AKS spot node pools. A node is spot when any of these
#: carries its value; it is on-demand when one of the keys is there with another value
#: or when none is there at all. This is exactly what required node affinity can say
#: (``NotIn`` on each key to forbid spot, one ``In`` term per key to require it), so
#: the webhook's affinity and the extender's filter refuse the same nodes.
SPOT_LABELS: tuple[tuple[str, str], ...] = (
    (LABEL_EKS_CAPACITY_TYPE, "SPOT"),
    (LABEL_KARPENTER_CAPACITY_TYPE, "spot"),
    (LABEL_GKE_SPOT, "true"),
    (LABEL_GKE_PREEMPTIBLE, "true"),
    (LABEL_AKS_PRIORITY, "spot"),
)
# Labels that mark a GPU node before our agent runs there (the agent DaemonSet's affinity).
LABEL_NFD_NVIDIA_PCI = "feature.node.kubernetes.io/pci-10de.present"
LABEL_EKS_ACCELERATOR = "k8s.amazonaws.com/accelerator"
LABEL_GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"  # every GKE GPU node
#: Karpenter (AWS provider) and EKS Auto Mode: the instance type's GPU maker, ``nvidia``.
LABEL_KARPENTER_GPU_MANUFACTURER = "karpenter.k8s.aws/instance-gpu-manufacturer"
LABEL_EKS_AUTO_GPU_MANUFACTURER = "eks.amazonaws.com/instance-gpu-manufacturer"
#: AKS GPU node pools (a reserved system label, ``nvidia``).
LABEL_AKS_ACCELERATOR = "kubernetes.azure.com/accelerator"
#: GKE's GPU time-sharing and MPS node pools: the strategy (``time-sharing``, ``mps``)
#: and how many containers share one GPU (its device plugin advertises that many
#: ``nvidia.com/gpu`` per GPU). No GFD runs there to write ``gpu.replicas``.
LABEL_GKE_GPU_SHARING_STRATEGY = "cloud.google.com/gke-gpu-sharing-strategy"
LABEL_GKE_MAX_SHARED_CLIENTS = "cloud.google.com/gke-max-shared-clients-per-gpu"

# --- project-owned keys ------------------------------------------------------------
PREFIX = "gpu-scheduler.io/"
# Pod annotations (the pod-facing knobs).
ANN_SKIP_MUTATION = "gpu-scheduler.io/skip-mutation"
ANN_MIN_GPU_MEMORY = "gpu-scheduler.io/min-gpu-memory"
ANN_GPU_PRODUCTS = "gpu-scheduler.io/gpu-products"
ANN_PLACEMENT = "gpu-scheduler.io/placement"
ANN_SPOT = "gpu-scheduler.io/spot"
ANN_GROUP = "gpu-scheduler.io/group"
#: The upstream gang field (Kubernetes 1.36+, ``GenericWorkload``): a pod joins a
#: PodGroup (scheduling.k8s.io/v1beta1) by naming it in ``spec.schedulingGroup``.
POD_GROUP_FIELD = ("schedulingGroup", "podGroupName")
#: Kueue's marks on the pods of its workloads (sigs.k8s.io/kueue): every pod of an
#: admitted workload carries the podset label; a plain-pod group names its group; with
#: topology-aware scheduling the pod names its Workload.
LABEL_KUEUE_PODSET = "kueue.x-k8s.io/podset"
LABEL_KUEUE_POD_GROUP = "kueue.x-k8s.io/pod-group-name"
ANN_KUEUE_WORKLOAD = "kueue.x-k8s.io/workload"
# Node annotations written by the agent.
ANN_GPUS = "gpu-scheduler.io/gpus"
#: The agent's heartbeat before it moved to Leases: a Node annotation refreshed every
#: few minutes (a Node write fanned out to every Node watcher). Nothing reads it any
#: more; the agent still owns the key, to remove it from its node (docs/install/README.md,
#: "Upgrade").
ANN_LEGACY_HEARTBEAT = "gpu-scheduler.io/agent-heartbeat"
#: What each GPU of a shared node has given out, as its kubelet says (PodResources):
#: JSON, GPU UUID -> pod UID -> units held, or "whole" (sharing.read_report).
ANN_GPU_SHARES = "gpu-scheduler.io/gpu-shares"
AGENT_ANNOTATIONS: tuple[str, ...] = (ANN_GPUS, ANN_LEGACY_HEARTBEAT, ANN_GPU_SHARES)
#: Keys of each GPU's entry in ANN_GPUS (a JSON array ordered by index) that the
#: extender reads: whether it is healthy, why not, its MIG devices.
GPU_UUID, GPU_HEALTHY, GPU_REASON = "uuid", "healthy", "reason"
GPU_XID, GPU_SINCE = "xid", "since"
GPU_MIG_ENABLED, GPU_MIG_DEVICES = "migEnabled", "migDevices"
GPU_MEMORY_MIB = "memoryMiB"
#: On a sharing node: the MiB of each GPU that no share is given (the agent's
#: ``--gpu-memory-reserve``); its units of gpu-memory are (memoryMiB - this) // 1 GiB.
GPU_RESERVED_MIB = "reservedMiB"
#: An ANN_GPUS value longer than this is not read (a node has at most a few dozen GPUs).
MAX_GPUS_ANNOTATION = 64 << 10

# The agent's heartbeat: one coordination.k8s.io/v1 Lease per node, named as the node,
# in the install's namespace, labelled LEASE_LABEL=LEASE_LABEL_VALUE, renewed by the
# agent (spec.renewTime) and owned by the agent's Pod, so that the garbage collector
# removes it when the pod goes. The extender watches these Leases only; a node with
# none is not agent-managed. The kubelet's own heartbeat moved to Leases for the same
# reason: a renewal reaches the one watcher that cares, not every watcher of Nodes.
LEASE_LABEL = "gpu-scheduler.io/heartbeat"
LEASE_LABEL_VALUE = "agent"
LEASE_SELECTOR = f"{LEASE_LABEL}={LEASE_LABEL_VALUE}"

# --- the GPU taint and toleration --------------------------------------------------
GPU_TOLERATION: dict[str, str] = {
    "key": RESOURCE_GPU,
    "operator": "Exists",
    "effect": "NoSchedule",
}

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def parse_mib(value: Any) -> int:
    """GPU memory as a user writes it: ``40Gi``/``80G``/``512Mi``, or a plain MiB integer.

    Raises :class:`QuantityError` for anything else (a negative size included).
    """
    if not isinstance(value, str):
        raise QuantityError(f"a memory size must be a string, not {type_name(value)}")
    text = value.strip()
    if text.isascii() and text.isdigit():
        if len(text) > 18:
            raise QuantityError(f"memory size {clip(text)} is beyond 2**63-1")
        return int(text)
    quantity = parse_quantity(text)
    if quantity < 0:
        raise QuantityError(f"memory must not be negative: {clip(value)}")
    return mib(quantity)


def capacity_type(labels: Mapping[str, Any]) -> str | None:
    """``spot`` when any cloud's spot label (:data:`SPOT_LABELS`) carries its spot
    value; ``on-demand`` when one of those keys is there with another value; None when
    the node carries none of them (the policies count that as on-demand)."""
    known = False
    for key, spot in SPOT_LABELS:
        value = labels.get(key)
        if value is None:
            continue
        if value == spot:
            return "spot"
        known = True
    return "on-demand" if known else None


def node_gpu_memory_mib(labels: Mapping[str, Any]) -> int | None:
    """MiB per GPU from ``nvidia.com/gpu.memory``; from the legacy label only where that
    one is absent. None when the label read is not an integer, as kube-scheduler's
    node affinity reads one for ``Gt``/``Lt`` (Go's ``strconv.ParseInt``: a label value
    can only be plain digits there, at most 2**63-1): so a pod's ``min-gpu-memory``
    written as node affinity admits exactly the nodes this admits."""
    key = LABEL_GPU_MEMORY if LABEL_GPU_MEMORY in labels else LABEL_GPU_MEMORY_LEGACY
    return label_int(labels.get(key))


def label_int(value: Any) -> int | None:
    """A label value as node affinity's ``Gt``/``Lt`` read it: digits within int64."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 63:
        number = int(value)
        return number if number < 1 << 63 else None
    return None


_NOT_IN_PRODUCT = re.compile(r"[^A-Za-z0-9_. \-]")
MAX_LABEL_VALUE = 63
#: apimachinery's label value: empty, or alphanumerics with -_. inside (IsValidLabelValue).
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def is_label_value(value: str) -> bool:
    """Whether ``value`` is a valid label value (at most 63 characters)."""
    return len(value) <= MAX_LABEL_VALUE and bool(_LABEL_VALUE.match(value))


#: apimachinery's DNS subdomain (IsDNS1123Subdomain), at most 253 characters.
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def is_label_key(key: str) -> bool:
    """Whether ``key`` is a qualified name, as label and taint keys are: an optional
    DNS-subdomain prefix and ``/``, then a non-empty name shaped like a label value."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
        return False
    return bool(name) and is_label_value(name)


def product_label_value(name: str, *suffix: str) -> str:
    """An NVML product name as GFD writes it into ``nvidia.com/gpu.product``.

    GFD's rule (k8s-device-plugin, ``internal/lm/resource.go``): in each part, every
    character other than ``A-Za-z0-9 - _ . space`` is deleted (not replaced), runs of
    spaces become one ``-``; the parts (the model, then e.g. ``MIG``, ``1g.10gb``,
    ``SHARED``) are joined with ``-``. Over 63 characters, only the model is cut (and
    its trailing ``-._`` trimmed), so the suffixes survive.
    """
    parts = ["-".join(_NOT_IN_PRODUCT.sub("", part).split()) for part in (name, *suffix)]
    model, rest = parts[0], [p for p in parts[1:] if p]
    tail = "".join(f"-{p}" for p in rest)
    room = MAX_LABEL_VALUE - len(tail)
    if len(model) > room:
        model = model[: max(room, 0)].rstrip("-._")
    return f"{model}{tail}" if model else tail.lstrip("-")


class GpuHealth:
    """What the agent's ANN_GPUS says of a node's GPUs, as the extender needs it: the
    units of ``nvidia.com/gpu`` its GPUs make (``total``) and those of the healthy ones
    (``healthy``; see :func:`gpu_health`), and each unhealthy GPU in words
    (``GPU-… (XID 79; …; since …)``)."""

    __slots__ = ("healthy", "total", "unhealthy")

    def __init__(self, healthy: int, total: int, unhealthy: tuple[str, ...]) -> None:
        self.healthy = healthy
        self.total = total
        self.unhealthy = unhealthy

    def usable(self, allocatable: int) -> int:
        """Of ``allocatable`` (what the device plugin advertises), the units a pod can
        be given: all of them when the device plugin already left the sick GPUs out
        (it advertises no more than the healthy ones); the healthy ones when it still
        counts every GPU; and when it counts more than the GPUs make (sharing that
        the labels do not say), its share of each sick GPU taken off."""
        healthy, total = self.healthy, self.total
        if allocatable <= healthy or total <= 0:
            return allocatable
        if allocatable > total:
            return max(0, allocatable - (total - healthy) * (allocatable // total))
        return healthy

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GpuHealth) and (self.healthy, self.total, self.unhealthy) == (
            other.healthy,
            other.total,
            other.unhealthy,
        )

    def __repr__(self) -> str:
        return f"GpuHealth({self.healthy}, {self.total}, {self.unhealthy!r})"


def gpu_health(value: Any, replicas: int = 1, mig_single: bool = False) -> GpuHealth | None:
    """The healthy units of ``nvidia.com/gpu`` on a node, from the agent's ANN_GPUS
    value; None when there is no such annotation or it cannot be read (then nothing
    is known, and nothing is held against the node).

    A healthy GPU outside MIG mode counts ``replicas`` units (time-slicing or MPS
    shares it that many ways); a healthy GPU in MIG mode counts its MIG devices under
    GFD's single strategy (``mig_single``: they are ``nvidia.com/gpu`` then) and none
    otherwise (under the mixed strategy they are other resources)."""
    if not isinstance(value, str) or not value or len(value) > MAX_GPUS_ANNOTATION:
        return None
    try:
        gpus = decode_json(value)
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        return None
    if not isinstance(gpus, list):
        return None
    healthy, total, unhealthy = 0, 0, []
    for gpu in gpus:
        if not isinstance(gpu, Mapping):
            return None
        mig = gpu.get(GPU_MIG_ENABLED) is True
        devices = gpu.get(GPU_MIG_DEVICES)
        if mig:
            units = len(devices) if isinstance(devices, list) and mig_single else 0
        else:
            units = max(1, replicas)
        total += units
        if gpu.get(GPU_HEALTHY) is not False:
            healthy += units
            continue
        words = [clip_text(str(gpu.get(GPU_UUID) or "unknown"), 64)]
        reason = clip_text(str(gpu.get(GPU_REASON) or ""), 120)
        xid = gpu.get(GPU_XID)
        details = [
            f"XID {xid}" if isinstance(xid, int) and f"XID {xid}" not in reason else "",
            reason,
            f"since {clip_text(str(gpu[GPU_SINCE]), 32)}" if gpu.get(GPU_SINCE) else "",
        ]
        details = [d for d in details if d]
        unhealthy.append(words[0] + (f" ({'; '.join(details)})" if details else ""))
    return GpuHealth(healthy, total, tuple(unhealthy))


def base_product(product: str) -> str:
    """A product label without GFD's ``-SHARED`` suffix: the GPU model itself."""
    return product[: -len(SHARED_SUFFIX)] if product.endswith(SHARED_SUFFIX) else product
