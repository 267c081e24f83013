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

Free GPUs, CPU and memory are the view's :data:`~extender.view.FreeState` per node,
which the cache keeps current as pods come and go.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from extender.model import NodeFacts, PodFacts
from extender.policies.base import ClusterView, Policy
from extender.view import FreeState, free_state
from extender.workload import MixEntry


@dataclass(frozen=True, slots=True)
class _State:
    gpus: int
    cpu_milli: int
    ram_mib: int
    mix: tuple[MixEntry, ...]


class FragmentationPolicy(Policy):
    name: ClassVar[str] = "fragmentation"

    def pre_score(self, pod: PodFacts, view: ClusterView) -> _State | None:
        if pod.gpus == 0 or not view.knows_usage or not view.mix:
            return None
        return _State(pod.gpus, pod.cpu_milli, pod.ram_mib, view.mix)

    def score_all(
        self, state: _State, nodes: Sequence[NodeFacts], view: ClusterView
    ) -> list[float]:
        # Whether a shape fits depends on free CPU and memory only through where they
        # fall among the shapes' own (gridded) sizes: key the memo by that position, so
        # nodes in the same state share one evaluation.
        cpu_levels = sorted({e.shape.cpu_milli for e in state.mix})
        ram_levels = sorted({e.shape.ram_mib for e in state.mix})
        # Per product, the shapes allowed on it: (gpus, cpu level, memory level, share).
        allowed: dict[str | None, list[tuple[int, int, int, float]]] = {}
        memo: dict[tuple[int, int, int, str | None], float] = {}

        def fragmented(free: int, cpu: int, ram: int, model: str | None) -> float:
            if free <= 0:
                return 0.0
            key = (free, bisect_right(cpu_levels, cpu), bisect_right(ram_levels, ram), model)
            value = memo.get(key)
            if value is None:
                shapes = allowed.get(model)
                if shapes is None:
                    shapes = allowed[model] = [
                        (
                            e.shape.gpus,
                            bisect_left(cpu_levels, e.shape.cpu_milli),
                            bisect_left(ram_levels, e.shape.ram_mib),
                            e.share,
                        )
                        for e in state.mix
                        if e.shape.products is None or model in e.shape.products
                    ]
                _, cpu_at, ram_at, _ = key
                fits = sum(
                    share for g, c, r, share in shapes if g <= free and c < cpu_at and r < ram_at
                )
                value = memo[key] = free * (1.0 - fits)
            return value

        # A node's score depends only on its state: nodes alike (the same type, the
        # same use) share one evaluation. The cache keeps each node's state ready, so
        # the hot loop does two dict lookups per node.
        by_state: dict[FreeState, float] = {}
        known = by_state.get
        free_of = view.free.get
        want, cpu_want, ram_want = state.gpus, state.cpu_milli, state.ram_mib
        scores = []
        append = scores.append
        for node in nodes:
            key = free_of(node.name)
            if key is None:  # not in the cache's snapshot: its facts, no pods known
                key = free_state(node, view.used.get(node.name, 0), 0, 0)
            score = known(key)
            if score is None:
                free, cpu_free, ram_free, model = key
                score = by_state[key] = fragmented(free, cpu_free, ram_free, model) - fragmented(
                    free - want, cpu_free - cpu_want, ram_free - ram_want, model
                )
            append(score)
        return scores
