"""Filter and score: pure functions of the pod, the candidate nodes and the cluster view.

This is the scheduler framework's cycle in small: each policy's ``pre_filter`` and
``pre_score`` once per pod, its ``filter`` per node, its ``score`` per passing node,
one min-max
normalisation per policy to 0..10 (``MaxExtenderPriority``), and an integer
weighted mean. kube-scheduler multiplies what we return by weight x 10 and does not
clamp, so nothing outside 0..10 may ever leave here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from extender.columns import Candidates
from extender.config import ExtenderConfig
from extender.model import NodeFacts, PodFacts
from extender.policies import ClusterView, Failure, Policy

MAX_SCORE = 10
UNKNOWN_NODE = "node is not in the extender's node cache yet (just added?)"


@dataclass
class FilterOutcome:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)


def candidates_of(
    names: Sequence[str], nodes: Sequence[NodeFacts | None] | Candidates, view: ClusterView
) -> Candidates:
    """``nodes`` as :class:`Candidates`: as they are, or built from the facts
    (``nodes[i]`` for ``names[i]``, None when unknown) and the view's usage."""
    if isinstance(nodes, Candidates):
        return nodes
    return Candidates.from_facts(names, nodes, view.free, view.used, view.gpus)


def filter_nodes(
    pod: PodFacts,
    names: Sequence[str],
    nodes: Sequence[NodeFacts | None] | Candidates,
    view: ClusterView,
    policies: Sequence[Policy],
) -> FilterOutcome:
    """Sort every candidate into exactly one of passed / failed / unresolvable."""
    out = FilterOutcome()
    if pod.error is not None:
        reason = f"pod cannot be placed as asked: {pod.error}"
        out.unresolvable = dict.fromkeys(names, reason)
        return out
    batch = candidates_of(names, nodes, view)
    verdicts: dict[int, Failure] = {}  # position among the known -> first failure
    for policy in policies:
        state = policy.pre_filter(pod, view)
        if state is None:
            continue
        codes = policy.refuse(state, batch, view)
        if codes is None:
            continue
        for j in np.flatnonzero(codes).tolist():
            before = verdicts.get(j)
            if before is not None and before.unresolvable:
                continue  # the strongest verdict is in
            code = int(codes[j])
            unresolvable = code in policy.unresolvable
            # First failure wins, except that an unresolvable one overrides a
            # resolvable one: preemption or waiting cannot help that node.
            if before is None or unresolvable:
                reason = policy.word(state, code, batch.facts(j), view)
                verdicts[j] = Failure(reason, unresolvable)
    passed, failed, unresolvable = out.passed, out.failed, out.unresolvable
    if not verdicts and batch.where is None:  # usual: every node passes
        passed.extend(names)
        return out
    known = range(batch.count) if batch.where is None else batch.where.tolist()
    at = dict(zip(known, range(len(known)), strict=True))  # position -> among the known
    for i, name in enumerate(names):
        j = at.get(i)
        if j is None:
            node = batch.at(i)
            # Unresolvable: preemption cannot make the cache know a node. The pod is
            # retried on the next cluster event (the node's own arrival is one).
            unresolvable[name] = UNKNOWN_NODE if node is None else str(node.error)
            continue
        verdict = verdicts.get(j)
        if verdict is None:
            passed.append(name)
        elif verdict.unresolvable:
            unresolvable[name] = verdict.reason
        else:
            failed[name] = verdict.reason
    return out


def score_array(
    pod: PodFacts,
    nodes: Sequence[NodeFacts | None] | Candidates,
    view: ClusterView,
    policies: Sequence[Policy],
    cfg: ExtenderConfig,
    parts: dict[str, Sequence[float]] | None = None,
    names: Sequence[str] | None = None,
) -> np.ndarray:
    """Integer scores 0..10, one per node (0 for unknown and unreadable nodes).

    ``parts``, when given, receives each scoring policy's own 0..10 score per node
    (before weighting; 0 for unknown nodes): what a placement explanation shows. They
    are worked out when read, since an explanation reads a few of the candidates.
    ``names`` are the candidates' (needed only when ``nodes`` are facts)."""
    if isinstance(nodes, Candidates):
        batch: Candidates | None = nodes
        count = nodes.count
    else:
        batch, count = None, len(nodes)
    if pod.error is not None or count == 0:
        return np.zeros(count, dtype=np.int64)
    if batch is None:
        if names is None:
            names = [n.name if n is not None else "" for n in nodes]  # type: ignore[union-attr]
        batch = candidates_of(names, nodes, view)
    if batch.known == 0:
        return np.zeros(count, dtype=np.int64)
    return candidate_scores(batch, weighted_means(pod, batch, view, policies, cfg, parts))


