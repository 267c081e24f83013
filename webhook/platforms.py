"""Where each platform labels a node's GPU model and memory: the label maps the
webhook's node affinity can be written against (``nodeAffinity.platform``).

Product names on the left are GFD's ``nvidia.com/gpu.product`` values (the NVML
device name, sanitised: k8s-device-plugin ``internal/lm/resource.go``), which is what
``gpu-scheduler.io/gpu-products`` names. The tables cover the data-center GPUs each
platform offers; ``nodeAffinity.productValues`` in the webhook's config adds or
overrides entries for others.

* ``gfd`` (default): NVIDIA GPU Feature Discovery's labels, the ones the extender
  reads: ``nvidia.com/gpu.product``, ``nvidia.com/gpu.memory`` (MiB per GPU) and the
  legacy ``gpu.nvidia.com/memory`` where that is absent. Exactly the extender's rule.
* ``gke``: ``cloud.google.com/gke-accelerator``, which GKE sets on every GPU node from
  its node pool's accelerator type (cloud.google.com/kubernetes-engine/docs/how-to/gpus,
  "Consuming multiple GPU types"; the values from .../how-to/autopilot-gpus and
  cloud.google.com/compute/docs/gpus). GKE has no GPU-memory label, so
  ``min-gpu-memory`` lists the accelerators whose memory, as Google states it in
  decimal GB, is at least that much.
* ``karpenter-aws``: Karpenter's ``karpenter.k8s.aws/instance-gpu-name`` (the EC2
  GPU name, lower-cased) and ``karpenter.k8s.aws/instance-gpu-memory`` (MiB per GPU)
  (karpenter.sh/docs/concepts/scheduling, well-known labels; karpenter-provider-aws
  pkg/providers/instancetype/types.go). Both A100 sizes are ``a100``: a pod that
  needs the 80 GB one says so with ``min-gpu-memory`` too.

A platform label is known before the node boots (node pool, NodePool requirements),
which is what autoscalers need; GFD's labels arrive only once GFD runs on the node
(README, "Autoscalers and other schedulers").
"""

from __future__ import annotations

from gpu_scheduler import contract
from webhook.affinity import LabelMap

GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
KARPENTER_GPU_NAME = "karpenter.k8s.aws/instance-gpu-name"
KARPENTER_GPU_MEMORY = "karpenter.k8s.aws/instance-gpu-memory"

_H100_SXM = "NVIDIA-H100-80GB-HBM3"

#: GFD product -> gke-accelerator values.
GKE_PRODUCTS: dict[str, tuple[str, ...]] = {
    "NVIDIA-GB200": ("nvidia-gb200",),
    "NVIDIA-B200": ("nvidia-b200",),
    "NVIDIA-H200": ("nvidia-h200-141gb",),
    _H100_SXM: ("nvidia-h100-80gb", "nvidia-h100-mega-80gb"),  # A3 High and A3 Mega
    "NVIDIA-A100-SXM4-80GB": ("nvidia-a100-80gb",),
    "NVIDIA-A100-SXM4-40GB": ("nvidia-tesla-a100",),
    "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition": ("nvidia-rtx-pro-6000",),
    "NVIDIA-L4": ("nvidia-l4",),
    "Tesla-T4": ("nvidia-tesla-t4",),
    "Tesla-V100-SXM2-16GB": ("nvidia-tesla-v100",),
    "Tesla-P100-PCIE-16GB": ("nvidia-tesla-p100",),
    "Tesla-P4": ("nvidia-tesla-p4",),
}

#: gke-accelerator -> memory per GPU in MiB, from Google's decimal GB (80 GB = 76293
#: MiB: what a pod asking "80G" means; GFD reports 81559 MiB for the same H100).
GKE_MEMORY_MIB: dict[str, int] = {
    value: gb * 10**9 // 2**20
    for value, gb in (
        ("nvidia-gb200", 186),
        ("nvidia-b200", 180),
        ("nvidia-h200-141gb", 141),
        ("nvidia-h100-80gb", 80),
        ("nvidia-h100-mega-80gb", 80),
        ("nvidia-a100-80gb", 80),
        ("nvidia-tesla-a100", 40),
        ("nvidia-rtx-pro-6000", 96),
        ("nvidia-l4", 24),
        ("nvidia-tesla-t4", 16),
        ("nvidia-tesla-v100", 16),
        ("nvidia-tesla-p100", 16),
        ("nvidia-tesla-p4", 8),
    )
}

#: GFD product -> Karpenter's instance-gpu-name values.
KARPENTER_PRODUCTS: dict[str, tuple[str, ...]] = {
    "NVIDIA-B200": ("b200",),
    "NVIDIA-H200": ("h200",),
    _H100_SXM: ("h100",),
    "NVIDIA-A100-SXM4-80GB": ("a100",),
    "NVIDIA-A100-SXM4-40GB": ("a100",),
    "NVIDIA-L40S": ("l40s",),
    "NVIDIA-A10G": ("a10g",),
    "NVIDIA-L4": ("l4",),
    "Tesla-T4": ("t4",),
    "Tesla-V100-SXM2-16GB": ("v100",),
    "Tesla-V100-SXM2-32GB": ("v100",),
    "Tesla-K80": ("k80",),
    "Tesla-M60": ("m60",),
}

PLATFORMS = ("gfd", "gke", "karpenter-aws")


def label_map(platform: str, extra: dict[str, tuple[str, ...]] | None = None) -> LabelMap:
    """The label map of ``platform``, with ``extra`` product values added or replaced."""
    if platform == "gfd":
        memory = (contract.LABEL_GPU_MEMORY, contract.LABEL_GPU_MEMORY_LEGACY)
        if extra:
            raise ValueError("productValues apply to the gke and karpenter-aws maps only")
        return LabelMap("gfd", contract.LABEL_GPU_PRODUCT, None, memory)
    if platform == "gke":
        return LabelMap(
            "gke", GKE_ACCELERATOR, {**GKE_PRODUCTS, **(extra or {})}, (), GKE_MEMORY_MIB
        )
    if platform == "karpenter-aws":
        products = {**KARPENTER_PRODUCTS, **(extra or {})}
        return LabelMap("karpenter-aws", KARPENTER_GPU_NAME, products, (KARPENTER_GPU_MEMORY,))
    raise ValueError(f"platform must be one of {PLATFORMS}, got {platform!r}")
