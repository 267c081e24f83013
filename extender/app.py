"""The extender's Flask app: ``POST /filter`` and ``POST /prioritize`` (extender v1).

Built by :func:`create_app`, the gunicorn app factory. Each request names its
candidate nodes (kube-scheduler's ``nodeCacheCapable: true``); their facts, and the
pods bound to them, come from the :class:`ClusterCache` (list+watch), which the
factory starts in the worker that serves the requests.

The input contract (README, "Bad input"): a malformed *envelope* (not JSON, ``Pod``
not an object, ``NodeNames`` of the wrong shape, an element that is no node name) is
a 400 with a JSON reason, and so is a call that carries whole Node objects
(``nodeCacheCapable: false``: the reason names the fix, :data:`wire.NODE_OBJECTS`). A
malformed field *inside* the Pod fails every node with a reason naming the field
(scores 0); a node the cache could not read fails in ``FailedAndUnresolvableNodes``.
Nothing a client sends makes it answer 5xx.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from flask import Flask

from extender import choice, cluster, cluster_metrics, metrics, nominated, preemption, wire
from extender.cache import ClusterCache
from extender.config import ExtenderConfig, load_config
from extender.endpoints import Call, Endpoints, Then, VerbGuard
from extender.engine import (
    FilterOutcome,
    candidate_scores,
    filter_nodes,
    score_array,
    weighted_means,
)
from extender.explain import Decision, Explainer, decision, only_fit
from extender.model import NodeFacts, PodFacts, pod_facts
from extender.policies import Policy, build_policies
from extender.policies.gpu import share_gpu
from extender.policies.group import group_state
from extender.records import object_key
from gpu_scheduler.http import install_ops_endpoints

log = logging.getLogger("extender")

#: Why kube-scheduler picks for a pod whose claim lists devices in order of preference.
PRIORITIZED_CLAIM = "a DRA claim with a prioritized list (firstAvailable)"


class Decider:
    """Everything a call needs besides the HTTP: config, policies, the cluster cache."""

    def __init__(
        self, cfg: ExtenderConfig, cache: ClusterCache, explainer: Explainer | None = None
    ) -> None:
        self.cfg = cfg
        self.cache = cache
        self.explainer = explainer
        self.policies: list[Policy] = build_policies(cfg)

    def pod(self, obj: Any) -> PodFacts:
        return pod_facts(obj, self.cfg.default_placement)

    def parse(self, payload: Any) -> Call:
        # A name the view knows is a node name: only the others are checked, when
        # looked up (endpoints._lookup). The view is taken, and the names looked up,
        # when first read.
        args = wire.parse_args(payload)
        return Call(args, self.pod(args.pod), self.cache.view)

    def filter(self, req: Call) -> tuple[bytes, dict[str, Any], Then | None]:
        self.cache.forget(object_key(req.args.pod))  # placed anew: an earlier pick no longer counts
        outcome = filter_nodes(req.pod, req.args.names, req.nodes, req.view, self.policies)
        if not outcome.passed and (unknown := req.nodes.unknown()):
            # Nothing fits among the nodes this view knows, and kube-scheduler knows
            # nodes it does not (just added, or the cache is behind): answer an error,
            # which kube-scheduler retries within seconds, rather than park the pod
            # as unschedulable until some unrelated cluster event.
            metrics.RETRY_ANSWERS.labels("filter", "unknown-nodes").inc()
            message = (
                f"no known node fits, and {unknown} candidate(s) are not in the extender's "
                f"cache yet (view {req.view.age or 0:.0f}s old); retry shortly"
            )
            return orjson.dumps(wire.error_result(message)), {"retry": "unknown-nodes"}, None
        req, outcome, rechecked = self._recheck(req, outcome)
        uid = _uid(req.args.pod)
        if req.view.nominated:  # preemptors waiting for their victims (extender/nominated.py)
            outcome = nominated.hold(
                req.pod, uid, wire.pod_priority(req.args.pod), outcome, req.view, self.policies
            )
        asks = req.pod.gpus or req.pod.shares
        if self.explainer is not None and asks and uid and len(outcome.passed) == 1:
            only = outcome.passed[0]
            self.explainer.remember(
                only_fit(
                    req.pod.namespace,
                    req.pod.name,
                    uid,
                    req.pod.gpus,
                    only,
                    len(req.args.names),
                    outcome.failed | outcome.unresolvable,
                    req.pod.shares,
                    share_gpu(req.pod, req.view.nodes.get(only), req.view),
                )
            )
        metrics.child(metrics.NODES, "passed").inc(len(outcome.passed))
        metrics.child(metrics.NODES, "failed").inc(len(outcome.failed))
        metrics.child(metrics.NODES, "unresolvable").inc(len(outcome.unresolvable))
        details: dict[str, Any] = {
            "passed": len(outcome.passed),
            "failed": len(outcome.failed),
            "unresolvable": len(outcome.unresolvable),
        }
        if rechecked:
            details["rechecked"] = rechecked
        picker = self._picker(req, outcome.passed)
        if picker is not None:
            metrics.child(metrics.FILTER_PICKS, picker).inc()
            details["picker"] = picker
            if req.pod.preference is not None:
                details["preference"] = req.pod.preference
            elif picker == choice.SCHEDULER and self.cfg.filter_chooses:
                details["preference"] = PRIORITIZED_CLAIM
        if picker == choice.EXTENDER:
            picked, then = self._pick(req, outcome.passed, details)
            answer = FilterOutcome([picked], outcome.failed, outcome.unresolvable)
            return orjson.dumps(wire.filter_result(answer)), details, then
        if len(outcome.passed) == 1:  # kube-scheduler's only choice
            self.cache.assume(req.args.pod, outcome.passed[0])
        return orjson.dumps(wire.filter_result(outcome)), details, None

    def _picker(self, req: Call, passed: list[str]) -> str | None:
        """Who picks among the nodes that fit (extender/choice.py); None where there is
        nothing to pick (one node or none)."""
        if len(passed) < 2:
            return None
        if not self.cfg.filter_chooses or req.pod.preference is not None:
            return choice.SCHEDULER
        if req.pod.claims and not req.view.prioritized.isdisjoint(req.pod.claims):
            return choice.SCHEDULER  # DynamicResources scores its subrequests (firstAvailable)
        return choice.EXTENDER

    def _pick(self, req: Call, passed: list[str], details: dict[str, Any]) -> tuple[str, Then]:
        """The node filter answers alone (extender/choice.py), and what is left to do
        once the answer is written: remember the decision its Event explains."""
        call = self._passed(req, passed)
        nodes = call.nodes
        uid, explain = self._explaining(call)
        parts: dict[str, Sequence[float]] | None = {} if explain else None
        means = weighted_means(req.pod, nodes, req.view, self.policies, self.cfg, parts)
        at = nodes.position(choice.pick(req.pod, nodes, means))
        details["chose"] = passed[at]
        self.cache.assume(req.args.pod, passed[at])  # counted there until bound (cache_assumed)
        if uid is not None and not explain:
            details["explained"] = False
        elif uid is not None and self.explainer is not None:
            self.explainer.expect(uid)  # its binding may be seen before `then` runs

        def then(_: float) -> None:
            explainer = self.explainer
            if explainer is None or uid is None:
                return
            if parts is None:
                explainer.unexplained()
                return
            scores = candidate_scores(nodes, means)
            avoided = choice.avoided(req.pod, nodes, at)
            explainer.remember(self._decision(call, uid, scores, parts, first=at, avoided=avoided))

        return passed[at], then

    @staticmethod
    def _passed(req: Call, passed: list[str]) -> Call:
        """The call for the names filter passed (what a filter that picks ranks):
        where every candidate passed (usual: kube-scheduler's own filters came
        first), filter's rows, in this order."""
        every = len(passed) == len(req.args.names)
        nodes = req.nodes if every else req.view.candidates(passed)
        return Call(wire.ExtenderArgs(req.args.pod, passed), req.pod, req.view, nodes)

    def _recheck(self, req: Call, outcome: FilterOutcome) -> tuple[Call, FilterOutcome, int]:
        """kube-scheduler may be retrying the pod on an event the watch has not yet
        delivered (extender/recheck.py): before turning it away, read its few
        candidates again, and decide again where anything differed."""
        cache = self.cache
        if outcome.passed or cache.recheck is None or req.pod.error is not None:
            return req, outcome, 0
        changed = cache.recheck(req.args.names, wire.nominated_node(req.args.pod))
        view = cache.view()  # the watch may have caught up meanwhile, on its own
        if not changed and view.version == req.view.version:
            return req, outcome, 0
        req = Call(req.args, req.pod, view)
        outcome = filter_nodes(req.pod, req.args.names, req.nodes, req.view, self.policies)
        return req, outcome, changed

    def prioritize(self, req: Call) -> tuple[bytes, dict[str, Any], None]:
        self.cache.forget(object_key(req.args.pod))  # scored anew: an earlier pick no longer counts
        body, details, chosen = self._score(req)
        if self.explainer is not None and chosen is not None:
            self.explainer.remember(chosen)
        elif self.explainer is not None and details.get("explained") is False:
            self.explainer.unexplained()  # its Event counted dropped, as the writer would
        return body, details, None

    def _explaining(self, req: Call) -> tuple[str | None, bool]:
        """(the pod's UID where its placement would be explained, else None; whether
        to work the explanation out: only where its Event would not be dropped for
        the rate)."""
        explainer = self.explainer
        uid = _uid(req.args.pod)
        if explainer is None or (req.pod.gpus == 0 and not req.pod.shares) or uid is None:
            return None, False
        return uid, explainer.admit()

    def _decision(
        self,
        req: Call,
        uid: str,
        scores: Sequence[int],
        parts: dict[str, Sequence[float]],
        first: int | None = None,
        avoided: Callable[[int], bool] | None = None,
    ) -> Decision:
        return decision(
            req.pod.namespace,
            req.pod.name,
            uid,
            req.pod.gpus,
            req.args.names,
            scores,
            parts,
            self.cfg.weights,
            health=lambda i: _health(req.nodes.at(i)),
            note=self._group_note(req),
            first=first,
            avoided=avoided,
            shares=req.pod.shares,
            gpu=lambda i: share_gpu(req.pod, req.nodes.at(i), req.view),
        )

    def _score(self, req: Call) -> tuple[bytes, dict[str, Any], Decision | None]:
        """Prioritize's answer, its log details, and the decision to explain."""
        uid, explain = self._explaining(req)
        parts: dict[str, Sequence[float]] | None = {} if explain else None
        array = score_array(
            req.pod, req.nodes, req.view, self.policies, self.cfg, parts, req.args.names
        )
        chosen = None
        if uid is not None and parts is not None:
            chosen = self._decision(req, uid, array, parts)
        best = int(array.argmax()) if len(array) else None
        body = wire.host_priorities_json(req.args.names, array)
        details = {
            "best": req.args.names[best] if best is not None else None,
            "top": int(array[best]) if best is not None else None,
        }
        if uid is not None and not explain:
            details["explained"] = False
        return body, details, chosen

    def _group_note(self, req: Call) -> Callable[[int], str | None] | None:
        """For a pod of a placement group already placed somewhere: the words for a
        candidate (by position) that say which topology level drew it."""
        if req.pod.group is None or self.cfg.weight("group") == 0:
            return None
        state = group_state(req.pod, req.view, self.cfg.group_levels)
        if state is None:
            return None

        def note(i: int) -> str | None:
            facts = req.nodes.at(i)
            return state.describe(facts) if facts is not None else None

        return note


