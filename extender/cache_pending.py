"""The cluster cache's pending pods: what kube-scheduler keeps of a pod before it is
bound, which the watch of bound pods never shows.

A second pod watch (``spec.nodeName=``, not finished: :data:`PENDING_FIELD_SELECTOR`)
tells the cache two things kube-scheduler knows and the extender otherwise guesses:

- **Picks that will not bind.** A pick (cache_assumed) counts a pod on its node until
  the bound watch shows it. A pod deleted while it waits at Permit or in its binding
  cycle, refused at Permit, whose binding failed, or whose PodGroup cycle was
  reverted, never binds: its pick would hold the node's GPUs for ``ASSUME_TTL``. The
  pending watch ends the pick when kube-scheduler writes a scheduling failure on the
  pod after the pick (``handleSchedulingFailure``: condition ``PodScheduled=False`` on
  a newer resourceVersion than the one filter saw), unless it nominates the picked
  node (``NominatedNodeNameForExpectation`` nominates the node it is binding to). A
  pod that leaves the pending set arrives as DELETED whether it was deleted or bound
  (the watch cache sends the object as it was before: ``cacheWatcher.
  convertToWatchEvent``), so that cuts its pick to :data:`GONE_GRACE` seconds: a
  binding reaches the bound watch well within it (which then counts the pod as
  bound), a deletion frees the node when it passes.
- **Nominated pods.** A preemptor waits for its victims with
  ``status.nominatedNodeName`` set; kube-scheduler's filters count it on that node
  for pods of equal or lower priority (``RunFilterPluginsWithNominatedPods``). The
  view carries each node's nominated GPU pods (:attr:`View.nominated`), and filter
  counts those of equal or higher priority than the pod it places
  (extender/nominated.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from extender import metrics
from extender.records import PodRecord, object_key, record_on

#: Pods not bound and not finished.
PENDING_FIELD_SELECTOR = "spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"
#: Seconds a pick counts once its pod left the pending set, unless the bound watch
#: shows it bound meanwhile.
GONE_GRACE = 1.0
#: A node's nominated GPU pods: (uid, record as if bound there), in arrival order.
Nominated = tuple[tuple[str, PodRecord], ...]


def nominated_record(pod: Mapping[str, Any]) -> tuple[str, PodRecord] | None:
    """(uid, record as if bound to its nominated node) for a pending pod that has a
    nominated node and asks GPUs or shares; else None. Never raises."""
    status = pod.get("status")
    node = status.get("nominatedNodeName") if isinstance(status, Mapping) else None
    spec = pod.get("spec")
    if not isinstance(node, str) or not node or not isinstance(spec, Mapping):
        return None
    if spec.get("nodeName"):
        return None
    found = record_on(pod, node)
    if found is None or not (found[1].gpus or found[1].shares):
        return None
    return found


def failed_after_pick(pod: Mapping[str, Any], picked_version: str | None, node: str) -> bool:
    """Whether ``pod`` (pending) says kube-scheduler abandoned the pick of ``node``
    made when the pod was at ``picked_version``: a newer version carrying
    ``PodScheduled=False``, not nominating ``node`` (kube-scheduler may nominate the
    node it is binding to before the binding)."""
    meta, status = pod.get("metadata"), pod.get("status")
    if not isinstance(meta, Mapping) or not isinstance(status, Mapping):
        return False
    version = meta.get("resourceVersion")
    if not isinstance(version, str) or version == picked_version:
        return False
    if status.get("nominatedNodeName") == node:
        return False
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else ():
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
        ):
            return True
    return False


class PendingPods:
    """Mixed into :class:`~extender.cache.ClusterCache`."""

    _lock: threading.RLock
    _pod_version: int
    _assumed: dict[str, tuple[float, PodRecord]]
    _monotonic: Callable[[], float]
    forget: Callable[[str | None], None]

    def _init_pending(self) -> None:
        #: uid -> (node, record) of each pending GPU pod with a nominated node.
        self._nominations: dict[str, tuple[str, tuple[str, PodRecord]]] = {}
        #: uid -> the resourceVersion of the pod filter picked a node for.
        self._picked_versions: dict[str, str | None] = {}
        self._nominated_view: tuple[int, Mapping[str, Nominated]] = (-1, MappingProxyType({}))
        self._nominations_changed = 0

    def picked_at(self, uid: str, pod: Mapping[str, Any]) -> None:
        """Filter picked a node for ``pod`` (lock held by the caller or not needed:
        one dict store): the version it saw, to tell a later failure from an old one."""
        meta = pod.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        versions = self._picked_versions
        versions[uid] = version if isinstance(version, str) else None
        if len(versions) > 2 * len(self._assumed) + 64:  # picks bound or expired since
            for gone in [key for key in versions if key not in self._assumed]:
                del versions[gone]

    def replace_pending(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A list of pending pods: nominations anew; a pick whose pod is not pending
        any more stays to the bound watch or its TTL (the list cannot tell bound from
        deleted)."""
        found = {}
        for item in items:
            nominated = nominated_record(item)
            if nominated is not None:
                found[nominated[0]] = (nominated[1].node, nominated)
        with self._lock:
            self._nominations = found
            self._nominations_changed += 1
            self._pod_version += 1
        metrics.child(metrics.CACHE_OBJECTS, "nominated").set(len(found))

    def pending_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        uid = object_key(obj)
        if uid is None:
            return
        nominated = None if kind == "DELETED" else nominated_record(obj)
        end_pick = False
        with self._lock:
            picked = self._assumed.get(uid)
            if picked is not None and kind == "DELETED":  # deleted, or bound
                until = min(picked[0], self._monotonic() + GONE_GRACE)
                self._assumed[uid] = (until, picked[1])
                metrics.child(metrics.PICKS_ENDED, "left-pending").inc()
            elif picked is not None:
                end_pick = failed_after_pick(obj, self._picked_versions.get(uid), picked[1].node)
            before = self._nominations.get(uid)
            if nominated is None:
                self._nominations.pop(uid, None)
            else:
                self._nominations[uid] = (nominated[1].node, nominated)
            if before is not None or nominated is not None:
                self._nominations_changed += 1
                self._pod_version += 1
            if kind == "DELETED":
                self._picked_versions.pop(uid, None)
        if end_pick:
            metrics.child(metrics.PICKS_ENDED, "failed").inc()
            self.forget(uid)
        metrics.child(metrics.CACHE_OBJECTS, "nominated").set(len(self._nominations))

    def _nominated_snapshot(self) -> Mapping[str, Nominated]:
        """Node -> its nominated GPU pods, for a view (lock held); the same object
        until a nomination changes."""
        if self._nominated_view[0] != self._nominations_changed:
            by_node: dict[str, list[tuple[str, PodRecord]]] = {}
            for node, entry in self._nominations.values():
                by_node.setdefault(node, []).append(entry)
            frozen = MappingProxyType({n: tuple(e) for n, e in by_node.items()})
            self._nominated_view = (self._nominations_changed, frozen)
        return self._nominated_view[1]
