"""The shape every policy has: the scheduler framework's PreFilter/Filter and
PreScore/Score.

``pre_filter`` and ``pre_score`` run once per pod; each returns the per-pod state its
per-node step reads, or ``None`` when the policy has nothing to say about this pod
(the framework's Skip), so the per-node loop never calls it.

``filter`` decides one node and words the reason: ``None`` or a :class:`Failure`.
``suspects`` is its fast companion over all candidates at once: the positions of the
nodes that *may* fail, a superset the engine then asks ``filter`` about; None (the
default) asks about every node. ``score_all`` scores all candidates at once
(any floats, higher is better); the engine normalises each policy's scores to 0..10
over the candidates before weighting them. The batch forms read the candidates as
columns (:class:`~extender.columns.Candidates`, numpy arrays over the known
candidates) because the extender runs on kube-scheduler's hot path: a few array
operations over 500 nodes cost a fraction of 500 Python-level steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from extender.columns import Candidates
from extender.model import NodeFacts, PodFacts
from extender.view import View


@dataclass(frozen=True, slots=True)
class Failure:
    reason: str
    #: True: no change in the cluster's load makes the pod fit (wrong product, too
    #: little memory, no GPUs at all) -> FailedAndUnresolvableNodes. False -> FailedNodes.
    unresolvable: bool


#: What the policies may ask about the cluster: an immutable snapshot for one request
#: (``knows_usage`` False in args mode, where no pods are seen).
ClusterView = View


class Policy:
    """The base of every policy: each extension point defaults to "nothing to say".

    A policy overrides what it does: ``pre_filter`` + ``filter`` (and optionally
    ``suspects``) to filter, ``pre_score`` + ``score_all`` to score. ``absolute``
    True: its scores are already 0..1 on a fixed scale, not stretched min-max.
    Its default weight and name are registered in :data:`extender.policies.REGISTRY`.
    """

    name: ClassVar[str]
    absolute: ClassVar[bool] = False

    def pre_filter(self, pod: PodFacts, view: ClusterView) -> Any | None:
        return None

    def filter(self, state: Any, node: NodeFacts, view: ClusterView) -> Failure | None:
        return None

    def suspects(
        self, state: Any, nodes: Candidates, view: ClusterView
    ) -> Sequence[int] | np.ndarray | None:
        """The positions of the nodes that may fail (a superset), or None: ask
        ``filter`` about every node."""
        return None

    def pre_score(self, pod: PodFacts, view: ClusterView) -> Any | None:
        return None

    def score_all(
        self, state: Any, nodes: Candidates, view: ClusterView
    ) -> np.ndarray | Sequence[float]:
        raise NotImplementedError(f"{self.name} returned a score state but scores nothing")