def _health(facts: NodeFacts | None) -> tuple[int, int] | None:
    """(GPUs a pod can be given, advertised) of a node with unhealthy GPUs; else None."""
    if facts is None or not facts.unhealthy:
        return None
    return facts.usable, facts.allocatable


def _uid(pod: Any) -> str | None:
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    uid = meta.get("uid") if isinstance(meta, dict) else None
    return uid if isinstance(uid, str) and 0 < len(uid) <= 128 else None


def create_app(
    config: ExtenderConfig | str | None = None,
    cache: ClusterCache | None = None,
    kubeconfig: str | None = None,
    *,
    heartbeat_namespace: str | None = None,
    guard: VerbGuard | None = None,
    tls_ready: Callable[[], tuple[bool, str]] | None = None,
    explainer: Explainer | None = None,
) -> Flask:
    """The app, deciding from ``cache``; without one it starts one (and the placement
    explainer) from ``kubeconfig`` (None: in-cluster). ``guard`` says who may call the
    verbs; ``tls_ready`` joins /readyz (the serving certificate loaded)."""
    cfg = config if isinstance(config, ExtenderConfig) else load_config(config)
    if cache is None:
        cache, explainer = cluster.start(kubeconfig, heartbeat_namespace, cfg.group_levels)
    decider = Decider(cfg, cache, explainer)
    endpoints = Endpoints(decider.parse, cache, cfg.max_body_bytes, guard or VerbGuard())
    app = Flask("extender")
    app.config["MAX_CONTENT_LENGTH"] = cfg.max_body_bytes

    def ready() -> tuple[bool, str]:
        if tls_ready is not None:
            ok, detail = tls_ready()
            if not ok:
                return ok, detail
        return cache.ready()

    install_ops_endpoints(app, ready)
    # the cluster's GPUs on /metrics, read from this cache when scraped
    cluster_metrics.COLLECTOR.source = lambda: cache.view() if cache.synced() else None
    app.add_url_rule(
        "/filter", "filter", lambda: endpoints.serve("filter", decider.filter), methods=["POST"]
    )
    app.add_url_rule(
        "/prioritize",
        "prioritize",
        lambda: endpoints.serve("prioritize", decider.prioritize),
        methods=["POST"],
    )
    recent = preemption.Recent()
    app.add_url_rule(
        "/preempt",
        "preempt",
        lambda: endpoints.serve(
            "preempt",
            lambda call: preemption.answer(call, cache, decider.policies, recent),
            lambda payload: preemption.parse_call(payload, decider.pod, cache),
        ),
        methods=["POST"],
    )
    app.extensions["gpu_scheduler"] = {"cache": cache, "config": cfg, "explainer": explainer}
    return app
