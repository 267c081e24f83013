"""Run a Flask app factory under gunicorn, in-process (no shell-out, no config file)."""

from __future__ import annotations

import atexit
import gc
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication

from gpu_scheduler.worker import worker_class

log = logging.getLogger(__name__)


class _Server(BaseApplication):
    def __init__(self, factory: Callable[[], Flask], options: dict[str, Any]) -> None:
        self._factory = factory
        self._options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            if value is not None:
                self.cfg.set(key, value)

    def load(self) -> Flask:
        return self._factory()


def _post_worker_init(worker: Any) -> None:
    # Everything imported and built so far (the kubernetes client's models, Flask) lives
    # as long as the worker: keep it out of the cyclic collector's full passes, which
    # otherwise show up as tail latency on the scheduler's hot path.
    gc.collect()
    gc.freeze()


def _heartbeat_dir() -> str | None:
    """Where gunicorn's worker heartbeat file goes: /dev/shm (a tmpfs in every pod)
    when it can be written. The worker touches that file on every turn of its loop,
    and on a disk-backed /tmp (an emptyDir on the node's disk) a touch can wait on
    the filesystem's journal: gunicorn's own documentation warns of it."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def serve(
    factory: Callable[[], Flask],
    *,
    host: str,
    port: int,
    workers: int = 1,
    threads: int = 4,
    timeout: int = 30,
    max_body: int,
    request_deadline: float = 10.0,
    plain_port: int | None = None,
    **options: Any,
) -> None:
    """Serve until SIGTERM/SIGINT. Extra ``options`` are gunicorn settings.

    The factory runs in each worker after the fork (no preload), so background
    threads it starts (caches, watches) live in the worker that serves requests.
    With several workers, call :func:`metrics_dir_for` first (before anything
    imports prometheus_client) so that metrics are aggregated over the workers.
    """

    def address(number: int) -> str:
        return f"[{host}]:{number}" if ":" in host else f"{host}:{number}"

    binds = [address(port)] + ([address(plain_port)] if plain_port else [])
    settings: dict[str, Any] = {
        "bind": binds,
        "workers": workers,
        "threads": threads,
        "worker_class": worker_class(
            max_body, request_deadline, frozenset([plain_port] if plain_port else [])
        ),
        "timeout": timeout,
        "graceful_timeout": 20,
        "keepalive": 75,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": "warning",
        "logger_class": "gunicorn.glogging.Logger",
        "child_exit": _child_exit if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else None,
        "post_worker_init": _post_worker_init,
        "worker_tmp_dir": _heartbeat_dir(),
    }
    settings.update(options)
    log.info("serving", extra={"bind": settings["bind"], "workers": workers, "threads": threads})
    _Server(factory, settings).run()


def metrics_dir_for(workers: int) -> None:
    """With several workers, point prometheus_client at a fresh multiprocess directory.

    prometheus_client picks its value store when it is imported, so this must run
    before any module that defines metrics is imported. The directory goes at exit.
    """
    if workers <= 1 or os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    path = tempfile.mkdtemp(prefix="gpu-scheduler-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    atexit.register(shutil.rmtree, path, ignore_errors=True)
