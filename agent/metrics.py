"""The agent's Prometheus metrics (names prefixed ``gpu_scheduler_agent_``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

SYNCS = Counter(
    "gpu_scheduler_agent_syncs_total",
    "Sync rounds by result (written, unchanged, inventory_error, api_error)",
    ["result"],
)
WRITES = Counter(
    "gpu_scheduler_agent_writes_total",
    "API writes by kind (metadata: labels/annotations merge patch; status: capacity)",
    ["kind"],
)
CONFLICTS = Counter(
    "gpu_scheduler_agent_conflicts_total",
    "Writes refused because the Node changed since it was read (re-read and retried)",
)
GPUS = Gauge(
    "gpu_scheduler_agent_gpus",
    "GPUs in the last inventory: present, healthy, allocatable (healthy, not MIG-enabled)",
    ["state"],
)
READY = Gauge("gpu_scheduler_agent_ready", "1 when the last sync round succeeded")
LAST_SUCCESS = Gauge(
    "gpu_scheduler_agent_last_success_timestamp_seconds",
    "Unix time of the last successful sync round",
)
API_REQUESTS = Counter(
    "gpu_scheduler_agent_api_requests_total",
    "Requests to the API server by verb and resource (get/patch node, apply lease, "
    "list deviceclasses/resourceslices), and the HTTP status class (2xx, 4xx, 5xx, none)",
    ["verb", "resource", "code"],
)
HEARTBEATS = Counter(
    "gpu_scheduler_agent_heartbeats_total",
    "Heartbeat Lease applies by result (renewed, failed)",
    ["result"],
)
READ_ERRORS = Counter(
    "gpu_scheduler_agent_nvml_read_errors_total",
    "Reads of the GPUs that failed (NVML not loaded, a driver/library mismatch, ...)",
)
XIDS = Counter(
    "gpu_scheduler_agent_xids_total",
    "XID errors the GPUs reported, by whether they mark the GPU unhealthy",
    ["critical"],
)
UNHEALTHY_MARKS = Gauge(
    "gpu_scheduler_agent_gpu_health_marks",
    "GPUs held unhealthy by an event (an XID, a double-bit ECC error) until they recover",
)
EVENTS = Counter(
    "gpu_scheduler_agent_nvml_events_total",
    "NVML events by kind (xid, ecc-double, ecc-single, other, unattributed)",
    ["kind"],
)
EVENT_LOOP_GPUS = Gauge(
    "gpu_scheduler_agent_nvml_event_gpus",
    "GPUs registered with the NVML event loop in its current session",
)
EVENT_LOOP_ERRORS = Counter(
    "gpu_scheduler_agent_nvml_event_loop_errors_total",
    "NVML event sessions that ended in an error (each is started again after a backoff)",
)
