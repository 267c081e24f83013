"""The extender's Prometheus metrics (names prefixed ``gpu_scheduler_extender_``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
    "Candidate nodes by filter outcome",
    ["outcome"],
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
