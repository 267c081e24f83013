"""Inventory → node labels, annotations and capacity. Pure: no I/O, no clock.

Label names and units are GPU Feature Discovery's (see :mod:`gpu_scheduler.contract`).

Mixed GPU models on one node. GFD assumes a node's GPUs are all one model. We do not:
the descriptive labels describe the node's *least* GPU, so that they never promise
more than every GPU delivers, whichever GPU the device plugin hands a pod:

- ``gpu.memory`` is the smallest total memory of any GPU;
- ``gpu.compute.major|minor`` and ``gpu.family`` are the lowest compute capability
  of any GPU;
- ``gpu.product`` is the model of the GPU with the least memory (ties: the lower
  compute capability, then the most common model, then the name), so a pod asking
  for the bigger model is not sent to a node that may give it the smaller one;
- ``gpu.count`` counts every GPU; ``mig.capable`` is true if any GPU is.

The full truth per GPU is in the ``gpu-scheduler.io/gpus`` annotation (JSON).

Where a single model is involved the values are GFD's for the same hardware (GFD v0.17,
``internal/lm/``): the product name sanitised by deletion (``contract.product_label_value``),
the family map (10.x and 12.x are ``blackwell``; 11.x ``undefined``), the ``.full``
version labels, ``gpu.mode`` from the PCI class, and the sharing labels as GFD writes
them where no sharing is configured (``gpu.replicas=1``, ``gpu.sharing-strategy=none``,
``mps.capable=false``; ``gpu.replicas=0`` when every GPU is in MIG mode, as GFD does for
MIG-enabled GPUs). Time-slicing and MPS are the device plugin's configuration, which
the agent cannot see: on such nodes GFD's labels are the truth (``--gfd-labels auto``).

Capacity ``nvidia.com/gpu`` counts the GPUs a pod can be given as a whole GPU: healthy
and not in MIG mode (a MIG-enabled GPU runs work only in its MIG instances, which the
NVIDIA device plugin advertises under their own resource names).

A node without GPUs (NVML answered, and found none): ``nvidia.com/gpu.present=false``,
every other label the agent owns removed, capacity ``0``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from agent.inventory import DRIVER_VERSION, MAJOR_MINOR, Gpu, Inventory
from gpu_scheduler import contract

MAX_LABEL_VALUE = contract.MAX_LABEL_VALUE
#: PCI classes (``/sys/bus/pci/devices/*/class``) and the ``gpu.mode`` GFD gives them.
PCI_MODES = {"0x030000": "graphics", "0x030200": "compute"}


@dataclass(frozen=True, slots=True)
class Desired:
    """What the node should carry; ``capacity`` maps a resource name to a quantity."""

    labels: dict[str, str]
    annotations: dict[str, str]
    capacity: dict[str, str]

    def as_json(self) -> dict[str, Any]:
        return {
            "labels": dict(sorted(self.labels.items())),
            "annotations": dict(sorted(self.annotations.items())),
            "capacity": dict(sorted(self.capacity.items())),
        }


def family(major: int, minor: int) -> str:
    """The architecture family of a compute capability, as GFD names it."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ada-lovelace" if minor >= 9 else "ampere"
    if major in (10, 12):  # 11.x (Jetson Thor) is "undefined" in GFD
        return "blackwell"
    return {
        1: "tesla",
        2: "fermi",
        3: "kepler",
        5: "maxwell",
        6: "pascal",
        9: "hopper",
    }.get(major, "undefined")


def label_value(text: str) -> str:
    """A product name as GFD writes it (characters outside ``A-Za-z0-9 -_.`` deleted,
    whitespace runs ``-``, at most 63 characters), then trimmed so that it starts and
    ends alphanumeric as a label value must."""
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", contract.product_label_value(text))


def gpu_mode(gpus: tuple[Gpu, ...]) -> str:
    """``compute`` or ``graphics`` when every GPU has that PCI class; else ``unknown``."""
    modes = {PCI_MODES.get(g.pci_class, "unknown") for g in gpus}
    return modes.pop() if len(modes) == 1 else "unknown"


def allocatable_gpus(inventory: Inventory) -> int:
    """GPUs a pod can be given whole: healthy and not in MIG mode."""
    return sum(1 for g in inventory.gpus if g.healthy and not g.mig_enabled)


def least_gpu(gpus: tuple[Gpu, ...]) -> Gpu:
    """The GPU whose model the product label names (see the module's rule)."""
    known = [g for g in gpus if g.memory_mib > 0] or list(gpus)
    models = Counter(g.name for g in known)
    return min(
        known,
        key=lambda g: (g.memory_mib, g.compute or (999, 0), -models[g.name], g.name),
    )


