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
  preemptor, the lowest priority first (then the most recently counted), one at a
  time, until the pod fits. kube-scheduler evicts what the answer names (its pods on
  that node, by UID). Victims kube-scheduler proposed stay: they also made the pod's
  CPU and memory fit, which the extender does not check;
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
the extender agreed to victims for a pod it agrees to none for it (each replica
remembers its own answers), and it agrees to none where the pod already fits its
nominated node by the filter's count and kube-scheduler proposes only GPU pods there
(its view is behind; the pod is placed there at its next attempt).

The PodDisruptionBudget violations the answer reports are kube-scheduler's count for
its victims: the extender does not read budgets, so a victim it adds is not counted
against one (it adds only pods of lower priority than the preemptor, as
kube-scheduler would).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from extender import metrics, wire
from extender.columns import free_state
from extender.endpoints import Call
from extender.engine import candidates_of, filter_nodes
from extender.model import NodeFacts, PodFacts
from extender.policies import Policy
from extender.records import PodRecord, object_key
from extender.view import View
from gpu_scheduler import contract, podspec
from gpu_scheduler.sharing import BoundPod, usage
from gpu_scheduler.taints import intolerable

#: Scarcity pressure from which a GPU product is one the restricted pods need.
SCARCE = 0.5
#: At most this many pods are added to one node's victims.
MAX_ADDED = 64
#: Seconds after agreeing to victims for a pod during which it gets no more.
RECENT = 5.0


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
) -> Outcome:
    """The victims the extender agrees to on each node kube-scheduler proposed.

    ``pods_on``: each proposed node's GPU pods the cache counts there, (uid, record);
    ``gangs``: every gang of those pods -> the UIDs of all its members the cache
    counts, wherever they run; ``nominated``: the node the pod is nominated for. Pure."""
    out = Outcome()
    behind = _behind(pod, proposed, view, pods_on, policies, nominated)
    if behind is not None:
        out.dropped = dict.fromkeys(proposed, behind)
        return out
    for name, victims in proposed.items():
        facts = view.nodes.get(name)
        if facts is None:
            out.dropped[name] = "node is not in the extender's cache"
            continue
        records = dict(pods_on.get(name, ()))
        chosen = list(dict.fromkeys(victims.uids))
        if not facts.dra:  # a DRA node's devices are kube-scheduler's to count
            why = _fit(pod, facts, records, chosen, view, policies)
            extra = sorted(
                (
                    (record.priority, -record.seq, uid)
                    for uid, record in records.items()
                    if record.priority < priority and uid not in chosen
                ),
            )[:MAX_ADDED]
            added = 0
            for _, _, uid in extra:
                if why is None or why[1]:
                    break
                chosen.append(uid)
                added += 1
                why = _fit(pod, facts, records, chosen, view, policies)
            if why is not None:
                out.dropped[name] = f"no victims here make the pod fit: {why[0]}"
                continue
            if added:
                out.added[name] = added
        split = _split_gang(chosen, records, gangs)
        if split is not None:
            out.dropped[name] = split
            continue
        out.kept[name] = Victims(tuple(chosen), victims.pdb_violations)
    _prefer(pod, out, view)
    return out


def _behind(
    pod: PodFacts,
    proposed: Mapping[str, Victims],
    view: View,
    pods_on: Mapping[str, Sequence[tuple[str, PodRecord]]],
    policies: Sequence[Policy],
    nominated: str | None,
) -> str | None:
    """Why kube-scheduler's view is behind its last preemption for this pod: the pod
    fits its nominated node with no victims by the filter's count, and the victims
    proposed there are GPU pods the cache counts (so GPUs are what kube-scheduler
    thinks are missing); None otherwise."""
    victims = proposed.get(nominated) if nominated else None
    facts = view.nodes.get(nominated) if nominated else None
    if victims is None or facts is None or facts.dra or not victims.uids:
        return None
    records = dict(pods_on.get(facts.name, ()))
    if not all(uid in records for uid in victims.uids):
        return None
    if _fit(pod, facts, records, (), view, policies) is not None:
        return None
    return (
        f"the pod fits its nominated node {facts.name} with no victims by the extender's "
        "count: kube-scheduler's view is behind its last preemption"
    )


def _fit(
    pod: PodFacts,
    facts: NodeFacts,
    records: Mapping[str, PodRecord],
    gone: Sequence[str],
    view: View,
    policies: Sequence[Policy],
) -> tuple[str, bool] | None:
    """Why the pod does not fit ``facts``'s node once ``gone`` have left, and whether
    that is unresolvable (no victims can help); None when it fits."""
    name = facts.name
    missing = set(gone)
    left = [(uid, r) for uid, r in records.items() if uid not in missing]
    left.sort(key=lambda item: item[1].seq)
    used = sum(r.gpus for _, r in left)
    gpus = None
    if facts.shared is not None:
        bound = [BoundPod(r.key, r.gpus, r.shares) for _, r in left if r.gpus or r.shares]
        gpus, _ = usage(facts.shared.gpus, facts.shared.report, bound)
    state = free_state(
        facts,
        used,
        sum(r.cpu_milli for _, r in left if r.gpus or r.shares),
        sum(r.ram_mib for _, r in left if r.gpus or r.shares),
        gpus,
    )
    what_if = _with_node(view, facts, used, state, gpus)
    outcome = filter_nodes(pod, [name], candidates_of([name], [facts], what_if), what_if, policies)
    if outcome.passed:
        return None
    if name in outcome.unresolvable:
        return outcome.unresolvable[name], True
    return outcome.failed.get(name, "refused"), False


def _with_node(view: View, facts: NodeFacts, used: int, state, gpus) -> View:  # type: ignore[no-untyped-def]
    """``view`` with one node's usage as given (its other pods gone)."""
    name = facts.name
    return View(
        nodes={name: facts},
        used={name: used},
        free={name: state},
        mix=view.mix,
        gpus={name: gpus} if gpus is not None else {},
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
    """The pods this replica agreed to victims for, until :data:`RECENT` passes."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._until: dict[str, float] = {}
        self._clock = clock
        self._lock = threading.Lock()

    def held(self, uid: str | None) -> float | None:
        """Seconds since victims were agreed for ``uid``, if that was recent."""
        now = self._clock()
        with self._lock:
            for key in [k for k, until in self._until.items() if until <= now]:
                del self._until[key]
            until = self._until.get(uid) if uid else None
        return None if until is None else RECENT - (until - now)

    def note(self, uid: str | None) -> None:
        if uid:
            with self._lock:
                self._until[uid] = self._clock() + RECENT


def parse_call(payload: Any, pod_facts: Callable[[Any], PodFacts], cache: Any) -> PreemptCall:
    pod, nodes = wire.parse_preemption(payload)
    call = PreemptCall(wire.ExtenderArgs(pod, list(nodes)), pod_facts(pod), cache.view)
    spec = pod.get("spec")
    call.priority = podspec.pod_priority(spec) if isinstance(spec, Mapping) else 0
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
        on, gangs = cache.preemption_pods(names)
        outcome = decide(
            call.pod, call.priority, call.proposed, call.view, on, gangs, policies, nominated
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
