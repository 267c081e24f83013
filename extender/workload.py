"""The workload mix: the shapes of the GPU pods the cluster runs, in compact form.

A *shape* is what decides where a pod can go: whole GPUs, CPU and memory (rounded up
to a coarse grid, so that the mix stays small and a shape never claims to fit where
its pods do not), and the GPU products it is restricted to. The cluster cache counts
the shapes of the bound GPU pods as they come and go; :func:`workload_mix` keeps the
most common ones (at most ``MAX_SHAPES``, covering ``COVERAGE`` of the pods, as the
FGD paper's simulator keeps the popular task classes) with their frequencies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

#: At most this many shapes are kept, and only as many as cover this share of pods.
MAX_SHAPES = 32
COVERAGE = 0.95


class TaskShape(NamedTuple):
    gpus: int
    cpu_milli: int
    ram_mib: int
    products: tuple[str, ...] | None  # None: any GPU product


class MixEntry(NamedTuple):
    shape: TaskShape
    share: float  # of the GPU pods, over the kept shapes (they sum to 1)


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def task_shape(
    gpus: int, cpu_milli: int, ram_mib: int, products: tuple[str, ...] | None
) -> TaskShape:
    """The shape of a GPU pod: CPU rounded up to whole cores (4 cores above 16),
    memory to 4 GiB (16 GiB above 64 GiB)."""
    cpu = _round_up(cpu_milli, 1000 if cpu_milli <= 16000 else 4000)
    ram = _round_up(ram_mib, 4096 if ram_mib <= 65536 else 16384)
    return TaskShape(gpus, cpu, ram, products)


def _order(item: tuple[TaskShape, int]) -> tuple[int, int, int, int, tuple[str, ...]]:
    shape, count = item  # most common first; ties in a fixed order
    return (-count, shape.gpus, shape.cpu_milli, shape.ram_mib, shape.products or ())


def workload_mix(counts: Mapping[TaskShape, int]) -> tuple[MixEntry, ...]:
    """The most common shapes, with their share among them, most common first."""
    total = sum(counts.values())
    if total <= 0:
        return ()
    kept: list[tuple[TaskShape, int]] = []
    covered = 0
    for shape, count in sorted(counts.items(), key=_order):
        if count <= 0:
            continue
        kept.append((shape, count))
        covered += count
        if len(kept) >= MAX_SHAPES or covered >= COVERAGE * total:
            break
    return tuple(MixEntry(shape, count / covered) for shape, count in kept)


def product_pressure(
    demand: Mapping[str, float], total_demand: float, capacity: Mapping[str, int]
) -> dict[str, float]:
    """Per GPU product: the share of GPU demand that can only run on it, over its share
    of the cluster's GPUs. Near 1 or above: pods restricted to this product need about
    all of it. 0: nobody is restricted to it. Empty without demand."""
    total_capacity = sum(capacity.values())
    if not total_demand or not total_capacity:
        return {}
    return {
        product: (demand.get(product, 0.0) / total_demand) / (amount / total_capacity)
        for product, amount in capacity.items()
        if amount > 0
    }
