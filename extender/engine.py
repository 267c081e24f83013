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
from typing import Any

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


def filter_nodes(
    pod: PodFacts,
    names: Sequence[str],
    nodes: Sequence[NodeFacts | None],
    view: ClusterView,
    policies: Sequence[Policy],
) -> FilterOutcome:
    """Sort every candidate into exactly one of passed / failed / unresolvable.

    ``nodes[i]`` holds the facts for ``names[i]``, or None when they are unknown.
    """
    out = FilterOutcome()
    if pod.error is not None:
        reason = f"pod cannot be placed as asked: {pod.error}"
        out.unresolvable = dict.fromkeys(names, reason)
        return out
    known = [node for node in nodes if node is not None and node.error is None]
    verdicts: dict[int, Failure] = {}  # position in ``known`` -> first failure
    for policy in policies:
        state = policy.pre_filter(pod, view)
        if state is None:
            continue
        positions = policy.suspects(state, known, view)
        if positions is None:
            positions = range(len(known))
        check = policy.filter
        for j in positions:
            before = verdicts.get(j)
            if before is not None and before.unresolvable:
                continue  # the strongest verdict is in
            failure = check(state, known[j], view)
            # First failure wins, except that an unresolvable one overrides a
            # resolvable one: preemption or waiting cannot help that node.
            if failure is not None and (before is None or failure.unresolvable):
                verdicts[j] = failure
    passed, failed, unresolvable = out.passed, out.failed, out.unresolvable
    if not verdicts and len(known) == len(nodes) == len(names):  # usual: every node passes
        passed.extend(names)
        return out
    j = 0
    for name, node in zip(names, nodes, strict=True):
        if node is None:
            # Unresolvable: preemption cannot make the cache know a node. The pod is
            # retried on the next cluster event (the node's own arrival is one).
            unresolvable[name] = UNKNOWN_NODE
            continue
        if node.error is not None:
            unresolvable[name] = node.error
            continue
        verdict = verdicts.get(j)
        j += 1
        if verdict is None:
            passed.append(name)
        elif verdict.unresolvable:
            unresolvable[name] = verdict.reason
        else:
            failed[name] = verdict.reason
    return out


def score_nodes(
    pod: PodFacts,
    nodes: Sequence[NodeFacts | None],
    view: ClusterView,
    policies: Sequence[Policy],
    cfg: ExtenderConfig,
    parts: dict[str, Sequence[float]] | None = None,
) -> list[int]:
    """Integer scores 0..10, one per node (0 for unknown and unreadable nodes).

    ``parts``, when given, receives each scoring policy's own 0..10 score per node
    (before weighting; 0 for unknown nodes): what a placement explanation shows. They
    are worked out when read, since an explanation reads a few of the candidates."""
    count = len(nodes)
    if pod.error is not None or count == 0:
        return [0] * count
    where = [i for i, node in enumerate(nodes) if node is not None and node.error is None]
    if not where:
        return [0] * count
    known = [nodes[i] for i in where]
    totals = [0.0] * len(known)
    weight_sum = 0
    for policy in policies:
        weight = cfg.weight(policy.name)
        if weight == 0:
            continue
        state = policy.pre_score(pod, view)
        if state is None:
            continue
        weight_sum += weight
        raw = policy.score_all(state, known, view)  # type: ignore[arg-type]
        part = _Normalised(raw, policy.absolute, count, where)
        # One pass per policy: total += weight x the normalised score (the same
        # arithmetic, in the same order, as normalising first).
        low, unit = part.low, part.unit
        if unit is None:  # every candidate alike: all get MAX_SCORE
            flat = weight * float(MAX_SCORE)
            totals = [t + flat for t in totals]
        else:
            totals = [t + weight * ((v - low) * unit) for t, v in zip(totals, raw, strict=True)]
        if parts is not None:
            parts[policy.name] = part
    if weight_sum == 0:
        return [0] * count
    # Half up, then clamp: floating error must never step outside 0..10.
    inverse = 1.0 / weight_sum
    scores = [int(t * inverse + 0.5) for t in totals]
    scores = [MAX_SCORE if s > MAX_SCORE else 0 if s < 0 else s for s in scores]
    return _placed(count, where, scores, 0)


class _Normalised(Sequence[float]):
    """One policy's 0..10 scores over all ``count`` candidates, computed per item on
    reading: min-max over the candidates it scored (``absolute``: raw x 10); all
    alike -> MAX_SCORE; a candidate it did not score (unknown node) -> 0."""

    __slots__ = ("_at", "_count", "low", "raw", "unit")

    def __init__(self, raw: list[float], absolute: bool, count: int, where: list[int]) -> None:
        self.raw = raw
        self.low: float = 0.0
        self.unit: float | None = float(MAX_SCORE)
        if not absolute:
            low, high = min(raw), max(raw)
            self.low = low
            self.unit = MAX_SCORE / (high - low) if high != low else None
        # candidate position -> position among the scored ones (None: all were scored)
        self._at = None if len(where) == count else {i: j for j, i in enumerate(where)}
        self._count = count

    def __len__(self) -> int:
        return self._count

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
        return (self.raw[j] - self.low) * self.unit


def _placed(count: int, where: list[int], values: list[Any], missing: Any = 0.0) -> list[Any]:
    """``values`` for the known nodes at their positions among all ``count`` (the
    others get ``missing``)."""
    if len(where) == count:
        return values
    out = [missing] * count
    for i, value in zip(where, values, strict=True):
        out[i] = value
    return out
