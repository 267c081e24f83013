"""The cluster cache's DRA kinds (extender/sources.py reflects them): DeviceClasses,
ResourceSlices, DeviceTaintRules and ResourceClaims applied to its
:class:`~extender.dra_index.DraIndex`, and the nodes whose GPUs they describe
refreshed (extender/dra_index.py decides what each object means)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from extender import dra_index, metrics
from extender.dra_index import DraIndex
from extender.records import reduced as _reduced
from extender.reflector import Reflector
from gpu_scheduler import dra


class DraEvents:
    """Mixed into :class:`~extender.cache.ClusterCache`, whose state it changes."""

    _lock: threading.RLock
    _dra: DraIndex
    _dra_nodes: set[str]
    _node_version: int
    _pod_version: int
    reflectors: dict[str, Reflector]
    _set_facts: Callable[[str], None]
    _refresh_free: Callable[[str], None]
    _touch: Callable[..., None]

    def _dra_changed(self, nodes: set[str], usage: bool) -> None:
        """After a DRA change (lock held): refresh the nodes it touched."""
        for name in nodes:
            self._set_facts(name)
        if nodes:
            self._touch(*nodes)  # slices (what the recheck reads), classes, rules
            self._node_version += 1
        if usage:
            self._pod_version += 1
            for name in self._dra_nodes:  # claims hold these nodes' devices
                self._refresh_free(name)
        for kind, count in self._dra.counts().items():
            metrics.CACHE_OBJECTS.labels(kind).set(count)
        slices = self.reflectors.get("resourceslices")
        if self._dra.needs_relist and slices is not None and slices.synced.is_set():
            slices.request_relist()

    def _dra_apply(self, change: Callable[..., set[str]], *args: Any) -> None:
        with self._lock:
            self._dra_changed(change(*args), usage=True)

    # A relist's items arrive page by page from the API server (a generator): each is
    # reduced outside the lock, and the lock is taken once the list has ended.
    def replace_device_classes(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._dra_apply(self._dra.replace_classes, _reduced(dra_index.parse_class, items))

    def device_class_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        self._dra_apply(self._dra.class_event, kind, obj)

    def replace_slices(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._dra_apply(self._dra.replace_slices, _reduced(dra_index.parse_slice, items))

    def slice_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        self._dra_apply(self._dra.slice_event, kind, obj)

    def replace_taint_rules(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._dra_apply(self._dra.replace_rules, _reduced(dra_index.parse_rule, items))

    def taint_rule_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        self._dra_apply(self._dra.rule_event, kind, obj)

    def replace_claims(self, items: Iterable[Mapping[str, Any]]) -> None:
        prioritized: set[str] = set()

        def parse(obj: Mapping[str, Any]) -> Any:
            if dra.claim_prioritized(obj) and (ref := dra_index.claim_ref(obj)) is not None:
                prioritized.add(ref)
            return dra_index.parse_claim(obj)

        claims = _reduced(parse, items)
        with self._lock:
            self._dra.prioritized = frozenset(prioritized)
            self._dra.replace_claims(claims)  # usage only: no node's facts change
            self._dra_changed(set(), usage=True)

    def claim_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        with self._lock:
            if self._dra.claim_event(kind, obj):
                self._dra_changed(set(), usage=True)
