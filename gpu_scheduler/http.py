"""What every HTTP server of ours shares: JSON errors, bounded bodies, ops endpoints.

``/healthz`` (the process answers), ``/readyz`` (it can do its job: caches synced,
certificates loaded) and ``/metrics`` (Prometheus; aggregated over gunicorn workers
when ``PROMETHEUS_MULTIPROC_DIR`` is set, as :mod:`gpu_scheduler.serving` does).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import orjson
from flask import Flask, Response, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)
from werkzeug.exceptions import HTTPException

from gpu_scheduler.textclip import clip_text

log = logging.getLogger(__name__)

#: The longest error message an answer carries.
MAX_MESSAGE = 2048


class BadInput(ValueError):
    """Input the caller must fix: answered with 400 and this message (cut to a bound:
    values in it come from the request)."""

    def __init__(self, message: str) -> None:
        super().__init__(clip_text(message, MAX_MESSAGE))


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status=status, mimetype="application/json")


def json_error(status: int, message: str) -> Response:
    return json_response({"error": message}, status)


def read_json_body(max_bytes: int) -> Any:
    """The request body parsed as JSON, or :class:`BadInput` saying what is wrong."""
    length = request.content_length
    if length is not None and length > max_bytes:
        raise BadInput(f"request body of {length} bytes is over the limit of {max_bytes}")
    if length is not None:
        body = request.stream.read(length)
    else:
        # Chunked: read in pieces (a read(limit) would allocate the whole limit).
        parts, size = [], 0
        while chunk := request.stream.read(1 << 20):
            size += len(chunk)
            if size > max_bytes:
                raise BadInput(f"request body is over the limit of {max_bytes} bytes")
            parts.append(chunk)
        body = b"".join(parts)
    if not body:
        raise BadInput("empty request body; expected JSON")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"request body is not JSON: {exc}") from exc


#: Collectors that read this process's own state when scraped (the extender's cluster
#: view: extender/cluster_metrics.py), served beside the others. Under several workers
#: the worker that answers the scrape serves its own: each holds the whole cluster, so
#: that is one series, not a sum or a pick over workers' files that outlive their data.
LIVE = CollectorRegistry()


def metrics_payload() -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry) + generate_latest(LIVE)
    return generate_latest(REGISTRY) + generate_latest(LIVE)


def install_ops_endpoints(
    app: Flask,
    ready: Callable[[], tuple[bool, str]],
    alive: Callable[[], tuple[bool, str]] | None = None,
) -> None:
    """``/healthz``, ``/readyz``, ``/metrics`` and JSON answers for HTTP errors.
    ``/healthz`` is 200 while the process answers, unless ``alive`` says otherwise
    (503: the liveness probe then restarts the container)."""

    @app.get("/healthz")
    def healthz() -> Response:
        if alive is not None:
            ok, detail = alive()
            if not ok:
                return json_response({"status": "unhealthy", "detail": detail}, 503)
        return json_response({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        ok, detail = ready()
        return json_response({"ready": ok, "detail": detail}, 200 if ok else 503)

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(metrics_payload(), mimetype=CONTENT_TYPE_LATEST)

    @app.errorhandler(BadInput)
    def bad_input(exc: BadInput) -> Response:
        return json_error(400, str(exc))

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        return json_error(exc.code or 500, clip_text(exc.description or exc.name, MAX_MESSAGE))

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Response:
        # A bug of ours, never bad input (the fuzz harness holds that): say so in JSON.
        log.exception("unexpected error", extra={"error": clip_text(repr(exc), 512)})
        return json_error(500, f"internal error: {type(exc).__name__}")