def candidate_scores(batch: Candidates, means: np.ndarray | None) -> np.ndarray:
    """The 0..10 scores of all of ``batch``'s candidates from its known ones'
    weighted means (:func:`weighted_means`; None: no policy scored, all 0), 0 for the
    unknown."""
    if means is None:
        return np.zeros(batch.count, dtype=np.int64)
    scores = rounded(means)
    if batch.where is None:
        return scores
    out = np.zeros(batch.count, dtype=np.int64)
    out[batch.where] = scores
    return out


def rounded(means: np.ndarray) -> np.ndarray:
    """Weighted means as the integer scores 0..10 the extender answers: half up
    (truncating, as int() does), then clamped: floating error must never step
    outside 0..10."""
    scores = (means + 0.5).astype(np.int64)
    return np.minimum(np.maximum(scores, 0), MAX_SCORE)


def weighted_means(
    pod: PodFacts,
    batch: Candidates,
    view: ClusterView,
    policies: Sequence[Policy],
    cfg: ExtenderConfig,
    parts: dict[str, Sequence[float]] | None = None,
) -> np.ndarray | None:
    """Each known candidate's weighted mean of the scoring policies' 0..10 scores,
    unrounded (what :func:`score_array` rounds; a finer ranking than its integers).
    None where no policy scores this pod. ``parts``: as for :func:`score_array`."""
    totals = np.zeros(batch.known)
    weight_sum = 0
    for policy in policies:
        weight = cfg.weight(policy.name)
        if weight == 0:
            continue
        state = policy.pre_score(pod, view)
        if state is None:
            continue
        weight_sum += weight
        raw = np.asarray(policy.score_all(state, batch, view), dtype=np.float64)
        part = _Normalised(raw, policy.absolute, batch)
        # total += weight x the normalised score (the same arithmetic, in the same
        # order, as normalising first).
        if part.unit is None:  # every candidate alike: all get MAX_SCORE
            totals = totals + weight * float(MAX_SCORE)
        else:
            totals = totals + weight * ((raw - part.low) * part.unit)
        if parts is not None:
            parts[policy.name] = part
    if weight_sum == 0:
        return None
    return totals * (1.0 / weight_sum)


class _Normalised(Sequence[float]):
    """One policy's 0..10 scores over all the call's candidates, computed per item on
    reading: min-max over the candidates it scored (``absolute``: raw x 10); all
    alike -> MAX_SCORE; a candidate it did not score (unknown node) -> 0."""

    __slots__ = ("_at", "_count", "low", "raw", "unit")

    def __init__(self, raw: np.ndarray, absolute: bool, batch: Candidates) -> None:
        self.raw = raw
        self.low: float = 0.0
        self.unit: float | None = float(MAX_SCORE)
        if not absolute:
            low, high = float(raw.min()), float(raw.max())
            self.low = low
            self.unit = MAX_SCORE / (high - low) if high != low else None
        where = batch.where
        # candidate position -> position among the scored ones (None: all were scored)
        self._at = None if where is None else {int(i): j for j, i in enumerate(where)}
        self._count = batch.count

    def __len__(self) -> int:
        return self._count

    def pick(self, positions: Sequence[int]) -> list[float]:
        """``[self[i] for i in positions]`` (positions in range), in one step."""
        if self._at is not None:
            return [self[i] for i in positions]
        if self.unit is None:
            return [float(MAX_SCORE)] * len(positions)
        return ((self.raw[list(positions)] - self.low) * self.unit).tolist()

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._count))]
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError(i)
        j = i if self._at is None else self._at.get(i)
        if j is None:
            return 0.0
        if self.unit is None:
            return float(MAX_SCORE)
        return (float(self.raw[j]) - self.low) * self.unit
