"""The extender's HTTP edge: who may call the verbs (:class:`VerbGuard`), each call
parsed (:class:`Call`), and each verb's request from the guard to the logged answer
(:class:`Endpoints`); the decisions themselves are :class:`extender.app.Decider`'s."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flask import Response, request

from extender import metrics, wire
from extender.cache import ClusterCache
from extender.columns import Candidates
from extender.model import PodFacts
from extender.view import View
from gpu_scheduler.http import BadInput, json_error, json_response, read_json_body
from gpu_scheduler.worker import CLIENT_CERT_KEY, TLS_KEY

log = logging.getLogger("extender")

NOT_SYNCED = "the extender's cluster cache has not synced yet, retry shortly: "


class Call:
    """One extender call, parsed: the candidates in order with their facts.

    The view is taken when first read (``view`` may be the function that gives it).
    The names are looked up in the view when ``nodes`` is first read; a malformed name
    is :class:`BadInput` then."""

    __slots__ = ("_nodes", "_source", "_view", "args", "pod")

    def __init__(
        self,
        args: wire.ExtenderArgs,
        pod: PodFacts,
        view: View | Callable[[], View],
        nodes: Candidates | None = None,
    ) -> None:
        self.args, self.pod, self._nodes = args, pod, nodes
        if isinstance(view, View):
            self._view, self._source = view, None
        else:
            self._view, self._source = None, view

    @property
    def view(self) -> View:
        if self._view is None:
            assert self._source is not None
            self._view = self._source()
        return self._view

    def taken_view(self) -> View | None:
        """The view, if this call has read it (None: it had no need)."""
        return self._view

    @property
    def nodes(self) -> Candidates:
        if self._nodes is None:
            self._nodes = _lookup(self.view, self.args.names)
        return self._nodes


def _lookup(view: View, names: list[str]) -> Candidates:
    """The view's rows for these names, in order."""
    try:
        batch = view.candidates(names)
    except TypeError:  # an element that cannot even be hashed is no node name
        wire.check_names_field(names)
        raise
    if not batch.distinct:  # some are not known, or one repeats: check them all
        wire.check_names_field(names)
    return batch


@dataclass(frozen=True)
class VerbGuard:
    """Who may call the verbs: over TLS only (``tls``), and with a client certificate
    the TLS layer verified against the client CA (``client_cert``; only kube-scheduler
    holds one). The ops endpoints are open on every listener."""

    tls: bool = False
    client_cert: bool = False

    def refusal(self, verb: str) -> Response | None:
        environ = request.environ
        if self.tls and not environ.get(TLS_KEY):
            metrics.REQUESTS.labels(verb, "403").inc()
            return json_error(403, f"/{verb} is served on the extender's TLS port only")
        if self.client_cert and not environ.get(CLIENT_CERT_KEY):
            metrics.REQUESTS.labels(verb, "403").inc()
            return json_error(
                403, f"/{verb} needs a client certificate signed by the extender's client CA"
            )
        return None


#: What a verb's decision leaves to do once its answer is written, given the call's
#: handler time in seconds (a filter that picks: remember the decision its Event
#: explains).
Then = Callable[[float], None]


class Endpoints:
    """``/filter``, ``/prioritize`` and ``/preempt``: guard, sync check, parse, decide,
    log."""

    def __init__(
        self,
        parse: Callable[[Any], Call],
        cache: ClusterCache,
        max_body: int,
        guard: VerbGuard,
    ) -> None:
        self.parse, self.cache, self.max_body, self.guard = parse, cache, max_body, guard

    def serve(
        self,
        verb: str,
        decide: Callable[[Any], tuple[bytes, dict[str, Any], Then | None]],
        parse: Callable[[Any], Call] | None = None,
    ) -> Response:
        started = time.perf_counter()
        refusal = self.guard.refusal(verb)
        if refusal is not None:
            return refusal
        cache = self.cache
        if not cache.synced():
            # Error (or a 5xx) makes kube-scheduler retry the pod within seconds; an
            # answer failing every node as unknown would park it as unschedulable.
            metrics.RETRY_ANSWERS.labels(verb, "not-synced").inc()
            message = NOT_SYNCED + cache.ready()[1]
            if verb == "filter":
                return json_response(wire.error_result(message))
            return json_response({"error": message}, 503)
        try:
            req = (parse or self.parse)(read_json_body(self.max_body))
            payload, details, then = decide(req)
        except BadInput as exc:
            metrics.REQUESTS.labels(verb, "400").inc()
            log.info("bad extender call", extra={"verb": verb, "error": str(exc)})
            body = {"error": str(exc)}
            if verb == "filter":
                body |= wire.error_result("the request was malformed; see error")
            return json_response(body, 400)
        elapsed = time.perf_counter() - started
        response = Response(payload, mimetype="application/json")
        # Run once the answer is written (gunicorn closes the response then), off
        # kube-scheduler's serial cycle: what the decision left to do, then the
        # call's metrics and log line.
        response.call_on_close(lambda: self._after(verb, req, elapsed, details, then))
        return response

    @staticmethod
    def _after(
        verb: str,
        req: Call,
        elapsed: float,
        details: dict[str, Any],
        then: Then | None,
    ) -> None:
        if then is not None:
            then(elapsed)
        metrics.child(metrics.LATENCY, verb).observe(elapsed)
        metrics.child(metrics.REQUESTS, verb, "200").inc()
        if not log.isEnabledFor(logging.INFO):
            return
        view = req.taken_view()
        log.info(
            verb,
            extra={
                "pod": req.pod.key,
                "gpus": req.pod.gpus,
                "nodes": len(req.args.names),
                "pod_error": req.pod.error,
                "view_age_s": None if view is None or view.age is None else round(view.age, 1),
                # bound pods the view holds: what a bench compares with
                # the bindings the API server had made, to see the view's lag
                "view_pods": None if view is None else view.pods,
                "ms": round(elapsed * 1000, 3),
                **details,
            },
        )
