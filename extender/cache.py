"""The cluster cache the extender decides from: list+watch of Nodes, bound and pending
Pods (cache_pending.py), the agents' heartbeat Leases and the DRA kinds, a
:class:`~extender.reflector.Reflector` thread per kind (extender/sources.py); filter's
recheck (extender/recheck.py) reads a few Nodes and their pods again when the watch may
be behind. It keeps only what the policies read: :class:`NodeFacts` per node, and per
bound, non-terminal pod its node, GPUs and placement group. Requests take a
:class:`~extender.view.View`, an immutable snapshot rebuilt when something changed (or a
second passed), so concurrent events never tear what a request sees."""

from __future__ import annotations

import bisect
import copy
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from extender import dra_index, metrics
from extender.cache_assumed import AssumedPicks
from extender.cache_dra import DraEvents
from extender.cache_pending import PendingPods
from extender.cache_recheck import RecheckAccess
from extender.cache_shares import PodAccounting
from extender.columns import FreeState, NodeTable, free_state
from extender.dra_index import DraIndex
from extender.layered import Layered
from extender.model import NodeFacts, lease_heartbeat, node_facts
from extender.records import PodRecord, object_key, pod_record
from extender.records import reduced as _reduced
from extender.reflector import Reflector, stale_readiness
from extender.view import View
from extender.workload import ShapeCounts, product_pressure
from gpu_scheduler import contract
from gpu_scheduler.fields import FieldError

log = logging.getLogger(__name__)

#: A view whose newest word from the API server is older than this is stale: /readyz
#: says 503 and the heartbeat policy stops filtering (the answers go on).
STALE_AFTER = 40.0
#: A view is rebuilt at least this often, so time-dependent facts stay current.
VIEW_MAX_AGE = 1.0
#: While requests are coming (one read the view within this many seconds), the watch
#: thread that changed the cache builds the next view itself, at most once every
#: :data:`EAGER_GAP` seconds (a burst of events costs one build per gap, and the
#: request after the burst builds the last one). With layered.py's maps it saves
#: 10-12% of a call at 500 candidates while pods are being bound (docs/BENCHMARKS.md).
READERS_ACTIVE = 2.0
EAGER_GAP = 0.004


