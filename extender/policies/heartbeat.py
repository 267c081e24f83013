"""heartbeat: no new GPU pods on a node whose gpu-scheduler agent has gone silent."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from extender.model import NodeFacts, PodFacts
from extender.policies.base import ClusterView, Failure
from gpu_scheduler import contract


class HeartbeatPolicy:
    """Filter only. A node without the heartbeat annotation (labelled by GPU Feature
    Discovery, not our agent) is trusted as it is."""

    name: ClassVar[str] = "heartbeat"

    def __init__(self, window_seconds: float) -> None:
        self.window = window_seconds

    def pre_score(self, pod: PodFacts, view: ClusterView) -> None:
        return None

    def pre_filter(self, pod: PodFacts, view: ClusterView) -> float | None:
        if pod.gpus == 0 or self.window <= 0:
            return None
        return view.now() - self.window

    def filter(self, oldest: float, node: NodeFacts, view: ClusterView) -> Failure | None:
        beat = node.heartbeat
        if beat is None or beat >= oldest:
            return None
        age = int(view.now() - beat)
        return Failure(
            f"gpu-scheduler agent on this node is silent: last {contract.ANN_HEARTBEAT} "
            f"{age}s ago (window {int(self.window)}s)",
            False,
        )

    def suspects(self, oldest: float, nodes: Sequence[NodeFacts], view: ClusterView) -> list[int]:
        return [i for i, n in enumerate(nodes) if n.heartbeat is not None and n.heartbeat < oldest]

    def score_all(self, state: None, nodes: Sequence[NodeFacts], view: ClusterView) -> list[float]:
        return [0.0] * len(nodes)  # never called: pre_score skips
