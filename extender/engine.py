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

from extender.config import ExtenderConfig
from extender.model import NodeFacts, PodFacts
from extender.policies import ClusterView, Policy

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
    active = []
    for policy in policies:
        state = policy.pre_filter(pod, view)
        if state is not None:
            active.append((policy.filter, state))
    passed, failed, unresolvable = out.passed, out.failed, out.unresolvable
    for name, node in zip(names, nodes, strict=True):
        if node is None:
            failed[name] = UNKNOWN_NODE
            continue
        first = None
        for check, state in active:
            failure = check(state, node, view)
            if failure is not None:
                if failure.unresolvable:
                    first = failure
                    break
                if first is None:
                    first = failure
        if first is None:
            passed.append(name)
        elif first.unresolvable:
            unresolvable[name] = first.reason
        else:
            failed[name] = first.reason
    return out


def score_nodes(
    pod: PodFacts,
    nodes: Sequence[NodeFacts | None],
    view: ClusterView,
    policies: Sequence[Policy],
    cfg: ExtenderConfig,
) -> list[int]:
    """Integer scores 0..10, one per node (0 for unknown nodes)."""
    count = len(nodes)
    if pod.error is not None or count == 0:
        return [0] * count
    known = [i for i, node in enumerate(nodes) if node is not None]
    if not known:
        return [0] * count
    totals = [0.0] * count
    weight_sum = 0
    for policy in policies:
        weight = cfg.weight(policy.name)
        if weight == 0:
            continue
        state = policy.pre_score(pod, view)
        if state is None:
            continue
        weight_sum += weight
        score = policy.score
        raw = [score(state, nodes[i], view) for i in known]  # type: ignore[arg-type]
        low, high = min(raw), max(raw)
        if high == low:
            for i in known:
                totals[i] += weight * MAX_SCORE
            continue
        scale = weight * MAX_SCORE / (high - low)
        for i, value in zip(known, raw, strict=True):
            totals[i] += (value - low) * scale
    if weight_sum == 0:
        return [0] * count
    result = [0] * count
    for i in known:
        # Half up, then clamp: floating error must never step outside 0..10.
        result[i] = min(MAX_SCORE, max(0, int(totals[i] / weight_sum + 0.5)))
    return result