class ClusterCache(DraEvents, RecheckAccess, AssumedPicks, PendingPods, PodAccounting):
    """Node facts and GPU use, kept current by list+watch; :meth:`view` for readers."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_bound: Callable[[str, str], None] | None = None,
        levels: Sequence[str] = contract.TOPOLOGY_LEVELS,
    ) -> None:
        #: The topology labels node facts keep (the extender's ``groupLevels``).
        self.levels = tuple(levels)
        #: Called (uid, node) from the watch thread when a GPU pod is first seen bound
        #: (not for what a list finds): the placement explanations' trigger.
        self.on_bound = on_bound
        # Facts from the Node objects, and the facts the policies see: the same, or, on
        # a node whose GPUs a DRA driver publishes, its devices of the GPU class.
        self._base: dict[str, NodeFacts] = {}
        self._nodes: dict[str, NodeFacts] = {}
        # The nodes whose facts come from DRA (their GPUs in use are the claims'): a set,
        # so a view or a claim change visits them, not all 5,000 nodes.
        self._dra_nodes: set[str] = set()
        self._dra = DraIndex()
        # Node name -> its agent's last Lease renewal (None: a Lease not renewed yet).
        self._leases: dict[str, float | None] = {}
        self._pods: dict[str, PodRecord] = {}
        self._assumed: dict[str, tuple[float, PodRecord]] = {}  # extender/cache_assumed.py
        # The uids of each node's pods, so that a recheck reads a node's few pods
        # without walking all 50,000 under the lock.
        self._node_pods: dict[str, list[str]] = {}
        self._used: Layered[str, int] = Layered()  # a view's copy: the changes since the last
        self._groups: dict[tuple[str, str], dict[str, int]] = {}
        # GPUs per product (allocatable), GPUs asked by bound pods restricted to a product
        # (split over the products they accept), and GPUs asked by all bound GPU pods.
        self._capacity: dict[str, int] = {}
        self._demand: dict[str, float] = {}
        self._demand_total = 0.0
        # CPU and memory of the bound GPU pods per node; their shapes (workload mix).
        self._cpu_used: dict[str, int] = {}
        self._ram_used: dict[str, int] = {}
        self._shapes = ShapeCounts()
        # Each node's FreeState, refreshed where its facts or its pods change.
        self._free: Layered[str, FreeState] = Layered()
        # The same facts and FreeState as rows (extender.columns), for the hot path.
        self._table = NodeTable()
        self._init_accounting()  # extender/cache_shares.py
        self._init_pending()  # extender/cache_pending.py
        self._lock = threading.RLock()  # re-entered by the recheck's apply_unless_moved
        # Per node, the number of the last change to what the recheck reads of it (its
        # Node, pods, slices: extender/cache_recheck.py); a relist starts a new epoch.
        self._marks: dict[str, int] = {}
        self._epoch = self._changes = 0
        self._node_version = self._pod_version = 0
        self._view: View | None = None
        self._degraded: str | None = None  # why the last view build failed, while it does
        # When a request last read the view, and when a watch thread last built one.
        self._read_at = self._built_at = float("-inf")
        # Every node's heartbeat, sorted, kept in step with _nodes by _set_facts (re-sorting
        # all 5,000 for each view was most of a rebuild). Views share a copy.
        self._beats: list[float] = []
        self._beats_view: tuple[int, list[float]] = (-1, [])
        self._stop, self._clock, self._monotonic = threading.Event(), clock, monotonic
        self.reflectors: dict[str, Reflector] = {}
        #: Reads candidates again before filter turns a pod away (extender/recheck.py).
        self.recheck: Callable[[Sequence[str]], int] | None = None

    # --- what readers get ------------------------------------------------------------
    def view(self) -> View:
        """The current snapshot (the same object until something changes)."""
        self._read_at = self._monotonic()
        if self._assumed:
            with self._lock:
                self._expire_assumed()
        snap = self._view
        if (
            snap is not None
            and snap.version == (self._node_version, self._pod_version)
            and self._clock() - snap.time < VIEW_MAX_AGE
        ):
            return snap
        with self._lock:
            try:
                snap = self._build_view()
            except Exception as exc:  # a bug of ours: answer from the last good view
                if self._view is None:
                    raise
                self._build_failed(exc)
                return self._view
            return snap

    def version(self) -> tuple[int, int]:
        """What the next view's ``version`` is: it changes whenever the cache does."""
        return (self._node_version, self._pod_version)

    def _changed(self) -> None:
        """After a watch event changed the cache (lock held): the next view, built
        here, off kube-scheduler's path, when requests are coming. Each binding of a
        scheduled pod changes the cache; without this the next call (prioritize of
        the pod after it, typically) would build the view while kube-scheduler waits.
        """
        now = self._monotonic()
        if now - self._read_at < READERS_ACTIVE and now - self._built_at >= EAGER_GAP:
            self._built_at = now
            try:
                self._build_view()
            except Exception as exc:  # the watch goes on; requests get the last good view
                self._build_failed(exc)

    def _build_failed(self, exc: Exception) -> None:
        """A view could not be built (lock held): logged once until one can be."""
        if self._degraded is None:
            log.exception("building the view failed; answering from the last good one")
        self._degraded = f"{type(exc).__name__}: {exc}"[:300]
        metrics.VIEW_DEGRADED.set(1)

    def _build_view(self) -> View:
        old = self._view
        version = (self._node_version, self._pod_version)
        if old is not None and old.version[0] == version[0]:
            nodes = old.nodes
        else:
            nodes = MappingProxyType(dict(self._nodes))
        if old is not None and old.version == version:
            used, groups, pods = old.used, old.groups, old.pods
            free, mix, table = old.free, old.mix, old.table
            gpus, share_mix, claims = old.gpus, old.share_mix, old.claim_shares
        else:
            free, gpus, share_mix = self._free.snapshot(), self._gpus.snapshot(), self.share_mix()
            claims = MappingProxyType(dict(self._dra.shares.requests))
            table = self._table.snapshot()
            mix = self._shapes.mix()
            used = self._used.snapshot().with_entries(
                {name: self._dra.used(name) for name in self._dra_nodes}
            )
            groups = MappingProxyType({k: dict(v) for k, v in self._groups.items()})
            pods = len(self._pods)
        if self._beats_view[0] != version[0]:
            self._beats_view = (version[0], list(self._beats))
        age = self.age()
        snap = View(
            nodes=nodes,
            used=used,
            free=free,
            mix=mix,
            gpus=gpus,
            share_mix=share_mix,
            claim_shares=claims,
            groups=groups,
            pressure=MappingProxyType(
                product_pressure(self._demand, self._demand_total, self._capacity)
            ),
            beats=self._beats_view[1],
            pods=pods,
            now=self._clock(),
            age=age,
            stale=age is None or age > STALE_AFTER,
            version=version,
            table=table,
            nominated=self._nominated_snapshot(),
            prioritized=self._dra.prioritized,
        )
        self._view = snap
        if self._degraded is not None:
            self._degraded = None
            metrics.VIEW_DEGRADED.set(0)
        return snap

    def synced(self) -> bool:
        """Every kind has been listed at least once."""
        return bool(self.reflectors) and all(r.synced.is_set() for r in self.reflectors.values())

    def age(self) -> float | None:
        """Seconds since the stalest kind's last word (None: one was never listed)."""
        ages = [r.age() for r in self.reflectors.values()]
        return None if not ages or None in ages else max(ages)  # type: ignore[type-var]

    def ready(self) -> tuple[bool, str]:
        missing = [k for k, r in self.reflectors.items() if not r.synced.is_set()]
        if missing or not self.reflectors:
            return False, f"waiting for the first list of {', '.join(missing) or 'anything'}"
        age = self.age() or 0.0
        with self._lock:  # picks past their time are not counted, view read or not
            self._expire_assumed()
            picks = len(self._assumed)
            summary = f"{len(self._nodes)} nodes, {len(self._pods) - picks} pods cached"
        summary += f", {picks} picked and not bound yet" if picks else ""
        if self._dra_nodes:
            summary += f", {len(self._dra_nodes)} with DRA GPUs ({self._dra.device_class})"
        summary += f", {len(self._leases)} agent heartbeats" if "leases" in self.reflectors else ""
        if age > STALE_AFTER:
            return stale_readiness(self.reflectors, age, STALE_AFTER, summary)
        if self._degraded is not None:  # ready still: the other replica would fail alike
            return True, f"degraded: answering from the last good view ({self._degraded})"
        return True, f"{summary}; view {age:.0f}s old"

    # --- applying what the API server says ----------------------------------------
    def _merged(self, name: str) -> NodeFacts | None:
        """The facts the policies see for a node: its Node's (or its DRA devices'),
        with its agent's last heartbeat from the Lease named as the node (a Lease
        there makes the node agent-managed: its GPU health annotation counts)."""
        facts = self._gpu_facts(name)
        beat = self._leases.get(name)
        managed = name in self._leases
        if facts is None or (facts.heartbeat == beat and facts.managed == managed):
            return facts
        facts = copy.copy(facts)  # the Node's own facts stay as they were read
        facts.heartbeat, facts.managed = beat, managed
        return facts

    def _gpu_facts(self, name: str) -> NodeFacts | None:
        """A node's facts from its Node, or from its DRA devices (dra_index.gpu_facts)."""
        return dra_index.gpu_facts(self._base.get(name), self._dra, name)

    def _set_facts(self, name: str) -> None:
        """Recompute a node's facts and the per-model capacity they add (lock held)."""
        old = self._nodes.pop(name, None)
        new = self._merged(name)
        if new is not None:
            self._nodes[name] = new
        if new is not None and new.dra:
            self._dra_nodes.add(name)
        else:
            self._dra_nodes.discard(name)
        if old is not None and old.heartbeat is not None:
            del self._beats[bisect.bisect_left(self._beats, old.heartbeat)]
        if new is not None and new.heartbeat is not None:
            bisect.insort(self._beats, new.heartbeat)
        self._node_changed(name, old, new)
        self._refresh_free(name)

    def _refresh_free(self, name: str) -> None:
        """Recompute a node's FreeState (and on a sharing node its GPUs) from its facts
        and its pods (lock held)."""
        facts = self._nodes.get(name)
        if facts is None:
            self._free.pop(name, None)
            self._gpus.pop(name, None)
            self._table.put(name, None, None)
            return
        gpus = self._shared_gpus(name, facts)
        state = self._free[name] = free_state(
            facts,
            self._gpus_used(name, facts),
            self._cpu_used.get(name, 0),
            self._ram_used.get(name, 0),
            gpus,
        )
        self._table.put(name, facts, state, gpus)

    def _gpus_used(self, name: str, facts: NodeFacts) -> int:
        """GPUs in use on a node: on a DRA node the claims' devices, not the pods'
        requests (kube-scheduler counts those as claims: no double count)."""
        return self._dra.used(name) if facts.dra else self._used.get(name, 0)

    def replace_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        fresh: dict[str, NodeFacts] = {}
        for item in items:
            try:
                facts = node_facts(item, self.levels)
            except FieldError as exc:
                log.warning("skipping unreadable node", extra={"error": str(exc)})
                continue
            fresh[facts.name] = facts
        with self._lock:
            self._epoch, self._marks = self._epoch + 1, {}
            self._base, self._nodes, self._capacity, self._free = fresh, {}, {}, Layered()
            self._table = NodeTable(len(fresh))
            self._dra_nodes, self._beats = set(), []
            for name in fresh:
                self._set_facts(name)
            self._node_version += 1
        metrics.CACHE_OBJECTS.labels("nodes").set(len(fresh))

    def node_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        facts = None
        if kind == "DELETED":
            meta = obj.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
        else:
            try:
                facts = node_facts(obj, self.levels)
            except FieldError as exc:
                log.warning("skipping unreadable node", extra={"error": str(exc)})
                return
            name = facts.name
        if not isinstance(name, str):
            return
        with self._lock:
            if facts is None:
                self._base.pop(name, None)
            else:
                self._base[name] = facts
            self._set_facts(name)
            self._touch(name)
            self._node_version += 1
            self._changed()
        metrics.CACHE_OBJECTS.labels("nodes").set(len(self._base))

    def replace_leases(self, items: Iterable[Mapping[str, Any]]) -> None:
        beats = dict(_reduced(lease_heartbeat, items))
        with self._lock:
            touched = set(self._leases) | set(beats)
            self._leases = beats
            self._leases_changed(touched)
        metrics.CACHE_OBJECTS.labels("leases").set(len(beats))

    def lease_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        parsed = lease_heartbeat(obj)
        if parsed is None:
            return  # not an agent's heartbeat (the watch's label selector says so too)
        name, beat = parsed
        with self._lock:
            if kind == "DELETED":
                self._leases.pop(name, None)
            else:
                self._leases[name] = beat
            self._leases_changed({name})
            self._changed()
        metrics.CACHE_OBJECTS.labels("leases").set(len(self._leases))

    def _leases_changed(self, nodes: set[str]) -> None:
        """Carry heartbeats into the facts of the nodes they name (lock held)."""
        known = [name for name in nodes if name in self._base]
        for name in known:
            self._set_facts(name)
        if known:
            self._node_version += 1

    def replace_pods(self, items: Iterable[Mapping[str, Any]]) -> None:
        records = dict(filter(None, (pod_record(item) for item in items)))
        with self._lock:
            self._epoch, self._marks = self._epoch + 1, {}
            before, self._pods, self._node_pods = self._pods, {}, {}
            self._used, self._groups, self._demand, self._demand_total = Layered(), {}, {}, 0.0
            self._cpu_used, self._ram_used, self._shapes = {}, {}, ShapeCounts()
            self._share_counts = {}
            for uid, record in records.items():
                old = before.get(uid)  # a relist keeps each pod's place in its node's order
                if old is not None and old.node == record.node:
                    record.seq = old.seq
                else:
                    self._seq += 1
                    record.seq = self._seq
                self._pods[uid] = record
                self._node_pods.setdefault(record.node, []).append(uid)
                self._account(record, 1)
            self._keep_assumed()
            for name in self._nodes:
                self._refresh_free(name)
            self._pod_version += 1
        metrics.CACHE_OBJECTS.labels("pods").set(len(records))

    def pod_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        uid = object_key(obj)
        if uid is None:
            return
        new = None if kind == "DELETED" else pod_record(obj)
        with self._lock:
            assumed = self._assumed.pop(uid, None) is not None  # the watch's word wins
            old = self._unplace(uid)
            if new is not None:
                self._place(*new, old)
            self._pod_version += 1
            self._changed()
        metrics.child(metrics.CACHE_OBJECTS, "pods").set(len(self._pods))
        first = old is None or assumed
        if first and new is not None and (new[1].gpus or new[1].shares) and self.on_bound:
            self.on_bound(new[0], new[1].node)

    # --- list+watch ---------------------------------------------------------------
    def start(
        self,
        core_api: Any,
        resource_api: Any = None,
        coordination_api: Any = None,
        lease_namespace: str | None = None,
    ) -> None:
        """Reflect the kinds the cache keeps (extender.sources), a thread each."""
        from extender.recheck import Recheck
        from extender.sources import reflectors

        apis = (core_api, resource_api, coordination_api, lease_namespace)
        self.reflectors = reflectors(self, *apis, self._stop, self._monotonic)
        self.recheck = Recheck(self, core_api, resource_api)
        for reflector in self.reflectors.values():
            reflector.start()

    def stop(self) -> None:
        self._stop.set()
