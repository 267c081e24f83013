"""zone: draw the pods of one placement group to the zone where the group already runs."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from extender.columns import ZONE, Candidates
from extender.model import PodFacts
from extender.policies.base import ClusterView, Policy


class ZonePolicy(Policy):
    """Pods sharing ``gpu-scheduler.io/group`` score nodes by how many of their group
    already run in the node's zone (``topology.kubernetes.io/zone``). Soft: it never
    filters, so a group whose zone is full still schedules elsewhere."""

    name: ClassVar[str] = "zone"

    def pre_score(self, pod: PodFacts, view: ClusterView) -> dict[str, int] | None:
        if pod.group is None:
            return None
        zones = view.group_zones(pod.namespace, pod.group)
        return zones or None

    def score_all(self, state: dict[str, int], nodes: Candidates, view: ClusterView) -> np.ndarray:
        return nodes.zones.lookup(state, 0.0)[nodes.cols[ZONE]]
