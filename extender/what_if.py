"""The filter on one node as it would be with other pods on it: kube-scheduler's
what-if ``NodeInfo``, for the extender.

Preemption asks it with the victims gone (:func:`fits_with`, from the node's pods
left); a pod's filter asks it with the pods nominated to the node added
(:func:`fits_adding`, from the view's state of the node plus those pods), as
kube-scheduler's ``RunFilterPluginsWithNominatedPods`` and ``SelectVictimsOnNode``
do. Both run :func:`extender.engine.filter_nodes` itself on a view of that one node,
so there is one rule, the filter's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from extender.columns import FreeState, free_state
from extender.engine import candidates_of, filter_nodes
from extender.model import NodeFacts, PodFacts
from extender.policies import Policy
from extender.records import PodRecord
from extender.view import View
from gpu_scheduler import sharing
from gpu_scheduler.sharing import BoundPod, Gpu, usage

#: Why a pod does not fit a node, and whether no victims could help (unresolvable).
Refusal = tuple[str, bool]


def fits_with(
    pod: PodFacts,
    facts: NodeFacts,
    left: Iterable[PodRecord],
    view: View,
    policies: Sequence[Policy],
) -> Refusal | None:
    """Why ``pod`` does not fit ``facts``'s node when ``left`` are the GPU pods on it
    (in the order the node counted them); None when it fits."""
    left = list(left)
    used = sum(r.gpus for r in left)
    gpus = None
    if facts.shared is not None:
        bound = [BoundPod(r.key, r.gpus, r.shares) for r in left if r.gpus or r.shares]
        gpus, _ = usage(facts.shared.gpus, facts.shared.report, bound)
    state = free_state(
        facts,
        used,
        sum(r.cpu_milli for r in left if r.gpus or r.shares),
        sum(r.ram_mib for r in left if r.gpus or r.shares),
        gpus,
    )
    return _decide(pod, facts, view, used, state, gpus, policies)


def fits_adding(
    pod: PodFacts,
    facts: NodeFacts,
    added: Sequence[PodRecord],
    view: View,
    policies: Sequence[Policy],
) -> Refusal | None:
    """Why ``pod`` does not fit ``facts``'s node once ``added`` are placed there too
    (on top of what the view counts); None when it fits. A sharing node's added pods
    are fitted on its GPUs by the one rule (``sharing.fit``); one that does not fit
    takes what is left."""
    name = facts.name
    free = view.free.get(name)
    used = view.used_gpus(name)
    if free is None:
        free = free_state(facts, used, 0, 0, None)
    whole, cpu, ram, model = free
    gpus = view.shared_gpus(facts) if facts.shared is not None else None
    for record in added:
        whole -= record.gpus
        used += record.gpus
        cpu -= record.cpu_milli
        ram -= record.ram_mib
        if gpus is not None:
            placed = sharing.fit(gpus, record.shares, record.gpus)
            gpus = (
                _taken(gpus, record)
                if placed is None
                else sharing.after(gpus, placed, record.shares)
            )
    if gpus is not None:
        whole = min(whole, sum(1 for g in gpus if g.whole_free))
    return _decide(pod, facts, view, used, (whole, cpu, ram, model), gpus, policies)


def _taken(gpus: Sequence[Gpu], record: PodRecord) -> tuple[Gpu, ...]:
    """A pod that does not fit the GPUs as counted still holds what it asks: the
    largest pieces go first (an over-count, never an under-count)."""
    out = list(gpus)
    order = sorted(range(len(out)), key=lambda i: -out[i].free)
    for _ in range(record.gpus):
        if order:
            i = order.pop(0)
            out[i] = Gpu(out[i].uuid, out[i].capacity, 0, False)
    for need in record.shares:
        if order:
            i = order[0]
            g = out[i]
            out[i] = Gpu(g.uuid, g.capacity, max(g.free - need, 0), False)
    return tuple(out)


def _decide(
    pod: PodFacts,
    facts: NodeFacts,
    view: View,
    used: int,
    state: FreeState,
    gpus: Sequence[Gpu] | None,
    policies: Sequence[Policy],
) -> Refusal | None:
    name = facts.name
    what_if = one_node(view, facts, used, state, gpus)
    outcome = filter_nodes(pod, [name], candidates_of([name], [facts], what_if), what_if, policies)
    if outcome.passed:
        return None
    if name in outcome.unresolvable:
        return outcome.unresolvable[name], True
    return outcome.failed.get(name, "refused"), False


def one_node(
    view: View, facts: NodeFacts, used: int, state: FreeState, gpus: Sequence[Gpu] | None
) -> View:
    """``view`` with one node's usage as given."""
    name = facts.name
    return View(
        nodes={name: facts},
        used={name: used},
        free={name: state},
        mix=view.mix,
        gpus={name: tuple(gpus)} if gpus is not None else {},
        share_mix=view.share_mix,
        claim_shares=view.claim_shares,
        groups=view.groups,
        pressure=view.pressure,
        beats=view.beats,
        pods=view.pods,
        now=view.time,
        age=view.age,
        stale=view.stale,
    )
