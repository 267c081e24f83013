"""``gpu-scheduler extender`` whose cluster cache lists a fake API (tests/fakeapi.py):
the real CLI, gunicorn worker and app, for the tests of the process that have no
control plane (HTTP framing, TLS, slow clients, the fuzz sample).

    GPU_SCHEDULER_FAKE_CLUSTER=cluster.json python -m tests.fake_extender --port=8888 ...

``cluster.json``: ``{"nodes": [Node, ...], "pods": [Pod, ...]}``, what the cache lists
(and then watches, with nothing more to say) before the worker serves. No heartbeat
Leases, no DRA kinds, no placement Events. Each worker lists its own, as the
extender does.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

ENV = "GPU_SCHEDULER_FAKE_CLUSTER"


def _start(
    kubeconfig: str | None, heartbeat_namespace: str | None = None, levels: Sequence[str] = ()
) -> tuple[Any, None]:
    """Stands for :func:`extender.cluster.start`: the cache, listed; no explainer."""
    from extender.cache import ClusterCache
    from tests.fakeapi import FakeCore

    with open(os.environ[ENV]) as f:
        cluster = json.load(f)
    cache = ClusterCache(levels=levels)
    cache.start(FakeCore(cluster.get("nodes", ()), cluster.get("pods", ())))
    for reflector in cache.reflectors.values():  # listed before the worker serves
        if not reflector.synced.wait(10):
            raise TimeoutError(f"{reflector.kind} never listed")
    return cache, None


def main(argv: Sequence[str]) -> int:
    from extender import cluster
    from gpu_scheduler.cli import main as cli

    cluster.start = _start  # create_app starts the cache through it, in each worker
    return cli(["extender", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
