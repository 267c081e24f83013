"""The webhook's Flask app: ``POST /mutate`` (AdmissionReview v1) and the ops endpoints.

Built by :func:`create_app`, the gunicorn app factory. TLS is gunicorn's (see
:mod:`gpu_scheduler.tls`); ``/readyz`` is 200 once the serving certificate is loaded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from flask import Flask, Response

from gpu_scheduler.http import BadInput, install_ops_endpoints, json_response, read_json_body
from webhook import metrics
from webhook.admission import review
from webhook.config import WebhookConfig, load_config
from webhook.mutate import CHANGES, OUTCOMES

log = logging.getLogger("webhook")

Ready = Callable[[], tuple[bool, str]]


def create_app(config: WebhookConfig | str | None = None, ready: Ready | None = None) -> Flask:
    """The app. ``ready`` reports the certificate state (``CertReloader.ready``)."""
    cfg = config if isinstance(config, WebhookConfig) else load_config(config)
    app = Flask("webhook")
    app.config["MAX_CONTENT_LENGTH"] = cfg.max_body_bytes
    install_ops_endpoints(app, ready or (lambda: (True, "TLS not managed by this process")))
    # Children resolved once: every outcome and change shows in /metrics from the start.
    reviews = {outcome: metrics.REVIEWS.labels(outcome) for outcome in OUTCOMES}
    mutations = {change: metrics.MUTATIONS.labels(change) for change in CHANGES}

    @app.post("/mutate")
    def mutate() -> Response:
        started = time.perf_counter()
        try:
            body, req, decision = review(read_json_body(cfg.max_body_bytes), cfg)
        except BadInput as exc:
            metrics.REVIEWS.labels("bad-input").inc()
            log.info("bad admission review", extra={"error": str(exc)})
            return json_response({"error": str(exc)}, 400)
        elapsed = time.perf_counter() - started
        metrics.LATENCY.observe(elapsed)
        reviews[decision.outcome].inc()
        for change in decision.changes:
            mutations[change].inc()
        log.info(
            "admission",
            extra={
                "uid": req.uid,
                "pod": req.pod_key,
                "operation": req.operation,
                "kind": req.kind.get("kind"),
                "dry_run": req.dry_run,
                "outcome": decision.outcome,
                "gpus": decision.gpus,
                "changes": list(decision.changes),
                "scheduler": decision.scheduler,
                "detail": decision.detail or None,
                "ms": round(elapsed * 1000, 3),
            },
        )
        return json_response(body)

    app.extensions["gpu_scheduler"] = {"config": cfg}
    return app
