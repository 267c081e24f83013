"""The cluster cache for ``--node-source cluster``: list+watch of Nodes and bound Pods.

It keeps only what the policies read: :class:`NodeFacts` per node, and per bound,
non-terminal pod its node, GPU count and placement group. Watches resume from the
last resourceVersion (with bookmarks); a 410 Gone, or any error, relists.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from extender import metrics
from extender.model import NodeFacts, node_facts, parse_products
from gpu_scheduler import contract
from gpu_scheduler.fields import FieldError

log = logging.getLogger(__name__)

# Bound and not finished: the pods that hold GPUs (field selectors keep the rest away,
# and a pod that finishes or is deleted arrives as DELETED).
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
PAGE_SIZE = 500
WATCH_SECONDS = 300


class StaticView:
    """The view in args mode: no pod cache, so every allocatable GPU counts as free."""

    used: dict[str, int] = {}

    def used_gpus(self, node: str) -> int:
        return 0

    def group_zones(self, namespace: str, group: str) -> dict[str, int]:
        return {}

    def product_pressure(self) -> dict[str, float]:
        return {}

    def now(self) -> float:
        return time.time()


class _PodRecord:
    __slots__ = ("gpus", "group", "node", "products")

    def __init__(
        self,
        node: str,
        gpus: int,
        group: tuple[str, str] | None,
        products: tuple[str, ...] | None = None,
    ) -> None:
        self.node = node
        self.gpus = gpus
        self.group = group
        self.products = products  # gpu-products it is restricted to, if any


def pod_record(pod: Mapping[str, Any]) -> tuple[str, _PodRecord] | None:
    """(uid, record) for a bound pod worth keeping, else None. Never raises: a pod
    whose GPU request cannot be read counts as asking for none."""
    meta = pod.get("metadata")
    spec = pod.get("spec")
    status = pod.get("status")
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return None
    node = spec.get("nodeName")
    if not isinstance(node, str) or not node:
        return None
    if isinstance(status, Mapping) and status.get("phase") in contract.TERMINAL_PHASES:
        return None
    uid = _pod_uid(meta)
    try:
        gpus = contract.pod_gpu_request(spec)
    except FieldError:
        gpus = 0
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    group_name = annotations.get(contract.ANN_GROUP)
    namespace = meta.get("namespace")
    group = None
    if isinstance(group_name, str) and group_name:
        group = (sys.intern(namespace if isinstance(namespace, str) else "default"), group_name)
    if gpus == 0 and group is None:
        return None
    raw = annotations.get(contract.ANN_GPU_PRODUCTS)
    products = parse_products(raw) if gpus and isinstance(raw, str) else None
    restricted = tuple(sorted(sys.intern(p) for p in products)) if products else None
    return uid, _PodRecord(sys.intern(node), gpus, group, restricted)


def _pod_uid(meta: Any) -> str:
    if not isinstance(meta, Mapping):
        return ""
    uid = meta.get("uid")
    if isinstance(uid, str) and uid:
        return uid
    return f"{meta.get('namespace')}/{meta.get('name')}"


class ClusterCache:
    """Node facts and GPU use, kept current by list+watch. Thread-safe for readers."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.nodes: dict[str, NodeFacts] = {}
        self._pods: dict[str, _PodRecord] = {}
        self._used: dict[str, int] = {}
        self._groups: dict[tuple[str, str], dict[str, int]] = {}
        # GPUs per product (allocatable), GPUs asked by bound pods restricted to a product
        # (split over the products they accept), and GPUs asked by all bound GPU pods.
        self._capacity: dict[str, int] = {}
        self._demand: dict[str, float] = {}
        self._demand_total = 0
        self._lock = threading.Lock()
        self._synced = {"nodes": threading.Event(), "pods": threading.Event()}
        self._stop = threading.Event()
        self._clock = clock

    # --- the view the policies read ----------------------------------------------
    @property
    def used(self) -> dict[str, int]:
        return self._used

    def used_gpus(self, node: str) -> int:
        return self._used.get(node, 0)

    def group_zones(self, namespace: str, group: str) -> dict[str, int]:
        zones: dict[str, int] = {}
        with self._lock:
            members = self._groups.get((namespace, group))
            if not members:
                return zones
            for node_name, count in members.items():
                node = self.nodes.get(node_name)
                if node is not None and node.zone:
                    zones[node.zone] = zones.get(node.zone, 0) + count
        return zones

    def product_pressure(self) -> dict[str, float]:
        """Per GPU product: the share of GPU demand that can only run on it, over its
        share of the cluster's GPUs. Near 1 or above: pods restricted to this product
        need about all of it. 0: nobody is restricted to it. Empty without demand."""
        with self._lock:
            total_demand = self._demand_total
            total_capacity = sum(self._capacity.values())
            if not total_demand or not total_capacity:
                return {}
            return {
                product: (self._demand.get(product, 0.0) / total_demand)
                / (capacity / total_capacity)
                for product, capacity in self._capacity.items()
                if capacity > 0
            }

    def now(self) -> float:
        return self._clock()

    def ready(self) -> tuple[bool, str]:
        missing = [kind for kind, event in self._synced.items() if not event.is_set()]
        if missing:
            return False, f"waiting for the first list of {', '.join(missing)}"
        return True, f"{len(self.nodes)} nodes, {len(self._pods)} pods cached"

    def lookup(self, names: Iterable[str]) -> list[NodeFacts | None]:
        get = self.nodes.get
        return [get(name) for name in names]

    # --- applying what the API server says ----------------------------------------
    def replace_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        fresh: dict[str, NodeFacts] = {}
        for item in items:
            try:
                facts = node_facts(item)
            except FieldError as exc:
                log.warning("skipping unreadable node", extra={"error": str(exc)})
                continue
            fresh[facts.name] = facts
        capacity: dict[str, int] = {}
        for facts in fresh.values():
            if facts.product and facts.allocatable:
                capacity[facts.product] = capacity.get(facts.product, 0) + facts.allocatable
        with self._lock:
            self.nodes = fresh
            self._capacity = capacity
        metrics.CACHE_OBJECTS.labels("nodes").set(len(fresh))

    def node_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        facts = None
        if kind == "DELETED":
            meta = obj.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
        else:
            try:
                facts = node_facts(obj)
            except FieldError as exc:
                log.warning("skipping unreadable node", extra={"error": str(exc)})
                return
            name = facts.name
        with self._lock:
            old = self.nodes.pop(name, None)
            if facts is not None:
                self.nodes[facts.name] = facts
            for node, sign in ((old, -1), (facts, 1)):
                if node is not None and node.product and node.allocatable:
                    left = self._capacity.get(node.product, 0) + sign * node.allocatable
                    if left > 0:
                        self._capacity[node.product] = left
                    else:
                        self._capacity.pop(node.product, None)
        metrics.CACHE_OBJECTS.labels("nodes").set(len(self.nodes))

    def replace_pods(self, items: Iterable[Mapping[str, Any]]) -> None:
        records = dict(filter(None, (pod_record(item) for item in items)))
        used: dict[str, int] = {}
        groups: dict[tuple[str, str], dict[str, int]] = {}
        demand: dict[str, float] = {}
        demand_total = 0
        for record in records.values():
            if record.gpus:
                used[record.node] = used.get(record.node, 0) + record.gpus
                demand_total += record.gpus
                for product in record.products or ():
                    share = record.gpus / len(record.products)  # type: ignore[arg-type]
                    demand[product] = demand.get(product, 0.0) + share
            if record.group is not None:
                members = groups.setdefault(record.group, {})
                members[record.node] = members.get(record.node, 0) + 1
        with self._lock:
            self._pods, self._used, self._groups = records, used, groups
            self._demand, self._demand_total = demand, demand_total
        metrics.CACHE_OBJECTS.labels("pods").set(len(records))

    def pod_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        uid = _pod_uid(obj.get("metadata"))
        new = None if kind == "DELETED" else pod_record(obj)
        with self._lock:
            old = self._pods.pop(uid, None)
            if old is not None:
                self._account(old, -1)
            if new is not None:
                self._pods[new[0]] = new[1]
                self._account(new[1], 1)
        metrics.CACHE_OBJECTS.labels("pods").set(len(self._pods))

    def _account(self, record: _PodRecord, sign: int) -> None:
        used = self._used.get(record.node, 0) + sign * record.gpus
        if used:
            self._used[record.node] = used
        else:
            self._used.pop(record.node, None)
        self._demand_total += sign * record.gpus
        for product in record.products or ():
            share = self._demand.get(product, 0.0) + sign * record.gpus / len(record.products)
            if share > 1e-9:
                self._demand[product] = share
            else:
                self._demand.pop(product, None)
        if record.group is not None:
            members = self._groups.setdefault(record.group, {})
            count = members.get(record.node, 0) + sign
            if count > 0:
                members[record.node] = count
            else:
                members.pop(record.node, None)
                if not members:
                    del self._groups[record.group]

    # --- list+watch ---------------------------------------------------------------
    def start(self, core_api: Any) -> None:
        """Reflect Nodes and Pods in two daemon threads (``core_api``: CoreV1Api)."""
        sources = {
            "nodes": (core_api.list_node, {}, self.replace_nodes, self.node_event),
            "pods": (
                core_api.list_pod_for_all_namespaces,
                {"field_selector": POD_FIELD_SELECTOR},
                self.replace_pods,
                self.pod_event,
            ),
        }
        for kind, (func, params, replace, apply) in sources.items():
            thread = threading.Thread(
                target=self._reflect,
                args=(kind, func, params, replace, apply),
                name=f"reflector-{kind}",
                daemon=True,
            )
            thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _reflect(self, kind, func, params, replace, apply) -> None:  # type: ignore[no-untyped-def]
        from gpu_scheduler.kube import Gone, watch_events

        why, backoff = "start", 1.0
        while not self._stop.is_set():
            try:
                started = time.monotonic()
                items, version = self._list(func, params)
                replace(items)
                metrics.CACHE_RELISTS.labels(kind, why).inc()
                self._synced[kind].set()
                log.info(
                    "cache listed",
                    extra={
                        "kind": kind,
                        "count": len(items),
                        "why": why,
                        "seconds": round(time.monotonic() - started, 3),
                    },
                )
                del items
                backoff = 1.0
                while not self._stop.is_set():
                    for event, obj in watch_events(func, version, WATCH_SECONDS, **params):
                        version = (obj.get("metadata") or {}).get("resourceVersion") or version
                        if event != "BOOKMARK":
                            apply(event, obj)
                        if self._stop.is_set():
                            return
            except Gone:
                why = "gone"
            except Exception as exc:
                why = "error"
                log.warning(
                    "cache watch failed; relisting",
                    extra={"kind": kind, "error": repr(exc), "backoff": backoff},
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _list(self, func, params) -> tuple[list[dict[str, Any]], str]:  # type: ignore[no-untyped-def]
        items: list[dict[str, Any]] = []
        token = None
        while True:
            response = func(limit=PAGE_SIZE, _continue=token, _preload_content=False, **params)
            page = json.loads(response.data)
            items.extend(page.get("items") or ())
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, meta.get("resourceVersion", "")
