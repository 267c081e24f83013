"""The agent's loop: read the GPUs, plan, write; renew the heartbeat Lease; back off on
failure; stop on SIGTERM.

Every ``interval`` the GPUs are read (NVML, no API call). The Node is read and
brought in line only when what it should carry changed since the last sync, or every
``resync_interval`` (to repair what someone else changed); the heartbeat Lease is
renewed every ``heartbeat_interval``. In a steady state that is, per node and hour,
3600/resync GETs of the Node, 3600/heartbeat Lease applies and no Node write (6 and
12 with the defaults; the DRA check adds 2 lists per 10 minutes with capacity on).

Decisions are :func:`agent.labels.desired_state`, :func:`agent.sync.plan_sync` and
:mod:`agent.heartbeat`; this module only sequences the I/O around them. The clocks,
the sleep (a ``threading.Event`` that SIGTERM sets) and the jitter are injected for
tests.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import UTC, datetime
from typing import IO

from agent import heartbeat, metrics
from agent.health import DEFAULT_QUIET_S, HealthTracker
from agent.heartbeat import PodIdentity
from agent.inventory import Backend, Inventory, InventoryError
from agent.kubeapi import ApiError, NodeApi
from agent.kubelet_checkpoint import FILE as CHECKPOINT_FILE
from agent.labels import Desired, allocatable_gpus, desired_state
from agent.podresources import SOCKET, PodResourcesClient
from agent.sharing_node import DEFAULT_RESERVE_MIB, sharing_desired
from agent.sync import NodeState, Ownership, Plan, ownership, plan_sync
from agent.xid import XidPolicy
from gpu_scheduler import contract

log = logging.getLogger("gpu_scheduler.agent")


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node_name: str
    interval_s: float = 60.0
    heartbeat_interval_s: float = 300.0
    #: Read the Node and repair it this often even when the GPUs did not change.
    resync_interval_s: float = 600.0
    #: The agent's own Pod: owns the heartbeat Lease, whose namespace is the pod's.
    #: None (not running in a pod): no heartbeat, and the node counts as unmanaged.
    pod: PodIdentity | None = None
    #: Advertise nvidia.com/gpu capacity (clusters with no device plugin and no DRA).
    manage_capacity: bool = False
    #: Write GPU Feature Discovery's label keys: auto (unless GFD labels the node),
    #: always, never.
    gfd_labels: str = "auto"
    #: How often to ask whether a DRA driver publishes this node's GPUs (with capacity on).
    dra_check_s: float = 600.0
    backoff_base_s: float = 2.0
    backoff_max_s: float = 300.0
    conflict_retries: int = 5
    #: Which XIDs mark a GPU unhealthy (agent.xid), and recovery (agent.health).
    xid_policy: XidPolicy = field(default_factory=XidPolicy)
    recover: bool = True
    recovery_quiet_s: float = DEFAULT_QUIET_S
    #: /healthz answers 503 once NVML has given no good read for this long, so the
    #: kubelet restarts the container (a driver upgraded under it needs a new one).
    unhealthy_after_s: float = 300.0
    #: The kubelet's PodResources socket, read on nodes labelled LABEL_GPU_SHARING for
    #: ANN_GPU_SHARES ("" or None: never read, and no node carries the annotation).
    pod_resources_socket: str | None = SOCKET
    #: A failed PodResources call keeps the last good answer this long; after it the
    #: annotation is removed (the extender then fits every bound pod itself).
    shares_stale_s: float = 300.0
    #: The kubelet's device checkpoint, which names each device ID's pod by UID (the
    #: shares report is keyed by UID; None: no report).
    kubelet_checkpoint: str | None = f"/var/lib/kubelet/device-plugins/{CHECKPOINT_FILE}"
    #: The MPS supervisor's directory (its health.json): in MPS mode a GPU without a
    #: daemon is unhealthy in ANN_GPUS too (None: not read).
    mps_root: str | None = None
    #: MiB of each GPU of a sharing node that no share is given (published in ANN_GPUS).
    gpu_memory_reserve_mib: int = DEFAULT_RESERVE_MIB


def backoff_delay(failures: int, base: float, cap: float, jitter: float = 1.0) -> float:
    """``base * 2**(failures-1)``, capped, times a jitter factor (0.8..1.2 in use)."""
    if failures <= 0:
        return 0.0
    return min(cap, base * 2 ** min(failures - 1, 30)) * jitter


@dataclass(eq=False)
class Agent:
    config: AgentConfig
    backend: Backend
    api: NodeApi | None
    _: KW_ONLY
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    monotonic: Callable[[], float] = time.monotonic
    stop: threading.Event = field(default_factory=threading.Event)
    jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.2)
    pod_resources: PodResourcesClient | None = None

    def __post_init__(self) -> None:
        self._ready = (False, "no sync yet")
        self._lock = threading.Lock()
        self._ownership: Ownership | None = None
        self._dra: tuple[float, int | None] | None = None  # (checked at, devices)
        # What the last sync brought the Node to, and when (monotonic); the last renewal.
        self._synced: tuple[Desired, float] | None = None
        self._renewed: float | None = None
        config = self.config
        self.health = HealthTracker(config.xid_policy, config.recovery_quiet_s, config.recover)
        # The last good read of the GPUs (monotonic; the start counts as one), and
        # whether the last read failed (a good one after it: the driver came back).
        self._good_read = self.monotonic()
        self._read_failed = False
        #: Set by the NVML event loop when an event marked a GPU (and on stop): the
        #: loop then runs its next round at once instead of after the interval.
        self.wake: threading.Event | None = None
        #: The node's LABEL_GPU_SHARING as the last Node read said (None: not shared).
        self.sharing: str | None = None
        #: The last read, health applied (what the device plugin serves), and who is
        #: told of each Node read (the device plugin follows the sharing label).
        self.last_inventory: Inventory | None = None
        self.on_node: Callable[[NodeState], None] | None = None
        self.skipped: dict[str, int] = {}  # what the last shares report left out
        if self.pod_resources is None and config.pod_resources_socket:
            self.pod_resources = PodResourcesClient(
                config.pod_resources_socket, monotonic=self.monotonic
            )

    # --- readiness -----------------------------------------------------------------
    def ready(self) -> tuple[bool, str]:
        with self._lock:
            return self._ready

    def _set_ready(self, ok: bool, detail: str) -> None:
        with self._lock:
            self._ready = (ok, detail)
        metrics.READY.set(1 if ok else 0)

    # --- one round -----------------------------------------------------------------
    def alive(self) -> tuple[bool, str]:
        """For /healthz: false once NVML has given no good read for
        ``unhealthy_after_s`` (a driver upgraded under the container, which only a
        new container can load), so the kubelet restarts it."""
        quiet = self.monotonic() - self._good_read
        if quiet > self.config.unhealthy_after_s:
            return False, f"no good NVML read for {quiet:.0f}s"
        return True, "ok"

    def read_inventory(self) -> Inventory:
        try:
            inventory = self.backend.read()
        except InventoryError:
            self._read_failed = True
            metrics.READ_ERRORS.inc()
            raise
        mono = self.monotonic()
        if self._read_failed:
            self._read_failed = False
            self.health.driver_reloaded()
        self._good_read = mono
        inventory = self._health(inventory, mono)
        self.last_inventory = inventory
        metrics.GPUS.labels("present").set(len(inventory.gpus))
        metrics.GPUS.labels("healthy").set(len(inventory.healthy))
        metrics.GPUS.labels("allocatable").set(allocatable_gpus(inventory))
        for gpu in inventory.gpus:
            if not gpu.healthy:
                log.warning(
                    "unhealthy GPU",
                    extra={
                        "node": self.config.node_name,
                        "gpu": gpu.index,
                        "uuid": gpu.uuid,
                        "reason": gpu.reason,
                    },
                )
        return inventory

    def _health(self, inventory: Inventory, mono: float) -> Inventory:
        """The read with what the GPUs' events said laid over it: XIDs a fake file
        reports are events now (the NVML event loop feeds ``self.health`` itself)."""
        reported = [g for g in inventory.gpus if g.xid is not None]
        if reported:
            wall = self.clock().timestamp()
            for gpu in reported:
                self.health.xid(gpu.uuid, int(gpu.xid or 0), wall, mono)
            inventory = replace(inventory, gpus=tuple(replace(g, xid=None) for g in inventory.gpus))
        return self.health.apply(inventory, mono)

    def desired(self, inventory: Inventory) -> Desired:
        if self.sharing in contract.SHARING_MODES:  # reserve, MPS health, shares report
            return sharing_desired(self, inventory)
        return desired_state(inventory, manage_capacity=self.config.manage_capacity)

    def sync_once(self, inventory: Inventory | None = None, desired: Desired | None = None) -> Plan:
        """Read (unless given) the GPUs and bring the Node in line. Returns the last plan
        carried out. Raises :class:`InventoryError` or :class:`ApiError`."""
        if self.api is None:
            raise RuntimeError("sync_once needs an API (dry-run makes no API call)")
        started = time.monotonic()
        if inventory is None:
            inventory = self.read_inventory()
        if desired is None:
            desired = self.desired(inventory)
        name = self.config.node_name
        writes: list[str] = []
        for attempt in range(self.config.conflict_retries + 1):
            node = self.api.get_node(name)
            if self.on_node is not None:
                self.on_node(node)
            sharing = node.labels.get(contract.LABEL_GPU_SHARING)
            if sharing != self.sharing:  # shared now, or no more: with or without shares
                self.sharing = sharing
                desired = self.desired(inventory)
            own = self._decide_ownership(node)
            plan = plan_sync(
                desired,
                node,
                manage_capacity=own.capacity,
                write_gfd_labels=own.gfd_labels,
            )
            try:
                # Metadata first: when both change, the labels are right before the
                # capacity that lets pods in.
                if plan.metadata_patch is not None:
                    self.api.patch_metadata(name, plan.metadata_patch)
                    metrics.WRITES.labels("metadata").inc()
                    writes.append("metadata")
                if plan.status_patch is not None:
                    self.api.patch_status(name, plan.status_patch)
                    metrics.WRITES.labels("status").inc()
                    writes.append("status")
            except ApiError as exc:
                if not exc.conflict or attempt == self.config.conflict_retries:
                    raise
                metrics.CONFLICTS.inc()
                log.info(
                    "node changed since read; re-reading",
                    extra={"node": name, "attempt": attempt + 1, "error": str(exc)},
                )
                continue
            log.info(
                "sync",
                extra={
                    "node": name,
                    "gpus": len(inventory.gpus),
                    "healthy": len(inventory.healthy),
                    "changed": list(plan.changed),
                    "writes": writes,
                    "duration_ms": round((time.monotonic() - started) * 1000, 1),
                },
            )
            metrics.SYNCS.labels("written" if writes else "unchanged").inc()
            self._synced = (desired, self.monotonic())
            return plan
        raise AssertionError("unreachable")  # pragma: no cover

    def sync_due(self, desired: Desired) -> bool:
        """The Node must be read: never synced, the GPUs changed since, or the resync
        interval has passed."""
        if self._synced is None:
            return True
        last, at = self._synced
        return last != desired or self.monotonic() - at >= self.config.resync_interval_s

    def heartbeat_due(self) -> bool:
        if self.config.pod is None:
            return False
        return (
            self._renewed is None
            or self.monotonic() - self._renewed >= self.config.heartbeat_interval_s
        )

    def renew_heartbeat(self) -> None:
        """Renew (or create) this node's heartbeat Lease. Raises :class:`ApiError`."""
        pod, cfg = self.config.pod, self.config
        if self.api is None or pod is None:
            raise RuntimeError("a heartbeat needs an API and the agent's pod")
        lease = heartbeat.lease_object(cfg.node_name, pod, self.clock(), cfg.heartbeat_interval_s)
        try:
            self.api.renew_lease(pod.namespace, cfg.node_name, lease)
        except ApiError:
            metrics.HEARTBEATS.labels("failed").inc()
            raise
        metrics.HEARTBEATS.labels("renewed").inc()
        if self._renewed is None:
            log.info(
                "heartbeat Lease applied",
                extra={"node": cfg.node_name, "namespace": pod.namespace, "owner": pod.name},
            )
        self._renewed = self.monotonic()

    def round(self) -> None:
        """One round of the long-running mode: read the GPUs; sync the Node if due;
        renew the heartbeat if due. Raises :class:`InventoryError` or :class:`ApiError`
        (the heartbeat is renewed only after a round whose sync, if any, succeeded)."""
        inventory = self.read_inventory()
        desired = self.desired(inventory)
        if self.sync_due(desired):
            self.sync_once(inventory, desired)
        if self.heartbeat_due():
            self.renew_heartbeat()

    def _decide_ownership(self, node: NodeState) -> Ownership:
        """What this agent writes on its node now; logs each change of mind once."""
        cfg = self.config
        own = ownership(node, cfg.gfd_labels, cfg.manage_capacity, self._dra_gpus())
        before, self._ownership = self._ownership, own
        if before is None or before.gfd_labels != own.gfd_labels:
            log.info(
                "writing GPU Feature Discovery's labels"
                if own.gfd_labels
                else "leaving GPU Feature Discovery's labels alone",
                extra={
                    "node": cfg.node_name,
                    "why": own.why_not_gfd or f"--gfd-labels {cfg.gfd_labels}",
                },
            )
        if cfg.manage_capacity and (before is None or before.capacity != own.capacity):
            if own.capacity:
                log.info("advertising nvidia.com/gpu capacity", extra={"node": cfg.node_name})
            else:
                log.warning(
                    "not advertising nvidia.com/gpu capacity",
                    extra={"node": cfg.node_name, "why": own.why_not_capacity},
                )
        return own

    def _dra_gpus(self) -> int | None:
        """GPUs a DRA driver publishes for this node, asked at most every
        ``dra_check_s`` (only when capacity advertising is on)."""
        if not self.config.manage_capacity or self.api is None:
            return None
        now = time.monotonic()
        if self._dra is None or now - self._dra[0] >= self.config.dra_check_s:
            try:
                count = self.api.dra_gpus(self.config.node_name)
            except ApiError as exc:
                log.warning(
                    "cannot tell whether a DRA driver serves this node's GPUs",
                    extra={"node": self.config.node_name, "error": str(exc)},
                )
                count = self._dra[1] if self._dra else None
            self._dra = (now, count)
        return self._dra[1]

    # --- the long-running mode -----------------------------------------------------
    def run_forever(self) -> int:
        """Sync every interval until :attr:`stop` is set; a failed round leaves the
        Node as it is and is retried with exponential backoff. Returns 0."""
        failures = 0
        if self.config.pod is None:
            log.warning(
                "no heartbeat: the agent does not know its pod (POD_NAMESPACE, POD_NAME, "
                "POD_UID from the downward API); the extender treats this node as not "
                "agent-managed",
                extra={"node": self.config.node_name},
            )
        while not self.stop.is_set():
            delay = self.config.interval_s
            try:
                self.round()
            except InventoryError as exc:
                failures += 1
                delay = self._failed(failures, "inventory_error", f"cannot read the GPUs: {exc}")
            except ApiError as exc:
                failures += 1
                delay = self._failed(failures, "api_error", f"API: {exc}", exc.status)
                if exc.retry_after:
                    delay = max(delay, exc.retry_after)
            else:
                failures = 0
                self._set_ready(True, "synced")
                metrics.LAST_SUCCESS.set(time.time())
            self._sleep(delay, failures)
        log.info("stopping", extra={"node": self.config.node_name})
        return 0

    def _sleep(self, delay: float, failures: int) -> None:
        """Until the next round: ``delay``, or less when an event wakes the loop (not
        while backing off: a failing API is not hit harder because a GPU failed)."""
        wake = self.wake
        if wake is None or failures:
            self.stop.wait(delay)
        elif wake.wait(delay):
            wake.clear()

    def _failed(self, failures: int, result: str, message: str, status: int | None = None) -> float:
        cfg = self.config
        delay = backoff_delay(failures, cfg.backoff_base_s, cfg.backoff_max_s, self.jitter())
        metrics.SYNCS.labels(result).inc()
        self._set_ready(False, message)
        log.error(
            message,
            extra={
                "node": cfg.node_name,
                "failures": failures,
                "retry_in_s": round(delay, 1),
                "status": status,
                "node_state": "left as it was",
            },
        )
        return delay

    def run_dry(self, out: IO[str], once: bool) -> int:
        """No API at all: print the desired state as one JSON document per change."""
        last: str | None = None
        failures = 0
        while True:
            try:
                document = json.dumps(self.desired(self.read_inventory()).as_json(), indent=2)
            except InventoryError as exc:
                if once:
                    raise
                failures += 1
                delay = self._failed(failures, "inventory_error", f"cannot read the GPUs: {exc}")
            else:
                failures = 0
                self._set_ready(True, "inventory read (dry run)")
                if document != last:
                    out.write(document + "\n")
                    out.flush()
                    last = document
                delay = self.config.interval_s
            if once:
                return 0
            if self.stop.wait(delay):
                log.info("stopping", extra={"node": self.config.node_name})
                return 0
