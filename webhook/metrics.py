"""The webhook's Prometheus metrics (names prefixed ``gpu_scheduler_webhook_``)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

REVIEWS = Counter(
    "gpu_scheduler_webhook_reviews_total",
    "AdmissionReviews answered, by outcome (bad-input: answered 400)",
    ["outcome"],
)
MUTATIONS = Counter(
    "gpu_scheduler_webhook_mutations_total",
    "Changes made to pods, by field (schedulerName, tolerations)",
    ["change"],
)
LATENCY = Histogram(
    "gpu_scheduler_webhook_review_seconds",
    "Time spent on one AdmissionReview (parse to answer)",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1, 1.0),
)
