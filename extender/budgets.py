"""PodDisruptionBudgets as kube-scheduler's preemption weighs them, for the victims the
extender adds.

kube-scheduler deletes victims (it does not evict them: the API server checks no
budget), so the only budget check is its own, in DefaultPreemption: of the pods it
would remove from a node, those whose removal takes a budget below zero are put back
first (``FilterVictimsWithPDBViolation`` / ``filterPodsWithPDBViolation``: a budget
of the pod's namespace whose non-empty selector matches the pod's labels, not already
listing the pod in ``status.disruptedPods``, each removal taking one of its
``status.disruptionsAllowed``), and the node's answer counts the violations. The
extender adds victims only where kube-scheduler's are too few by its own count (a sick
GPU, a share that must fit one GPU), and does it the same way: :class:`Ledger` is
that count, :func:`more_important` kube-scheduler's order of victims (higher
priority first, then the earlier started).

:class:`BudgetReader` reads what that needs, only for a node that needs victims
added (rare: the preempt verb, and there only such nodes): the node's pods (labels,
priority, start time) and the cluster's budgets, from the API server, within a small
time budget. A node whose budgets cannot be read gets no victims added.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_scheduler import podspec
from gpu_scheduler.jsondecode import decode_json

log = logging.getLogger("extender")

#: Seconds one preempt call may spend reading budgets and pods, in all.
READ_BUDGET = 1.0
#: Seconds one read may take.
READ_TIMEOUT = 0.5
#: A start time later than any (a pod not started yet counts as starting now).
NOT_STARTED = "~"


@dataclass(frozen=True, slots=True)
class NodePod:
    """What budgets and the victims' order read of one pod on the node."""

    uid: str
    namespace: str
    name: str
    priority: int
    start: str
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Budget:
    namespace: str
    name: str
    selector: Callable[[Mapping[str, str]], bool] | None  # None: matches nothing
    allowed: int
    disrupted: frozenset[str]


@dataclass(frozen=True)
class NodeBudgets:
    """A node's pods by UID, and the budgets of their namespaces."""

    pods: Mapping[str, NodePod]
    budgets: Sequence[Budget] = ()

    def ledger(self) -> Ledger:
        return Ledger(self.budgets)


@dataclass
class Ledger:
    """What removals are left to each budget as victims are taken."""

    budgets: Sequence[Budget]
    left: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.left = [b.allowed for b in self.budgets]

    def take(self, pod: NodePod | None) -> bool:
        """Count ``pod``'s removal; whether it violates a budget (one goes below 0)."""
        if pod is None or not pod.labels:
            return False
        violates = False
        for i, budget in enumerate(self.budgets):
            if budget.namespace != pod.namespace or budget.selector is None:
                continue
            if not budget.selector(pod.labels) or pod.name in budget.disrupted:
                continue
            self.left[i] -= 1
            violates = violates or self.left[i] < 0
        return violates


def more_important(pod: NodePod) -> tuple[int, str]:
    """Sort key, most important first: higher priority, then the earlier started."""
    return (-pod.priority, pod.start)


# --- reading the objects ----------------------------------------------------------
def node_pod(obj: Any) -> NodePod | None:
    """A Pod as the API server lists it; None for one without a uid."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(meta.get("uid"), str):
        return None
    spec, status = obj.get("spec"), obj.get("status")
    labels = meta.get("labels")
    start = status.get("startTime") if isinstance(status, Mapping) else None
    return NodePod(
        meta["uid"],
        str(meta.get("namespace") or "default"),
        str(meta.get("name") or ""),
        podspec.pod_priority(spec) if isinstance(spec, Mapping) else 0,
        start if isinstance(start, str) and start else NOT_STARTED,
        {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {},
    )


def budget(obj: Any) -> Budget | None:
    """A PodDisruptionBudget (policy/v1); None for one that cannot be read."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    status = obj.get("status") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return None
    status = status if isinstance(status, Mapping) else {}
    allowed = status.get("disruptionsAllowed")
    disrupted = status.get("disruptedPods")
    return Budget(
        str(meta.get("namespace") or "default"),
        str(meta.get("name") or ""),
        label_selector(spec.get("selector")),
        allowed if type(allowed) is int else 0,
        frozenset(disrupted) if isinstance(disrupted, Mapping) else frozenset(),
    )


def label_selector(selector: Any) -> Callable[[Mapping[str, str]], bool] | None:
    """A LabelSelector as a predicate on labels; None for a missing, empty or invalid
    one (kube-scheduler's preemption: such a budget matches no pod)."""
    if not isinstance(selector, Mapping):
        return None
    match = selector.get("matchLabels") or {}
    exprs = selector.get("matchExpressions") or []
    if not isinstance(match, Mapping) or not isinstance(exprs, list) or not (match or exprs):
        return None
    terms: list[tuple[str, str, frozenset[str]]] = []
    for key, value in match.items():
        if not isinstance(key, str) or not isinstance(value, str):
            return None
        terms.append((key, "In", frozenset((value,))))
    for expr in exprs:
        if not isinstance(expr, Mapping):
            return None
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if not isinstance(key, str) or op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return None
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return None
        if (op in ("In", "NotIn")) != bool(values):
            return None
        terms.append((key, op, frozenset(values)))

    def matches(labels: Mapping[str, str]) -> bool:
        for key, op, values in terms:
            present = key in labels
            if op == "In" and not (present and labels[key] in values):
                return False
            if op == "NotIn" and present and labels[key] in values:
                return False
            if op == "Exists" and not present:
                return False
            if op == "DoesNotExist" and present:
                return False
        return True

    return matches


def node_budgets(pods: Iterable[Any], budgets: Iterable[Any]) -> NodeBudgets:
    found = [p for p in map(node_pod, pods) if p is not None]
    namespaces = {p.namespace for p in found}
    kept = [b for b in map(budget, budgets) if b is not None and b.namespace in namespaces]
    return NodeBudgets({p.uid: p for p in found}, tuple(kept))


# --- the reader (I/O) ---------------------------------------------------------------
class BudgetReader:
    """``reader(node)``: the node's :class:`NodeBudgets` read from the API server, or
    None when that could not be done in time. One per preempt call (the budgets are
    listed once for all its nodes)."""

    def __init__(self, core: Any, policy: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self._core, self._policy, self._clock = core, policy, clock
        self._deadline = clock() + READ_BUDGET
        self._budgets: list[Any] | None = None

    def __call__(self, node: str) -> NodeBudgets | None:
        if self._core is None or self._policy is None:
            return None
        try:
            if self._budgets is None:
                self._budgets = list(
                    self._items(self._policy.list_pod_disruption_budget_for_all_namespaces)
                )
            pods = self._items(
                self._core.list_pod_for_all_namespaces,
                field_selector=f"spec.nodeName={node},status.phase!=Succeeded,status.phase!=Failed",
            )
        except Exception as exc:
            log.warning(
                "could not read the node's pods and disruption budgets; no victims added there",
                extra={"node": node, "error": repr(exc)[:300]},
            )
            return None
        return node_budgets(pods, self._budgets)

    def _items(self, call: Callable[..., Any], **params: Any) -> Any:
        left = self._deadline - self._clock()
        if left <= 0:
            raise TimeoutError(f"the {READ_BUDGET:.1f} s for reading budgets are spent")
        response = call(_preload_content=False, _request_timeout=min(READ_TIMEOUT, left), **params)
        try:
            data = decode_json(response.data)
        finally:
            response.release_conn()
        items = data.get("items") if isinstance(data, Mapping) else None
        return items if isinstance(items, list) else ()
