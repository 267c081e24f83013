"""``/healthz``, ``/readyz`` and ``/metrics`` served from a thread: the ops server of
the agent and of the certificate controller."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from flask import Flask

from gpu_scheduler.http import install_ops_endpoints

Check = Callable[[], tuple[bool, str]]


def create_app(ready: Check, alive: Check | None = None) -> Flask:
    app = Flask("gpu_scheduler.ops")
    install_ops_endpoints(app, ready, alive)
    return app


def start_ops_server(host: str, port: int, ready: Check, alive: Check | None = None) -> Any:
    """A werkzeug server on a daemon thread; returns it (call ``shutdown()``).
    ``alive`` answers /healthz (200 or 503), ``ready`` /readyz."""
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = make_server(host, port, create_app(ready, alive), threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="ops-http", daemon=True)
    thread.start()
    return server
