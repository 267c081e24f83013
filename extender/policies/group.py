"""group: pack the pods of one placement group into the tightest topology domain.

Pods that share ``gpu-scheduler.io/group`` (a training job's workers) talk to each
other; the less network between them, the faster they train. The levels are node
labels, tightest first (the extender's ``groupLevels``; by default NVIDIA's NVLink
clique, GKE's sub-block and block, AWS's network layers 3 to 1, then the zone). A
candidate scores by the tightest level at which it shares a domain with pods of its
group already placed, and within a level by how many of them are there. Soft: it never
filters, so a group whose domain is full still schedules elsewhere.

The group's own earlier pods are the anchor: the first pod of a group has nothing to
be near, so this policy says nothing for it. Kueue's Topology Aware Scheduling, where
it is used, pins the whole job to one domain by nodeSelector before any pod is
scheduled; inside that domain this policy still packs the group tighter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from extender.columns import Candidates
from extender.model import NodeFacts, PodFacts
from extender.policies.base import ClusterView, Policy
from gpu_scheduler import contract


@dataclass(frozen=True, slots=True)
class GroupState:
    """Where a group's placed pods are: per level (tightest first), domain -> pods."""

    levels: tuple[str, ...]
    domains: tuple[Mapping[str, int], ...]
    members: int  # its pods placed on nodes the view knows
    index: Mapping[str, int]  # level key -> its position in ``levels``

    def nearest(self, node: NodeFacts) -> tuple[int, str, int] | None:
        """(level index, domain, group pods there) of the tightest level at which
        ``node`` shares a domain with the group; None when it shares none."""
        best = None
        for key, value in node.domains:
            i = self.index.get(key)
            if i is not None and (best is None or i < best[0]):
                count = self.domains[i].get(value)
                if count:
                    best = (i, value, count)
        return best

    def describe(self, node: NodeFacts) -> str | None:
        """The explanation's words for ``node``: the level it was drawn by."""
        near = self.nearest(node)
        if near is None:
            return None
        i, value, count = near
        return f"{count} of its group's {self.members} placed pods in {self.levels[i]}={value}"


def group_state(pod: PodFacts, view: ClusterView, levels: Sequence[str]) -> GroupState | None:
    """Where ``pod``'s placement group already runs; None for a pod of no group, or
    of a group with no pod placed yet on a node with any of ``levels``."""
    if pod.group is None:
        return None
    placed = view.groups.get((pod.namespace, pod.group))
    if not placed:
        return None
    domains: list[dict[str, int]] = [{} for _ in levels]
    index = {key: i for i, key in enumerate(levels)}
    members = 0
    for name, count in placed.items():
        facts = view.nodes.get(name)
        if facts is None:
            continue
        members += count
        for key, value in facts.domains:
            i = index.get(key)
            if i is not None:
                domains[i][value] = domains[i].get(value, 0) + count
    if not any(domains):
        return None
    return GroupState(tuple(levels), tuple(domains), members, index)


class GroupPolicy(Policy):
    """Scores ``levels - i + share``: ``i`` the index of the tightest level whose
    domain the node shares with the group, ``share`` (< 1) the part of the group's
    placed pods in that domain; 0 where it shares none."""

    name: ClassVar[str] = "group"

    def __init__(self, levels: Sequence[str] = contract.TOPOLOGY_LEVELS) -> None:
        self.levels = tuple(levels)

    def pre_score(self, pod: PodFacts, view: ClusterView) -> GroupState | None:
        return group_state(pod, view, self.levels)

    def score_all(self, state: GroupState, nodes: Candidates, view: ClusterView) -> np.ndarray:
        # A Python step per candidate, for the pods of placement groups only (every
        # other pod skips this policy in pre_score).
        out = np.zeros(nodes.known)
        top = len(state.levels)
        share = 1.0 / (state.members + 1)
        for j in range(nodes.known):
            near = state.nearest(nodes.facts(j))
            if near is not None:
                out[j] = top - near[0] + near[2] * share
        return out
