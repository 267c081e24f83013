"""gpu: fit by count, memory per GPU and product; binpack (default) or spread."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from extender.model import NodeFacts, PodFacts
from extender.policies.base import ClusterView, Failure, Policy
from gpu_scheduler import contract

NO_GPUS = Failure(f"node has no GPUs (no allocatable {contract.RESOURCE_GPU})", True)
NOT_ADVERTISED = Failure(
    f"node is labelled with GPUs but advertises no allocatable {contract.RESOURCE_GPU} yet",
    False,
)


@dataclass(frozen=True, slots=True)
class _State:
    gpus: int
    min_memory_mib: int | None
    products: frozenset[str] | None
    spread: bool
    used: Mapping[str, int]


class GpuPolicy(Policy):
    name: ClassVar[str] = "gpu"

    def pre_filter(self, pod: PodFacts, view: ClusterView) -> _State | None:
        if pod.gpus == 0:
            return None  # a pod without GPUs fits every node as far as GPUs go
        return self._state(pod, view)

    def pre_score(self, pod: PodFacts, view: ClusterView) -> _State | None:
        if pod.gpus and not view.knows_usage:
            # Args mode sees no pods: "free" would be allocatable, and binpack would
            # prefer the smallest node, not the fullest. NodeResourcesFit's
            # MostAllocated, which knows real usage, decides the packing instead.
            return None
        return self._state(pod, view)

    @staticmethod
    def _state(pod: PodFacts, view: ClusterView) -> _State:
        return _State(
            pod.gpus, pod.min_memory_mib, pod.products, pod.placement == "spread", view.used
        )

    def filter(self, state: _State, node: NodeFacts, view: ClusterView) -> Failure | None:
        want = state.gpus
        if node.allocatable == 0:
            return NOT_ADVERTISED if node.labelled_gpu else NO_GPUS
        if state.products is not None and node.model not in state.products:
            have = node.product or f"unknown (no {contract.LABEL_GPU_PRODUCT} label)"
            return Failure(
                f"GPU product {have} is not one of {contract.ANN_GPU_PRODUCTS}="
                f"{','.join(sorted(state.products))}",
                True,
            )
        if state.min_memory_mib is not None:
            if node.memory_mib is None:
                return Failure(
                    f"node publishes no GPU memory label ({contract.LABEL_GPU_MEMORY}); "
                    f"{contract.ANN_MIN_GPU_MEMORY} needs it",
                    True,
                )
            if node.memory_mib < state.min_memory_mib:
                return Failure(
                    f"GPU memory {node.memory_mib} MiB per GPU is below "
                    f"{contract.ANN_MIN_GPU_MEMORY}={state.min_memory_mib} MiB",
                    True,
                )
        if node.allocatable < want:
            return Failure(f"node has {node.allocatable} GPUs in all; pod requests {want}", True)
        free = node.allocatable - state.used.get(node.name, 0)
        if free < want:
            return Failure(
                f"{max(free, 0)} of {node.allocatable} GPUs free; pod requests {want}", False
            )
        return None

    def suspects(self, state: _State, nodes: Sequence[NodeFacts], view: ClusterView) -> list[int]:
        want, used, products, least = (
            state.gpus,
            state.used.get,
            state.products,
            state.min_memory_mib,
        )
        return [
            i
            for i, n in enumerate(nodes)
            if n.allocatable - used(n.name, 0) < want
            or (products is not None and n.model not in products)
            or (least is not None and (n.memory_mib is None or n.memory_mib < least))
        ]

    def score_all(
        self, state: _State, nodes: Sequence[NodeFacts], view: ClusterView
    ) -> list[float]:
        want, used = state.gpus, state.used.get
        if want == 0:
            # Keep GPU nodes for GPU work: a CPU pod prefers nodes without GPUs.
            return [0.0 if n.allocatable > 0 or n.labelled_gpu else 1.0 for n in nodes]
        if state.spread:  # most GPUs left after placing
            return [float(n.allocatable - used(n.name, 0) - want) for n in nodes]
        # binpack: fewest GPUs left after placing
        return [float(want + used(n.name, 0) - n.allocatable) for n in nodes]
