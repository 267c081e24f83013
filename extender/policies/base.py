"""The shape every policy has: the scheduler framework's PreFilter/Filter and
PreScore/Score.

``pre_filter`` and ``pre_score`` run once per pod; each returns the per-pod state its
per-node step reads, or ``None`` when the policy has nothing to say about this pod
(the framework's Skip), so the per-node loop never calls it.

``refuse`` is the filter rule, written once, over all candidates at once (node by
node instead, a filter call takes 1.4x as long at 500 candidates and 2.6-3.1x at
5,000: docs/BENCHMARKS.md, "What each mechanism of the extender pays for"): a code
per candidate, 0 where it passes and otherwise which of the policy's reasons refused
it (the first that holds). Whether a refusal is resolvable is the code's
(``unresolvable``); ``word`` only puts a refusal into words, reading the node's own
values for the text, and decides nothing. ``score_all`` scores all candidates at once
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


#: What the policies may ask about the cluster: an immutable snapshot for one request.
ClusterView = View


class Policy:
    """The base of every policy: each extension point defaults to "nothing to say".

    A policy overrides what it does: ``pre_filter`` + ``refuse`` + ``word`` (and
    ``unresolvable``) to filter, ``pre_score`` + ``score_all`` to score. ``absolute``
    True: its scores are already 0..1 on a fixed scale, not stretched min-max.
    Its default weight and name are registered in :data:`extender.policies.REGISTRY`.
    """

    name: ClassVar[str]
    absolute: ClassVar[bool] = False

    def pre_filter(self, pod: PodFacts, view: ClusterView) -> Any | None:
        return None

    #: The refusal codes no change in the cluster's load heals: those nodes go to
    #: FailedAndUnresolvableNodes (preemption is not tried there), the rest to FailedNodes.
    unresolvable: ClassVar[frozenset[int]] = frozenset()

    def refuse(self, state: Any, nodes: Candidates, view: ClusterView) -> np.ndarray | None:
        """A refusal code per known candidate (0: it passes), or None: none refused."""
        return None

    def word(self, state: Any, code: int, node: NodeFacts, view: ClusterView) -> str:
        """Refusal ``code`` (from :meth:`refuse`) on ``node``, in words."""
        raise NotImplementedError(f"{self.name} refused a node and has no words for it")

    def pre_score(self, pod: PodFacts, view: ClusterView) -> Any | None:
        return None

    def score_all(
        self, state: Any, nodes: Candidates, view: ClusterView
    ) -> np.ndarray | Sequence[float]:
        raise NotImplementedError(f"{self.name} returned a score state but scores nothing")
