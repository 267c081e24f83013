"""Filter counts the pods nominated to a node, as kube-scheduler's filters do.

A preemptor whose victims are going waits with ``status.nominatedNodeName`` set.
kube-scheduler filters every other pod with the nominated pods of equal or higher
priority added to their node (``RunFilterPluginsWithNominatedPods``), so a pod of
lower priority does not take the room made for the preemptor. Its count cannot see
what only the extender counts (a sick GPU, a share that must fit one GPU), so the
extender's filter does the same with its own count: a node that passed is tried again
with those nominated pods added (:func:`extender.what_if.fits_adding`), and refused
(resolvably: the room comes back if the preemptor goes elsewhere) where they leave
the pod no room. The pod itself, and nominated pods of lower priority, are not
counted (kube-scheduler takes their node when a higher-priority pod needs it).

Pure: the view carries the nominations (extender/cache_pending.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from extender import metrics
from extender.engine import FilterOutcome
from extender.model import PodFacts
from extender.policies import Policy
from extender.records import PodRecord
from extender.view import View
from extender.what_if import fits_adding


def ahead(view: View, node: str, uid: str | None, priority: int) -> list[tuple[str, PodRecord]]:
    """The pods nominated to ``node`` that a pod of ``priority`` (``uid``) must leave
    room for: equal or higher priority, not itself."""
    return [
        (other, record)
        for other, record in view.nominated.get(node, ())
        if other != uid and record.priority >= priority
    ]


def hold(
    pod: PodFacts,
    uid: str | None,
    priority: int,
    outcome: FilterOutcome,
    view: View,
    policies: Sequence[Policy],
) -> FilterOutcome:
    """``outcome`` with the passed nodes whose nominated pods leave ``pod`` no room
    moved to failed, saying which pods hold it."""
    if not view.nominated or not outcome.passed:
        return outcome
    passed: list[str] = []
    failed = outcome.failed
    for name in outcome.passed:
        holders = ahead(view, name, uid, priority) if name in view.nominated else ()
        facts = view.nodes.get(name) if holders else None
        if facts is None or facts.dra:  # a DRA node's devices are kube-scheduler's to count
            passed.append(name)
            continue
        why = fits_adding(pod, facts, [record for _, record in holders], view, policies)
        if why is None:
            passed.append(name)
            continue
        if failed is outcome.failed:
            failed = dict(outcome.failed)
        names = ", ".join(record.name or uid_ for uid_, record in holders[:3])
        more = f" and {len(holders) - 3} more" if len(holders) > 3 else ""
        failed[name] = (
            f"pods nominated here by preemption hold the room ({names}{more}, priority "
            f"{max(r.priority for _, r in holders)}): with them, {why[0]}"
        )
        metrics.NOMINATED_HELD.inc()
    if len(passed) == len(outcome.passed):
        return outcome
    return FilterOutcome(passed, failed, outcome.unresolvable)
