"""Preemption that agrees with the filter: kube-scheduler's preempt verb.

When a pod fits nowhere, kube-scheduler's DefaultPreemption (its PostFilter) finds,
on each node the filters failed as resolvable, the lower-priority pods whose eviction
would make the pod fit *by its own filter plugins*, then calls each extender with a
``preemptVerb`` (``callExtenders`` in ``pkg/scheduler/framework/preemption``): the
extender answers, per node, the victims it agrees to, and may drop nodes. An extender
without the verb is skipped, and may then refuse the node kube-scheduler evicted for.

Our filter counts GPUs kube-scheduler cannot see: a GPU the agent reports sick is not
offered though the device plugin still advertises it, and a share must fit one GPU,
not the node's total. So on each candidate node the extender recounts with the
proposed victims gone, by the filter itself (:func:`extender.engine.filter_nodes` on a
view where the node's pods are the ones left):

- **too few victims**: it adds the node's other GPU pods of lower priority than the
  preemptor as DefaultPreemption's ``SelectVictimsOnNode`` would: all of them removed,
  then put back one at a time, those whose eviction violates a PodDisruptionBudget
  first (extender/budgets.py, read from the API server for that node only), the most
  important first within each, each staying a victim only where the pod no longer
  fits with it back. The budgets violated by the pods added join kube-scheduler's
  count, and the node's victims are sorted most important first (kube-scheduler's
  node choice reads the first as the highest priority). Victims kube-scheduler
  proposed stay: they also made the pod's CPU and memory fit, which the extender does
  not check. Picks not bound yet are never victims (kube-scheduler would not find
  them), and pods nominated to the node of equal or higher priority count there, as
  in kube-scheduler's what-if;
- **no victim set helps** (the GPUs are sick, the product is wrong, or the node's
  lower-priority pods are too few): the node is dropped;
- **gangs**: a pod of a gang (a PodGroup it joins, a ``gpu-scheduler.io/group``, a
  Kueue workload: :func:`gpu_scheduler.podspec.pod_gang`) is evicted only with every
  other member the extender knows of, all on this node; a node where the victims
  would split a gang is dropped. Kueue's workload preemption (and, where it is on,
  kube-scheduler's workload-aware preemption) evicts gangs whole; DefaultPreemption,
  one pod at a time, would leave the rest holding their GPUs;
- **where to**: among the nodes left, only those the policies find no reason to
  avoid are kept when there are any: no ``PreferNoSchedule`` taint the pod does not
  tolerate, no spot capacity for a pod that avoids spot, no GPU product the
  restricted pods need (scarcity pressure at least :data:`SCARCE`) for a pod that
  may run elsewhere, no NVLink clique for a pod that is not in a placement group.
  kube-scheduler then picks among them by its own order (fewest PodDisruptionBudget
  violations, lowest victim priorities, fewest victims).

**Once per preemption.** kube-scheduler preempts asynchronously and tries the pod
again at once; its view may still count a victim that is gone, and it then proposes
another on the same node: evicted for nothing. So for :data:`RECENT` seconds after
the extender agreed to victims for a pod it agrees to none for it, and for
:data:`BEHIND_WINDOW` seconds it drops the pod's nominated node (only that one) where
the pod already fits there by the filter's count and kube-scheduler proposes only GPU
pods there (its view is behind; the pod is placed there at its next attempt). Without
such an agreement the victims stand: kube-scheduler may have nominated the node for
CPU, memory, ports or anti-affinity, which the extender does not count. What this
replica agreed is its own: the extender's Service keeps kube-scheduler's connections
on one replica (``sessionAffinity: ClientIP``), so the answers for one pod come from
the one that remembers them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from extender import metrics, wire
from extender.budgets import NOT_STARTED, BudgetReader, NodeBudgets, more_important
from extender.endpoints import Call
from extender.model import NodeFacts, PodFacts
from extender.nominated import ahead as nominated_ahead
from extender.policies import Policy
from extender.records import PodRecord, object_key
from extender.view import View
from extender.what_if import fits_with
from gpu_scheduler import contract
from gpu_scheduler.taints import intolerable

#: Scarcity pressure from which a GPU product is one the restricted pods need.
SCARCE = 0.5
#: At most this many pods are added to one node's victims.
MAX_ADDED = 64
#: Seconds after agreeing to victims for a pod during which it gets no more.
RECENT = 5.0
#: Seconds after agreeing to victims for a pod during which its nominated node may be
#: found behind (the victims' default graceful termination is 30 s).
BEHIND_WINDOW = 60.0


@dataclass(frozen=True)
class Victims:
    """One node's victims, by UID, and how many PodDisruptionBudgets evicting them
    violates (kube-scheduler's count)."""

    uids: tuple[str, ...]
    pdb_violations: int = 0


@dataclass
class Outcome:
    """The nodes kept with their victims, the nodes dropped with why, and the
    victims added per node (for the log)."""

    kept: dict[str, Victims] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    added: dict[str, int] = field(default_factory=dict)


def decide(
    pod: PodFacts,
    priority: int,
    proposed: Mapping[str, Victims],
    view: View,
    pods_on: Mapping[str, Sequence[tuple[str, PodRecord]]],
    gangs: Mapping[str, frozenset[str]],
    policies: Sequence[Policy],
    nominated: str | None = None,
    *,
    fixed: Collection[str] = (),
    budgets: Callable[[str], NodeBudgets | None] | None = None,
    agreed: bool = False,
    uid: str | None = None,
) -> Outcome:
    """The victims the extender agrees to on each node kube-scheduler proposed.

    ``pods_on``: each proposed node's GPU pods the cache counts there, (uid, record);
    ``gangs``: every gang of those pods -> the UIDs of all its members the cache
    counts, wherever they run; ``nominated``: the node the pod is nominated for;
    ``fixed``: pods that are never victims (picks not bound yet: kube-scheduler
    cannot find them); ``budgets``: a node's pods and disruption budgets, read only
    where victims are added; ``agreed``: this replica agreed to victims for the pod
    lately (``uid``). Pure but for what ``budgets`` reads."""
    out = Outcome()
    behind = _behind(pod, proposed, view, pods_on, policies, nominated) if agreed else None
    for name, victims in proposed.items():
        facts = view.nodes.get(name)
        if facts is None:
            out.dropped[name] = "node is not in the extender's cache"
            continue
        if name == nominated and behind is not None:
            out.dropped[name] = behind
            continue
        records = dict(pods_on.get(name, ()))
        chosen = list(dict.fromkeys(victims.uids))
        violations = victims.pdb_violations
        if not facts.dra:  # a DRA node's devices are kube-scheduler's to count
            ahead = [record for _, record in nominated_ahead(view, name, uid, priority)]
            kept = _fill(
                pod, priority, facts, records, chosen, ahead, fixed, view, policies, budgets
            )
            if isinstance(kept, str):
                out.dropped[name] = kept
                continue
            chosen, extra, added = kept
            violations += extra
            if added:
                out.added[name] = added
        split = _split_gang(chosen, records, gangs)
        if split is not None:
            out.dropped[name] = split
            continue
        out.kept[name] = Victims(tuple(chosen), violations)
    _prefer(pod, out, view)
    return out


def _fill(
    pod: PodFacts,
    priority: int,
    facts: NodeFacts,
    records: Mapping[str, PodRecord],
    chosen: list[str],
    ahead: Sequence[PodRecord],
    fixed: Collection[str],
    view: View,
    policies: Sequence[Policy],
    budgets: Callable[[str], NodeBudgets | None] | None,
) -> tuple[list[str], int, int] | str:
    """kube-scheduler's victims on one node, with what the extender must add for the
    pod to fit by its count: (victims sorted most important first, budget violations
    the added ones cause, how many were added); or why the node is dropped.

    As DefaultPreemption's ``SelectVictimsOnNode``: every lower-priority pod the
    extender may take is removed; if the pod then fits, each is put back, those whose
    removal violates a budget first, the most important first within each, and stays
    a victim only where the pod no longer fits with it back."""

    def fits(gone: Collection[str]) -> tuple[str, bool] | None:
        left = [r for u, r in sorted(records.items(), key=lambda i: i[1].seq) if u not in gone]
        return fits_with(pod, facts, [*left, *ahead], view, policies)

    why = fits(set(chosen))
    if why is None:
        return chosen, 0, 0
    if why[1]:
        return f"no victims here make the pod fit: {why[0]}"
    taken = set(chosen)
    eligible = sorted(
        (
            u
            for u, r in records.items()
            if r.priority < priority and u not in taken and u not in fixed
        ),
        key=lambda u: (records[u].priority, -records[u].seq),  # the likeliest victims first
    )
    removed = taken | set(eligible[:MAX_ADDED])
    why = fits(removed)
    if why is not None:
        return f"no victims here make the pod fit: {why[0]}"
    known = budgets(facts.name) if budgets is not None else None
    if known is None:
        return "no victims added: the node's pods and disruption budgets could not be read"
    ledger = known.ledger()
    for victim in sorted((known.pods[u] for u in chosen if u in known.pods), key=more_important):
        ledger.take(victim)
    order = sorted(eligible[:MAX_ADDED], key=lambda u: _importance(u, records, known))
    violating = [u for u in order if ledger.take(known.pods.get(u))]
    added: list[str] = []
    for u in [*violating, *(u for u in order if u not in violating)]:
        removed.discard(u)
        if fits(removed) is not None:
            removed.add(u)
            added.append(u)
    victims = sorted([*chosen, *added], key=lambda u: _importance(u, records, known))
    return victims, sum(1 for u in added if u in violating), len(added)


def _importance(
    uid: str, records: Mapping[str, PodRecord], known: NodeBudgets
) -> tuple[int, str, int]:
    """Most important first, as kube-scheduler orders victims; pods that started at
    the same time (or not yet) by the order the cache counted them."""
    record = records.get(uid)
    seq = record.seq if record is not None else 1 << 62
    found = known.pods.get(uid)
    if found is not None:
        return (*more_important(found), seq)
    return (-(record.priority if record is not None else 0), NOT_STARTED, seq)


def _behind(
    pod: PodFacts,
    proposed: Mapping[str, Victims],
    view: View,
    pods_on: Mapping[str, Sequence[tuple[str, PodRecord]]],
    policies: Sequence[Policy],
    nominated: str | None,
) -> str | None:
    """Why kube-scheduler's view of the pod's nominated node is behind the victims
    this replica agreed to there: the pod fits that node with no victims by the
    filter's count, and the victims proposed there are GPU pods the cache counts (so
    GPUs are what kube-scheduler thinks are missing); None otherwise."""
    victims = proposed.get(nominated) if nominated else None
    facts = view.nodes.get(nominated) if nominated else None
    if victims is None or facts is None or facts.dra or not victims.uids:
        return None
    records = dict(pods_on.get(facts.name, ()))
    if not all(uid in records for uid in victims.uids):
        return None
    left = sorted(records.values(), key=lambda r: r.seq)
    if fits_with(pod, facts, left, view, policies) is not None:
        return None
    return (
        f"the pod fits its nominated node {facts.name} with no victims by the extender's "
        "count: kube-scheduler's view is behind the victims agreed there"
    )


def _split_gang(
    chosen: Sequence[str], records: Mapping[str, PodRecord], gangs: Mapping[str, frozenset[str]]
) -> str | None:
    """Why evicting ``chosen`` would split a gang, or None."""
    evicted = set(chosen)
    for uid in chosen:
        record = records.get(uid)
        if record is None or record.gang is None:
            continue
        members = gangs.get(record.gang, frozenset((uid,)))
        if not members <= evicted:
            kept = len(members - evicted)
            return (
                f"the victims include a member of gang {record.gang} and leave {kept} of its "
                f"{len(members)} pods running: gangs are preempted whole (by Kueue) or not at all"
            )
    return None


def _prefer(pod: PodFacts, out: Outcome, view: View) -> None:
    """Keep only the nodes in the best tier of avoidance (module docstring)."""
    if len(out.kept) < 2:
        return
    tiers = {name: _avoid(pod, view.nodes[name], view) for name in out.kept}
    best = min(tiers.values())
    for name, tier in tiers.items():
        if tier != best:
            del out.kept[name]
            out.dropped[name] = "another node can be made free with less to avoid: " + ", ".join(
                reason for reason, worse in zip(AVOIDED, tier, strict=True) if worse
            )


#: What makes a node one to avoid for a preemptor, most important first.
AVOIDED = (
    "PreferNoSchedule taints the pod does not tolerate",
    "spot capacity",
    "a GPU product the restricted pods need",
    "an NVLink clique",
)


def _avoid(pod: PodFacts, node: NodeFacts, view: View) -> tuple[int, ...]:
    scarce = (
        pod.products is None
        and node.model is not None
        and view.pressure.get(node.model, 0.0) >= SCARCE
    )
    clique = pod.group is None and any(
        key == contract.LABEL_GPU_CLIQUE for key, _ in node.domains or ()
    )
    return (
        intolerable(pod.soft_tolerations, node.soft_taints) if node.soft_taints else 0,
        int(pod.spot == "avoid" and node.capacity_type == "spot"),
        int(scarce),
        int(clique),
    )


# --- the verb ---------------------------------------------------------------------
class PreemptCall(Call):
    """A preempt call, parsed: the pod, its priority, and kube-scheduler's proposal."""

    __slots__ = ("priority", "proposed")

    priority: int
    proposed: dict[str, Victims]


class Recent:
    """When this replica last agreed to victims for each pod: none again for
    :data:`RECENT` seconds, and its nominated node may be found behind for
    :data:`BEHIND_WINDOW` seconds (the victims' graceful termination)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._at: dict[str, float] = {}
        self._clock = clock
        self._lock = threading.Lock()

    def since(self, uid: str | None) -> float | None:
        """Seconds since victims were agreed for ``uid``, within BEHIND_WINDOW."""
        now = self._clock()
        with self._lock:
            for key in [k for k, at in self._at.items() if now - at >= BEHIND_WINDOW]:
                del self._at[key]
            at = self._at.get(uid) if uid else None
        return None if at is None else now - at

    def held(self, uid: str | None) -> float | None:
        """Seconds since victims were agreed for ``uid``, if that was recent."""
        since = self.since(uid)
        return since if since is not None and since < RECENT else None

    def note(self, uid: str | None) -> None:
        if uid:
            with self._lock:
                self._at[uid] = self._clock()


def parse_call(payload: Any, pod_facts: Callable[[Any], PodFacts], cache: Any) -> PreemptCall:
    pod, nodes = wire.parse_preemption(payload)
    call = PreemptCall(wire.ExtenderArgs(pod, list(nodes)), pod_facts(pod), cache.view)
    call.priority = wire.pod_priority(pod)
    call.proposed = {name: Victims(tuple(uids), pdb) for name, (uids, pdb) in nodes.items()}
    return call


def answer(
    call: PreemptCall, cache: Any, policies: Sequence[Policy], recent: Recent
) -> tuple[bytes, dict[str, Any], None]:
    """The preempt verb's answer and its log details."""
    uid = object_key(call.args.pod)
    held = recent.held(uid)
    details: dict[str, Any]
    if call.pod.error is not None:
        kept = {}
        details = {"kept": 0, "dropped": len(call.proposed), "why": call.pod.error}
    elif held is not None:
        kept = {}
        details = {"kept": 0, "dropped": len(call.proposed), "why": (
            f"victims were agreed for this pod {held:.1f}s ago: waiting for them to go"
        )}  # fmt: skip
        metrics.PREEMPTION_NODES.labels("dropped").inc(len(call.proposed))
    else:
        nominated = wire.nominated_node(call.args.pod)
        names = [*call.proposed, *([nominated] if nominated else [])]
        on, gangs, fixed = cache.preemption_pods(names)
        outcome = decide(
            call.pod,
            call.priority,
            call.proposed,
            call.view,
            on,
            gangs,
            policies,
            nominated,
            fixed=fixed,
            budgets=budget_reader(cache),
            agreed=recent.since(uid) is not None,
            uid=uid,
        )
        kept = outcome.kept
        if kept:
            recent.note(uid)
        details = {"kept": len(kept), "dropped": len(outcome.dropped)}
        if outcome.added:
            details["added"] = outcome.added
        if outcome.dropped:
            details["why"] = dict(list(outcome.dropped.items())[:8])
        metrics.PREEMPTION_NODES.labels("dropped").inc(len(outcome.dropped))
        metrics.PREEMPTION_NODES.labels("kept").inc(len(kept))
        metrics.PREEMPTION_NODES.labels("victims-added").inc(sum(outcome.added.values()))
    body = wire.preemption_result({n: (v.uids, v.pdb_violations) for n, v in kept.items()})
    return orjson.dumps(body), details, None


def budget_reader(cache: Any) -> BudgetReader:
    """A reader of budgets for one preempt call, over the recheck's client (no
    retries, short timeouts); one that reads nothing where the cache has none."""
    recheck = getattr(cache, "recheck", None)
    core, policy = getattr(recheck, "apis", (None, None))
    return BudgetReader(core, policy)
