"""The extender's Prometheus metrics (names prefixed ``gpu_scheduler_extender_``)."""

from __future__ import annotations

import functools
from typing import Any

from prometheus_client import Counter, Gauge, Histogram


@functools.lru_cache(maxsize=256)
def child(metric: Any, *values: str) -> Any:
    """``metric.labels(*values)``, looked up once: the calls on the hot path (a few a
    pod) then cost a dict lookup instead of the client's label checks and lock."""
    return metric.labels(*values)


REQUESTS = Counter(
    "gpu_scheduler_extender_requests_total",
    "Extender calls by verb and HTTP code",
    ["verb", "code"],
)
LATENCY = Histogram(
    "gpu_scheduler_extender_request_seconds",
    "Time spent deciding one extender call (parse to answer)",
    ["verb"],
    buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
)
NODES = Counter(
    "gpu_scheduler_extender_filter_nodes_total",
    "Candidate nodes by filter outcome (passed: every node that fits, also where the "
    "filter then answered the one it picked)",
    ["outcome"],
)
FILTER_PICKS = Counter(
    "gpu_scheduler_extender_filter_picks_total",
    "Filter calls that left more than one node, by who picks among them "
    "(extender: "
    "it answered the one node it ranks first, so kube-scheduler skips its scoring and "
    "prioritize; kube-scheduler: every node went back, as the pod asks for preferences "
    "to be weighed or filterChooses is off)",
    ["picker"],
)
PREEMPTION_NODES = Counter(
    "gpu_scheduler_extender_preemption_nodes_total",
    "Candidate nodes of preempt calls, by outcome (kept: the pod fits there once the "
    "victims go; dropped: no victims the extender may take make it fit, they would split a "
    "gang, or another node has less to avoid), and victims-added: pods the extender added "
    "to kube-scheduler's victims so that the pod fits by its own count",
    ["outcome"],
)
PICKS_ENDED = Counter(
    "gpu_scheduler_extender_picks_ended_total",
    "Picks of the filter that kube-scheduler abandoned (failed: a scheduling failure "
    "written on the pod after the pick: Permit, binding, a reverted PodGroup cycle), and "
    "picks whose pod left the pending set, deleted or bound (left-pending: the pick then "
    "counts at most a second more unless the bound watch shows the binding)",
    ["reason"],
)
NOMINATED_HELD = Counter(
    "gpu_scheduler_extender_nominated_refusals_total",
    "Nodes filter refused because pods nominated there of equal or higher priority "
    "(preemptors waiting for their victims) hold the room the pod would take",
)
CACHE_OBJECTS = Gauge(
    "gpu_scheduler_extender_cache_objects",
    "Objects held in the cluster cache",
    ["kind"],
    multiprocess_mode="max",
)
CACHE_RELISTS = Counter(
    "gpu_scheduler_extender_cache_relists_total",
    "Full lists of a kind (start, 410 Gone, error)",
    ["kind", "why"],
)
CACHE_CONTACT = Gauge(
    "gpu_scheduler_extender_cache_last_contact_timestamp_seconds",
    "When the API server last said anything about a kind (list, event, bookmark, the "
    "end of a watch); time() minus this is the age of the extender's view",
    ["kind"],
    multiprocess_mode="min",
)
VIEW_DEGRADED = Gauge(
    "gpu_scheduler_extender_view_degraded",
    "1 while building a new view fails and the verbs answer from the last good one "
    "(a bug of ours meeting some object: alert on it; kube-scheduler's own fit check "
    "still refuses what no longer fits)",
    multiprocess_mode="max",
)
RETRY_ANSWERS = Counter(
    "gpu_scheduler_extender_retry_answers_total",
    "Calls answered with an error so that kube-scheduler retries the pod soon, by why "
    "(not-synced: the cache never listed; unknown-nodes: nothing fits among the nodes "
    "it knows, and it does not know some candidates yet)",
    ["verb", "why"],
)
RECHECKS = Counter(
    "gpu_scheduler_extender_rechecks_total",
    "Candidates read again from the API server before a pod was turned away by all of "
    "them (extender/recheck.py), by outcome (changed: the cache was behind and took the "
    "new state; same; skipped: over the rate or the call's deadline; failed)",
    ["outcome"],
)
HEARTBEAT_GUARD = Gauge(
    "gpu_scheduler_extender_heartbeat_guard_tripped",
    "1 while the heartbeat policy is not filtering because the view is stale or too "
    "many agents look silent at once (the extender's problem, not the nodes')",
    multiprocess_mode="max",
)
HEARTBEAT_GUARD_DECISIONS = Counter(
    "gpu_scheduler_extender_heartbeat_guard_decisions_total",
    "Filter calls in which the heartbeat guard kept silent-looking nodes in, by why",
    ["why"],
)
PLACEMENT_EVENTS = Counter(
    "gpu_scheduler_extender_placement_events_total",
    "GPUPlacement Events on bound pods, by outcome (written; dropped: rate limit or full "
    "queue; failed: the API refused it; duplicate: another replica wrote it)",
    ["outcome"],
)
