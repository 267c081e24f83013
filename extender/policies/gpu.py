"""gpu: fit by count, memory per GPU and product; binpack (default) or spread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from extender.columns import ALLOC, FREE, LABELLED, LARGEST, MEMORY, MODEL, USABLE, Candidates
from extender.model import NodeFacts, PodFacts
from extender.policies.base import ClusterView, Policy
from extender.share_columns import gpu_matrix, place
from gpu_scheduler import contract, sharing

#: Why a node fails the gpu rule: the codes :meth:`GpuPolicy.refuse` gives, in the
#: order the rule tries them (the first that holds is the node's).
(
    NO_GPUS, NOT_ADVERTISED, NOT_SHARED, PRODUCT, NO_MEMORY_LABEL, LOW_MEMORY,
    TOO_FEW, UNHEALTHY, BUSY, SHARE_TOO_BIG, SHARE_NO_ROOM,
) = range(1, 12)  # fmt: skip
#: The codes no change in the cluster's load heals (FailedAndUnresolvableNodes).
UNRESOLVABLE = frozenset(
    {NO_GPUS, NOT_SHARED, PRODUCT, NO_MEMORY_LABEL, LOW_MEMORY, TOO_FEW, UNHEALTHY, SHARE_TOO_BIG}
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
    unresolvable: ClassVar[frozenset[int]] = UNRESOLVABLE

    def pre_filter(self, pod: PodFacts, view: ClusterView) -> _State | None:
        if pod.gpus == 0 and not pod.shares:
            return None  # a pod without GPUs fits every node as far as GPUs go
        return self._state(pod, view)

    def pre_score(self, pod: PodFacts, view: ClusterView) -> _State | None:
        return self._state(pod, view, view.pod_shares(pod))

    @staticmethod
    def _state(pod: PodFacts, view: ClusterView, shares: tuple[int, ...] | None = None) -> _State:
        spread = pod.placement == "spread"
        shares = pod.shares if shares is None else shares
        return _State(pod.gpus, pod.min_memory_mib, pod.products, spread, shares)

    def refuse(self, state: _State, nodes: Candidates, view: ClusterView) -> np.ndarray:
        """The rule: a code per candidate, 0 where the pod fits."""
        cols = nodes.cols
        want = state.gpus
        if state.shares:
            rules = [(cols[LARGEST] < 0, NOT_SHARED)]
        else:
            none = cols[ALLOC] == 0
            rules = [(none & (cols[LABELLED] == 0), NO_GPUS), (none, NOT_ADVERTISED)]
        if state.products is not None:
            rules.append((~nodes.models.member(state.products)[cols[MODEL]], PRODUCT))
        if state.min_memory_mib is not None:
            rules.append((cols[MEMORY] < 0, NO_MEMORY_LABEL))  # -1: no memory label
            rules.append((cols[MEMORY] < state.min_memory_mib, LOW_MEMORY))
        if state.shares:
            rules += _share_rules(state, nodes, view)
        else:
            rules.append((cols[ALLOC] < want, TOO_FEW))
            rules.append((cols[USABLE] < want, UNHEALTHY))
            rules.append((cols[FREE] < want, BUSY))
        return _first(rules)

    def word(self, state: _State, code: int, node: NodeFacts, view: ClusterView) -> str:
        want = state.gpus
        if code in _FIXED:
            return _FIXED[code]
        if code == PRODUCT:
            have = node.product or f"unknown (no {contract.LABEL_GPU_PRODUCT} label)"
            return (
                f"GPU product {have} is not one of {contract.ANN_GPU_PRODUCTS}="
                f"{','.join(sorted(state.products or ()))}"
            )
        if code == NO_MEMORY_LABEL:
            return (
                f"node publishes no GPU memory label ({contract.LABEL_GPU_MEMORY}); "
                f"{contract.ANN_MIN_GPU_MEMORY} needs it"
            )
        if code == LOW_MEMORY:
            return (
                f"GPU memory {node.memory_mib} MiB per GPU is below "
                f"{contract.ANN_MIN_GPU_MEMORY}={state.min_memory_mib} MiB"
            )
        if code == TOO_FEW:
            return f"node has {node.allocatable} GPUs in all; pod requests {want}"
        usable = node.usable
        if code == UNHEALTHY:
            # Unresolvable: preemption cannot heal a GPU. The agent's annotation
            # changes when it recovers, and that Node update retries the pod.
            return (
                f"{usable} of {node.allocatable} GPUs healthy; pod requests {want}; "
                f"unhealthy: {', '.join(node.unhealthy) or 'unknown'}"
            )
        if code == BUSY:
            sick = f" ({len(node.unhealthy)} unhealthy)" if usable < node.allocatable else ""
            return (
                f"{max(view.free_gpus(node), 0)} of {usable} GPUs free{sick}; pod requests {want}"
            )
        return _share_words(state, code, view.shared_gpus(node), want)

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


_FIXED = {
    NO_GPUS: f"node has no GPUs (no allocatable {contract.RESOURCE_GPU})",
    NOT_ADVERTISED: (
        f"node is labelled with GPUs but advertises no allocatable {contract.RESOURCE_GPU} yet"
    ),
    NOT_SHARED: (
        f"node does not share its GPUs (no {contract.LABEL_GPU_SHARING} label, no allocatable "
        f"{contract.RESOURCE_GPU_MEMORY})"
    ),
}


def _first(rules: list[tuple[np.ndarray, int]]) -> np.ndarray:
    """Each candidate's code: that of the first rule that holds for it, else 0 (worked
    out only where one holds: usually few of the candidates, or none)."""
    refused = np.flatnonzero(np.logical_or.reduce([where for where, _ in rules]))
    codes = np.zeros(len(rules[0][0]), dtype=np.int64)
    if len(refused):
        codes[refused] = np.select([where[refused] for where, _ in rules], [c for _, c in rules])
    return codes


def _share_rules(
    state: _State, nodes: Candidates, view: ClusterView
) -> list[tuple[np.ndarray, int]]:
    """Where the pod's shares (and whole GPUs) fit no GPUs by the fit rule: no GPU is
    big enough (unresolvable), or there is no room now."""
    need = max(state.shares)
    largest = nodes.cols[LARGEST]
    short = largest < need  # no GPU has the largest share free
    if len(state.shares) > 1 or state.gpus:  # the largest piece is not enough
        free, cap = gpu_matrix(nodes, view)
        short |= ~place(free, cap, state.shares, state.gpus)[1]
    too_big = np.zeros(len(short), dtype=bool)
    for j in np.flatnonzero(short & (largest >= 0)).tolist():  # sharing nodes refused
        gpus = view.shared_gpus(nodes.facts(j))
        too_big[j] = max((g.capacity for g in gpus), default=0) < need
    return [(too_big, SHARE_TOO_BIG), (short, SHARE_NO_ROOM)]


def _share_words(state: _State, code: int, gpus: tuple[sharing.Gpu, ...], whole: int) -> str:
    """Why the pod's shares (and whole GPUs) fit none of the node's GPUs, in words."""
    need = max(state.shares)
    if code == SHARE_TOO_BIG:
        biggest = max((g.capacity for g in gpus), default=0)
        return (
            f"no GPU here has {need} GiB (the largest has {biggest} GiB); pod asks "
            f"{contract.RESOURCE_GPU_MEMORY}={need} of one GPU"
        )
    wholly = sum(1 for g in gpus if g.whole_free)
    if whole and wholly < whole:
        return f"{wholly} GPUs wholly free (none shared); pod requests {whole}"
    asked = "+".join(map(str, state.shares))
    best = max(gpus, key=lambda g: g.free) if gpus else None
    if best is not None and best.free >= need:  # several shares: no set of GPUs holds them
        pieces = ", ".join(str(g.free) for g in gpus[:16])
        return f"the shares {asked} GiB fit no set of its GPUs, one GPU each (free: {pieces} GiB)"
    piece = f"{best.free} GiB on {best.uuid}" if best is not None else "none"
    return (
        f"no single GPU has {need} GiB free: the largest free piece is {piece} "
        f"({sum(g.free for g in gpus)} GiB free on {len(gpus)} GPUs); pod asks {asked} GiB"
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
