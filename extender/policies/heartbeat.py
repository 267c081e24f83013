"""heartbeat: no new GPU pods on a node whose gpu-scheduler agent has gone silent.

The heartbeat is the agent's Lease (named as the node, in the install's namespace,
``contract.LEASE_LABEL``, which the cluster cache watches). A node with no such Lease
is not agent-managed (labelled by GPU Feature Discovery, or its agent is gone: the
Lease is owned by the agent's Pod and goes with it) and is trusted as it is: a
heartbeat can never be left behind to refuse a node forever. The old
``gpu-scheduler.io/agent-heartbeat`` Node annotation is not read.

The guard. The policy must not turn the extender's own trouble into a fleet-wide
outage: heartbeats age against the clock, so a cache that stopped hearing from the
API server sees every agent go silent after ``heartbeatWindow``. It therefore stops
filtering, says so in ``gpu_scheduler_extender_heartbeat_guard_tripped`` and in the
log, while

- the view is stale (the API server has said nothing for ``STALE_AFTER`` seconds), or
- more than half of the agent-managed nodes look silent at once, and at least
  :data:`GUARD_MIN_SILENT` of them: agents do not fail together, a partition or a
  stale view does. This counts every agent-managed node the cache knows, not only
  the candidates of the call.

A silent node fails as *unresolvable*: kube-scheduler's preemption must not evict pods
from a node the extender will keep refusing. kube-scheduler still retries the pod on
every cluster event, so the node is used again once its agent renews its Lease
(a Lease is not an event kube-scheduler watches: the next pod or node change, or its
periodic flush of unschedulable pods within 5 minutes, brings the pod back).
"""

from __future__ import annotations

import logging
import threading
from typing import ClassVar

import numpy as np

from extender import metrics
from extender.columns import Candidates
from extender.model import NodeFacts, PodFacts
from extender.policies.base import ClusterView, Policy
from gpu_scheduler import contract

log = logging.getLogger(__name__)

#: The guard needs more than this share of agents silent at once...
GUARD_SHARE = 0.5
#: ...and at least this many of them.
GUARD_MIN_SILENT = 2


class HeartbeatPolicy(Policy):
    name: ClassVar[str] = "heartbeat"
    unresolvable: ClassVar[frozenset[int]] = frozenset({1})  # heartbeats are not load

    def __init__(self, window_seconds: float) -> None:
        self.window = window_seconds
        self._tripped: str | None = None
        self._lock = threading.Lock()

    def pre_filter(self, pod: PodFacts, view: ClusterView) -> float | None:
        if (pod.gpus == 0 and not pod.shares) or self.window <= 0:
            return None
        oldest = view.now() - self.window
        why = "stale-view" if view.stale else None
        counts = view.silent_agents(oldest)
        if why is None and _too_many(*counts):
            why = "many-silent"
        self._guard(why, counts)
        return None if why is not None else oldest

    def refuse(self, oldest: float, nodes: Candidates, view: ClusterView) -> np.ndarray:
        silent = nodes.beats < oldest  # NaN (no Lease) is never less
        return silent.astype(np.int64)  # code 1: silent

    def word(self, oldest: float, code: int, node: NodeFacts, view: ClusterView) -> str:
        age = int(view.now() - (node.heartbeat or 0.0))
        return (
            f"gpu-scheduler agent on this node is silent: its heartbeat Lease "
            f"{contract.LEASE_SELECTOR} was last renewed {age}s ago (window "
            f"{int(self.window)}s)"
        )

    def _guard(self, why: str | None, counts: tuple[int, int]) -> None:
        if why is not None:
            metrics.HEARTBEAT_GUARD_DECISIONS.labels(why).inc()
        with self._lock:
            if why == self._tripped:
                return
            self._tripped = why
        metrics.HEARTBEAT_GUARD.set(0 if why is None else 1)
        silent, managed = counts
        if why is None:
            log.info(
                "heartbeat guard cleared: filtering silent agents again",
                extra={"silent": silent, "agents": managed},
            )
        else:
            log.warning(
                "heartbeat guard tripped: not filtering on heartbeats",
                extra={"why": why, "silent": silent, "agents": managed},
            )


def _too_many(silent: int, managed: int) -> bool:
    return silent >= GUARD_MIN_SILENT and silent > GUARD_SHARE * managed
