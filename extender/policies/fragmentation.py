"""fragmentation: place a GPU pod where it fragments the cluster least.

After FGD (Weng et al., "Beware of Fragmentation", USENIX ATC'23), adapted to whole
GPUs and to CPU and memory. A node's free GPUs are *fragmented* for a task shape when
that shape cannot run there: too few free GPUs, too little free CPU or memory beside
them, or a product the shape is not allowed on. Weighted by how common each shape is
in the cluster's workload (the cluster cache's mix of bound GPU pods,
:mod:`extender.workload`), a node's expected fragmentation is

    F(node) = free GPUs x sum over shapes s of share(s) x [s does not fit the node]

and a node scores ``F(before) - F(after placing the pod)``: the smaller the increase in
fragmentation (or the larger the decrease), the better. A pod that takes the last free
GPUs of a node leaves nothing to fragment; one that leaves 3 GPUs where the common
shapes need 4 or 8, or that takes the CPU the remaining GPUs' users need, scores low.
Restricted shapes (``gpu-scheduler.io/gpu-products``) make a scarce product's GPUs
fragmented for everyone else, so unrestricted pods are steered off it as demand
restricted to it grows.

Free CPU and memory count what the bound GPU pods request (the pods the cache keeps);
a node with unknown allocatable CPU or memory is not limited by it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from extender.model import NodeFacts, PodFacts
from extender.policies.base import ClusterView
from extender.workload import MixEntry

UNLIMITED = 1 << 62


@dataclass(frozen=True, slots=True)
class _State:
    gpus: int
    cpu_milli: int
    ram_mib: int
    mix: tuple[MixEntry, ...]


class FragmentationPolicy:
    name: ClassVar[str] = "fragmentation"

    def pre_filter(self, pod: PodFacts, view: ClusterView) -> None:
        return None

    def pre_score(self, pod: PodFacts, view: ClusterView) -> _State | None:
        if pod.gpus == 0 or not view.knows_usage or not view.mix:
            return None
        return _State(pod.gpus, pod.cpu_milli, pod.ram_mib, view.mix)

    def score_all(
        self, state: _State, nodes: Sequence[NodeFacts], view: ClusterView
    ) -> list[float]:
        # Per product, the shapes allowed on it: (gpus, cpu, memory, share).
        allowed: dict[str | None, list[tuple[int, int, int, float]]] = {}
        memo: dict[tuple[int, int, int, str | None], float] = {}
        used, cpu_used, ram_used = view.used.get, view.cpu_used.get, view.ram_used.get

        def fragmented(free: int, cpu: int, ram: int, model: str | None) -> float:
            key = (free, cpu, ram, model)
            value = memo.get(key)
            if value is None:
                shapes = allowed.get(model)
                if shapes is None:
                    shapes = allowed[model] = [
                        (e.shape.gpus, e.shape.cpu_milli, e.shape.ram_mib, e.share)
                        for e in state.mix
                        if e.shape.products is None or model in e.shape.products
                    ]
                fits = sum(
                    share for g, c, r, share in shapes if g <= free and c <= cpu and r <= ram
                )
                value = memo[key] = free * (1.0 - fits) if free > 0 else 0.0
            return value

        scores = []
        want, cpu_want, ram_want = state.gpus, state.cpu_milli, state.ram_mib
        for node in nodes:
            name = node.name
            free = node.allocatable - used(name, 0)
            cpu = UNLIMITED if node.cpu_milli is None else node.cpu_milli - cpu_used(name, 0)
            ram = UNLIMITED if node.ram_mib is None else node.ram_mib - ram_used(name, 0)
            before = fragmented(free, cpu, ram, node.model)
            after = fragmented(free - want, cpu - cpu_want, ram - ram_want, node.model)
            scores.append(before - after)
        return scores
