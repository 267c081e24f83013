"""spot: spot or on-demand capacity, from each cloud's spot label (EKS, Karpenter, GKE,
AKS: ``contract.SPOT_LABELS``)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from extender.columns import SPOT, Candidates
from extender.model import NodeFacts, PodFacts
from extender.policies.base import ClusterView, Policy
from gpu_scheduler import contract

_LABELS = ", ".join(f"{key}={value}" for key, value in contract.SPOT_LABELS)
NOT_SPOT, IS_SPOT = 1, 2  # the codes of SpotPolicy.refuse
_WORDS = {
    NOT_SPOT: (
        f"node is not spot capacity (none of {_LABELS}) and the pod has {contract.ANN_SPOT}=require"
    ),
    IS_SPOT: f"node is spot capacity and the pod has {contract.ANN_SPOT}=forbid",
}


class SpotPolicy(Policy):
    """Pods say prefer|avoid|require|forbid; GPU pods avoid spot unless they say so.

    A node with neither label counts as on-demand.
    """

    name: ClassVar[str] = "spot"
    unresolvable: ClassVar[frozenset[int]] = frozenset(_WORDS)

    def pre_filter(self, pod: PodFacts, view: ClusterView) -> str | None:
        return pod.spot if pod.spot in ("require", "forbid") else None

    def pre_score(self, pod: PodFacts, view: ClusterView) -> str | None:
        return pod.spot if pod.spot in ("prefer", "avoid") else None

    def refuse(self, state: str, nodes: Candidates, view: ClusterView) -> np.ndarray:
        spot = nodes.cols[SPOT] != 0
        return np.where(spot, IS_SPOT, NOT_SPOT) * (spot == (state == "forbid"))

    def word(self, state: str, code: int, node: NodeFacts, view: ClusterView) -> str:
        return _WORDS[code]

    def score_all(self, state: str, nodes: Candidates, view: ClusterView) -> np.ndarray:
        good = 1.0 if state == "prefer" else 0.0
        return np.where(nodes.cols[SPOT] != 0, good, 1.0 - good)