def desired_state(
    inventory: Inventory, *, manage_capacity: bool = True, reserve_mib: int = 0
) -> Desired:
    """``reserve_mib``: on a sharing node, the MiB of each GPU no share is given,
    published per GPU in ANN_GPUS (``contract.GPU_RESERVED_MIB``) so that the extender
    counts the units the device plugin advertises."""
    gpus = inventory.gpus
    capacity = {contract.RESOURCE_GPU: str(allocatable_gpus(inventory))} if manage_capacity else {}
    annotations = {contract.ANN_GPUS: gpus_annotation(inventory, reserve_mib)}
    if not gpus:
        return Desired({contract.LABEL_GPU_PRESENT: "false"}, annotations, capacity)

    labels: dict[str, str] = {
        contract.LABEL_GPU_PRESENT: "true",
        contract.LABEL_GPU_COUNT: str(len(gpus)),
        contract.LABEL_MIG_CAPABLE: "true" if any(g.mig_capable for g in gpus) else "false",
        contract.LABEL_GPU_REPLICAS: "0" if all(g.mig_enabled for g in gpus) else "1",
        contract.LABEL_GPU_SHARING_STRATEGY: "none",
        contract.LABEL_MPS_CAPABLE: "false",
        contract.LABEL_GPU_MODE: gpu_mode(gpus),
    }
    product = label_value(least_gpu(gpus).name)
    if product and product != "unknown":
        labels[contract.LABEL_GPU_PRODUCT] = product
    memories = [g.memory_mib for g in gpus if g.memory_mib > 0]
    if memories:
        labels[contract.LABEL_GPU_MEMORY] = str(min(memories))
    computes = [c for c in (g.compute for g in gpus) if c is not None and c[0] > 0]
    if computes:
        major, minor = min(computes)
        labels[contract.LABEL_GPU_FAMILY] = family(major, minor)
        labels[contract.LABEL_GPU_COMPUTE_MAJOR] = str(major)
        labels[contract.LABEL_GPU_COMPUTE_MINOR] = str(minor)
    labels.update(version_labels(inventory))
    sick = len(gpus) - len(inventory.healthy)
    if sick:
        labels[contract.LABEL_GPUS_UNHEALTHY] = str(sick)
    valid = {k: v for k, v in labels.items() if contract.is_label_value(v)}
    return Desired(valid, annotations, capacity)


def version_labels(inventory: Inventory) -> dict[str, str]:
    """Driver (``550.54.15``) and CUDA driver API (``12.4``) version labels."""
    labels: dict[str, str] = {}
    if DRIVER_VERSION.match(inventory.driver_version):
        parts = inventory.driver_version.split(".")
        labels[contract.LABEL_DRIVER_MAJOR] = parts[0]
        labels[contract.LABEL_DRIVER_MINOR] = parts[1]
        if len(parts) > 2:
            labels[contract.LABEL_DRIVER_REVISION] = parts[2]
        labels[contract.LABEL_DRIVER_FULL] = inventory.driver_version
    cuda = MAJOR_MINOR.match(inventory.cuda_driver_version)
    if cuda:
        labels[contract.LABEL_RUNTIME_MAJOR] = cuda.group(1)
        labels[contract.LABEL_RUNTIME_MINOR] = cuda.group(2)
        labels[contract.LABEL_RUNTIME_FULL] = f"{cuda.group(1)}.{cuda.group(2)}"
    return labels


def gpus_annotation(inventory: Inventory, reserve_mib: int = 0) -> str:
    """Per-GPU detail, compact JSON ordered by index (stable, so unchanged GPUs give an
    unchanged annotation and no write)."""
    return json.dumps(
        [_gpu_json(g, reserve_mib) for g in sorted(inventory.gpus, key=lambda g: g.index)],
        separators=(",", ":"),
        sort_keys=True,
    )


def _gpu_json(gpu: Gpu, reserve_mib: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        contract.GPU_MEMORY_MIB: gpu.memory_mib,
        "computeCapability": gpu.compute_capability,
        "migCapable": gpu.mig_capable,
        "migEnabled": gpu.mig_enabled,
        "healthy": gpu.healthy,
    }
    if gpu.pci_class:
        out["pciClass"] = gpu.pci_class
    if reserve_mib > 0 and not gpu.mig_enabled:
        out[contract.GPU_RESERVED_MIB] = reserve_mib
    if gpu.mig_enabled:
        out["migDevices"] = [
            {"uuid": m.uuid, "name": m.name, "memoryMiB": m.memory_mib} for m in gpu.mig_devices
        ]
    if not gpu.healthy:
        if gpu.reason:
            out[contract.GPU_REASON] = gpu.reason
        if gpu.xid is not None:
            out[contract.GPU_XID] = gpu.xid
        if gpu.since:
            out[contract.GPU_SINCE] = gpu.since
    return out
