"""The extender's Flask app: ``POST /filter`` and ``POST /prioritize`` (extender v1).

Built by :func:`create_app`, the gunicorn app factory. ``node_source="args"`` decides
from the Node objects in each request; ``"cluster"`` from the :class:`ClusterCache`
(list+watch), which the factory starts in the worker that serves the requests.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from flask import Flask, Response

from extender import metrics, wire
from extender.cache import ClusterCache, StaticView
from extender.config import ExtenderConfig, load_config
from extender.engine import filter_nodes, score_nodes
from extender.model import NodeFacts, node_facts, pod_facts
from extender.policies import ClusterView, build_policies
from gpu_scheduler.http import BadInput, install_ops_endpoints, json_response, read_json_body

log = logging.getLogger("extender")


def create_app(
    config: ExtenderConfig | str | None = None,
    node_source: str = "args",
    cache: ClusterCache | None = None,
    kubeconfig: str | None = None,
) -> Flask:
    cfg = config if isinstance(config, ExtenderConfig) else load_config(config)
    if node_source not in ("args", "cluster"):
        raise ValueError(f"node_source must be args or cluster, not {node_source!r}")
    if node_source == "cluster" and cache is None:
        from gpu_scheduler.kube import core_api

        cache = ClusterCache()
        cache.start(core_api(kubeconfig))
    policies = build_policies(cfg)
    static = StaticView()
    app = Flask("extender")
    app.config["MAX_CONTENT_LENGTH"] = cfg.max_body_bytes

    def ready() -> tuple[bool, str]:
        return cache.ready() if cache is not None else (True, "args mode: stateless")

    install_ops_endpoints(app, ready)

    def candidates(args: wire.ExtenderArgs) -> tuple[list[NodeFacts | None], ClusterView]:
        view: ClusterView = cache if cache is not None else static
        if args.nodes is not None:
            try:
                return [node_facts(node) for node in args.nodes], view
            except ValueError as exc:
                raise BadInput(f"ExtenderArgs.Nodes: {exc}") from exc
        if cache is None:
            raise BadInput(
                "NodeNames sent, but this extender runs with --node-source args: set "
                "nodeCacheCapable: false in the scheduler's extender config, or run "
                "the extender with --node-source cluster"
            )
        return cache.lookup(args.names), view

    def decide(verb: str) -> tuple[wire.ExtenderArgs, Any, list[NodeFacts | None], ClusterView]:
        args = wire.parse_args(read_json_body(cfg.max_body_bytes))
        try:
            pod = pod_facts(args.pod, cfg.default_placement)
        except ValueError as exc:
            raise BadInput(f"ExtenderArgs.Pod: {exc}") from exc
        nodes, view = candidates(args)
        return args, pod, nodes, view

    @app.post("/filter")
    def filter_() -> Response:
        started = time.perf_counter()
        try:
            args, pod, nodes, view = decide("filter")
        except BadInput as exc:
            metrics.REQUESTS.labels("filter", "400").inc()
            return json_response(wire.error_result(str(exc)) | {"error": str(exc)}, 400)
        outcome = filter_nodes(pod, args.names, nodes, view, policies)
        body = wire.filter_result(args, outcome)
        elapsed = time.perf_counter() - started
        metrics.LATENCY.labels("filter").observe(elapsed)
        metrics.REQUESTS.labels("filter", "200").inc()
        metrics.NODES.labels("passed").inc(len(outcome.passed))
        metrics.NODES.labels("failed").inc(len(outcome.failed))
        metrics.NODES.labels("unresolvable").inc(len(outcome.unresolvable))
        log.info(
            "filter",
            extra={
                "pod": pod.key,
                "gpus": pod.gpus,
                "nodes": len(args.names),
                "passed": len(outcome.passed),
                "failed": len(outcome.failed),
                "unresolvable": len(outcome.unresolvable),
                "ms": round(elapsed * 1000, 3),
            },
        )
        return json_response(body)

    @app.post("/prioritize")
    def prioritize() -> Response:
        started = time.perf_counter()
        try:
            args, pod, nodes, view = decide("prioritize")
        except BadInput as exc:
            metrics.REQUESTS.labels("prioritize", "400").inc()
            return json_response({"error": str(exc)}, 400)
        scores = score_nodes(pod, nodes, view, policies, cfg)
        body = wire.host_priorities(args.names, scores)
        elapsed = time.perf_counter() - started
        metrics.LATENCY.labels("prioritize").observe(elapsed)
        metrics.REQUESTS.labels("prioritize", "200").inc()
        best = scores.index(max(scores)) if scores else None
        log.info(
            "prioritize",
            extra={
                "pod": pod.key,
                "gpus": pod.gpus,
                "nodes": len(args.names),
                "best": args.names[best] if best is not None else None,
                "top": scores[best] if best is not None else None,
                "ms": round(elapsed * 1000, 3),
            },
        )
        return json_response(body)

    app.extensions["gpu_scheduler"] = {"cache": cache, "config": cfg}
    return app
