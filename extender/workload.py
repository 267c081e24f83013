"""The workload mix: the shapes of the GPU pods the cluster runs, in compact form.

A *shape* is what decides where a pod can go: whole GPUs, CPU and memory (rounded up
to a coarse grid, so that the mix stays small and a shape never claims to fit where
its pods do not), and the GPU products it is restricted to. The cluster cache counts
the shapes of the bound GPU pods as they come and go; :func:`workload_mix` keeps the
shapes that weigh most (at most ``MAX_SHAPES``, covering ``COVERAGE`` of the weight,
as the FGD paper's simulator keeps the popular task classes) with their shares.

A shape's weight: the FGD paper weighs a task class by its count of tasks. Here only
restricted shapes do (what protects a scarce product is how many pods can run nowhere
else). The unrestricted shapes share the rest in proportion to their pods x GPUs^a,
where ``a`` is twice the share of the GPUs asked that multi-GPU pods ask for (at most
1): where multi-GPU jobs take half the GPUs, one 8-GPU pod weighs as eight 1-GPU pods;
where they take 7% (the openb default and gpuspec files), about as 1.4. Counted by
pods, a cluster whose GPUs go mostly to multi-GPU jobs but whose pods are mostly
1-GPU told the fragmentation score that whole nodes hardly mattered: it spent them on
small pods and turned away its first 8-GPU pod early (held-out multigpu50: at 75.5%
of the GPUs allocated, against 90.0% now). Weighing every workload by GPUs lost the
model-restricted ones instead (gpuspec20, seed 44: 92.0 against 98.4% allocated at
100% arrived), as did a cap of 32 shapes, which on those workloads of 200-300 shapes
left half the restricted pods out of the mix (docs/BENCHMARKS.md, "The mix, weighed").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

#: At most this many shapes are kept, and only as many as cover this share of the
#: weight. The model-restricted openb variants hold 230-290 shapes, of which 73-102
#: cover 95% (a cap of 32 kept half their restricted pods).
MAX_SHAPES = 128
COVERAGE = 0.95
#: Weights are ordered, and their coverage compared, to this many decimals: a float
#: sum's last bits depend on the order it is taken in, which the plugins (Go, over a
#: map) do not share, and a mix whose weights reach COVERAGE exactly kept one shape
#: more on one path than on the other.
DECIMALS = 12


class TaskShape(NamedTuple):
    gpus: int
    cpu_milli: int
    ram_mib: int
    products: tuple[str, ...] | None  # None: any GPU product


class MixEntry(NamedTuple):
    shape: TaskShape
    share: float  # of the weight, over the kept shapes (they sum to 1)


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


def _order(item: tuple[TaskShape, float]) -> tuple[float, int, int, int, tuple[str, ...]]:
    shape, weight = item  # heaviest first; ties in a fixed order
    return (-round(weight, DECIMALS), shape.gpus, shape.cpu_milli, shape.ram_mib,
            shape.products or ())  # fmt: skip


def _weights(counts: Mapping[TaskShape, int]) -> dict[TaskShape, float]:
    """Each shape's weight (they sum to 1): a restricted shape's share of the pods; the
    unrestricted shapes split the rest by pods x GPUs^a (the module's docstring)."""
    live = {shape: count for shape, count in counts.items() if count > 0}
    pods = sum(live.values())
    if not pods:
        return {}
    asked = sum(count * max(shape.gpus, 1) for shape, count in live.items())
    multi = sum(count * shape.gpus for shape, count in live.items() if shape.gpus > 1)
    power = min(1.0, 2.0 * multi / asked)
    grown = {
        shape: count * max(shape.gpus, 1) ** power
        for shape, count in live.items()
        if shape.products is None
    }
    rest = sum(live[shape] for shape in grown) / pods / (sum(grown.values()) or 1.0)
    return {
        shape: grown[shape] * rest if shape in grown else count / pods
        for shape, count in live.items()
    }


def workload_mix(counts: Mapping[TaskShape, int]) -> tuple[MixEntry, ...]:
    """The shapes that weigh most, with their share of the kept weight, heaviest
    first."""
    weights = _weights(counts)
    total = sum(weights.values())
    if total <= 0:
        return ()
    kept: list[tuple[TaskShape, float]] = []
    covered = 0.0
    enough = round(COVERAGE * total, DECIMALS)
    for shape, weight in sorted(weights.items(), key=_order):
        kept.append((shape, weight))
        covered += weight
        if len(kept) >= MAX_SHAPES or round(covered, DECIMALS) >= enough:
            break
    return tuple(MixEntry(shape, weight / covered) for shape, weight in kept)


#: The mix is worked out again once the pods bound and gone since the last time reach
#: this share of the pods counted now, or a shape came or went.
REFRESH_SHARE = 0.01


class ShapeCounts:
    """The cluster cache's count of bound GPU pods by shape, and their mix.

    :meth:`mix` answers the same tuple until the counts have moved by
    :data:`REFRESH_SHARE` of the pods or a shape appeared or disappeared: between
    those, no shape's share of the pods can move by more than about that much, and the
    fragmentation policy keeps its tables for a mix object it has seen (at 100 bindings
    a second on a cluster of 10,000 GPU pods, one new mix a second instead of 100)."""

    __slots__ = ("_counts", "_mix", "_moved", "_pods")

    def __init__(self) -> None:
        self._counts: dict[TaskShape, int] = {}
        self._mix: tuple[MixEntry, ...] | None = None
        self._moved = 0  # pods bound or gone since the mix was worked out
        self._pods = 0

    def add(self, shape: TaskShape, delta: int) -> None:
        count = self._counts.get(shape, 0) + delta
        if count > 0:
            self._counts[shape] = count
        else:
            self._counts.pop(shape, None)
        if count <= 0 or count == delta:  # a shape gone, or a new one
            self._mix = None
        self._pods += delta
        self._moved += abs(delta)

    def mix(self) -> tuple[MixEntry, ...]:
        mix = self._mix
        if mix is None or self._moved >= REFRESH_SHARE * max(self._pods, 1):
            mix = self._mix = workload_mix(self._counts)
            self._moved = 0
        return mix


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
