"""gpu: fit by count, memory per GPU and product; binpack (default) or spread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from extender.columns import ALLOC, FREE, LABELLED, LARGEST, MEMORY, MODEL, Candidates
from extender.model import NodeFacts, PodFacts
from extender.policies.base import ClusterView, Failure, Policy
from extender.share_columns import gpu_matrix, place
from gpu_scheduler import contract, sharing

NO_GPUS = Failure(f"node has no GPUs (no allocatable {contract.RESOURCE_GPU})", True)
NOT_SHARED = Failure(
    f"node does not share its GPUs (no {contract.LABEL_GPU_SHARING} label, no allocatable "
    f"{contract.RESOURCE_GPU_MEMORY})",
    True,
)
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
    shares: tuple[int, ...] = ()


class GpuPolicy(Policy):
    name: ClassVar[str] = "gpu"

    def pre_filter(self, pod: PodFacts, view: ClusterView) -> _State | None:
        if pod.gpus == 0 and not pod.shares:
            return None  # a pod without GPUs fits every node as far as GPUs go
        return self._state(pod, view)

    def pre_score(self, pod: PodFacts, view: ClusterView) -> _State | None:
        shares = view.pod_shares(pod)
        if (pod.gpus or shares) and not view.knows_usage:
            # Args mode sees no pods: "free" would be allocatable, and binpack would
            # prefer the smallest node, not the fullest. NodeResourcesFit's
            # MostAllocated, which knows real usage, decides the packing instead.
            return None
        return self._state(pod, view, shares)

    @staticmethod
    def _state(pod: PodFacts, view: ClusterView, shares: tuple[int, ...] | None = None) -> _State:
        spread = pod.placement == "spread"
        shares = pod.shares if shares is None else shares
        return _State(pod.gpus, pod.min_memory_mib, pod.products, spread, shares)

    def filter(self, state: _State, node: NodeFacts, view: ClusterView) -> Failure | None:
        want = state.gpus
        if state.shares:
            if node.shared is None:
                return NOT_SHARED
        elif node.allocatable == 0:
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
        if state.shares:
            return _share_failure(state, view.shared_gpus(node), want)
        if node.allocatable < want:
            return Failure(f"node has {node.allocatable} GPUs in all; pod requests {want}", True)
        usable = node.usable
        if usable < want:
            # Unresolvable: preemption cannot heal a GPU. The agent's annotation
            # changes when it recovers, and that Node update retries the pod.
            return Failure(
                f"{usable} of {node.allocatable} GPUs healthy; pod requests {want}; "
                f"unhealthy: {', '.join(node.unhealthy) or 'unknown'}",
                True,
            )
        free = view.free_gpus(node)
        if free < want:
            sick = f" ({len(node.unhealthy)} unhealthy)" if usable < node.allocatable else ""
            return Failure(
                f"{max(free, 0)} of {usable} GPUs free{sick}; pod requests {want}", False
            )
        return None

    def suspects(self, state: _State, nodes: Candidates, view: ClusterView) -> np.ndarray:
        cols = nodes.cols
        bad = cols[FREE] < state.gpus
        if state.shares:
            bad |= cols[LARGEST] < max(state.shares)
            if len(state.shares) > 1 or state.gpus:  # the largest piece is not enough
                free, cap = gpu_matrix(nodes, view)
                bad |= ~place(free, cap, state.shares, state.gpus)[1]
        if state.products is not None:
            bad |= ~nodes.models.member(state.products)[cols[MODEL]]
        least = state.min_memory_mib
        if least is not None:
            bad |= cols[MEMORY] < max(least, 0)  # -1: no memory label
        return np.flatnonzero(bad)

    def score_all(self, state: _State, nodes: Candidates, view: ClusterView) -> np.ndarray:
        cols = nodes.cols
        want = state.gpus
        if state.shares:
            # Best fit: the least left on the GPU the (largest) share goes to.
            free, cap = gpu_matrix(nodes, view)
            _, fits, left = place(free, cap, state.shares, want)
            # Where the fit rule finds no room (a DRA candidate kube-scheduler admitted
            # on devices we do not see as shared), last.
            left = np.where(fits, left, -1 if state.spread else 1 << 20).astype(np.float64)
            return left if state.spread else -left
        if want == 0:
            # Keep GPU nodes for GPU work: a CPU pod prefers nodes without GPUs.
            return np.where((cols[ALLOC] > 0) | (cols[LABELLED] != 0), 0.0, 1.0)
        if state.spread:  # most GPUs left after placing
            return (cols[FREE] - want).astype(np.float64)
        # binpack: fewest GPUs left after placing
        return (want - cols[FREE]).astype(np.float64)


def _share_failure(state: _State, gpus: tuple[sharing.Gpu, ...], whole: int) -> Failure | None:
    """Why the pod's shares (and whole GPUs) fit none of the node's GPUs, or None."""
    if sharing.fit(gpus, state.shares, whole) is not None:
        return None
    need = max(state.shares)
    biggest = max((g.capacity for g in gpus), default=0)
    if biggest < need:
        return Failure(
            f"no GPU here has {need} GiB (the largest has {biggest} GiB); pod asks "
            f"{contract.RESOURCE_GPU_MEMORY}={need} of one GPU",
            True,
        )
    if whole and sum(1 for g in gpus if g.whole_free) < whole:
        free = sum(1 for g in gpus if g.whole_free)
        return Failure(f"{free} GPUs wholly free (none shared); pod requests {whole}", False)
    asked = "+".join(map(str, state.shares))
    best = max(gpus, key=lambda g: g.free) if gpus else None
    if best is not None and best.free >= need:  # several shares: no set of GPUs holds them
        pieces = ", ".join(str(g.free) for g in gpus[:16])
        return Failure(
            f"the shares {asked} GiB fit no set of its GPUs, one GPU each (free: {pieces} GiB)",
            False,
        )
    piece = f"{best.free} GiB on {best.uuid}" if best is not None else "none"
    return Failure(
        f"no single GPU has {need} GiB free: the largest free piece is {piece} "
        f"({sum(g.free for g in gpus)} GiB free on {len(gpus)} GPUs); pod asks {asked} GiB",
        False,
    )


def share_gpu(pod: PodFacts, node: NodeFacts | None, view: ClusterView) -> str | None:
    """The GPU a share pod's largest share goes to on ``node`` by the fit rule (what
    the device plugin's preferred allocation picks there), or None."""
    if not pod.shares or node is None or node.shared is None:
        return None
    gpus = view.shared_gpus(node)
    placement = sharing.fit(gpus, pod.shares, pod.gpus)
    if placement is None:
        return None
    largest = max(range(len(pod.shares)), key=lambda k: pod.shares[k])
    return gpus[placement.shares[largest]].uuid
