"""The cluster cache's picks not bound yet: a pod the extender's filter picked a node
for counts as placed there until the watch shows it bound (or gone), the pod is
filtered again (kube-scheduler is placing it anew: the pick is void), or
:data:`ASSUME_TTL` passes.

Since the filter picks (``filterChooses``), kube-scheduler skips its scoring, so
nothing else weighs a pod that is picked but not bound yet: gang siblings waiting at
Permit, a burst of pods of one group, any pod in its binding cycle. Without this each
is ranked on a view where the node the last one took still looks empty (four 4-GPU
members of a gang spread over four 8-GPU nodes instead of filling two). kube-scheduler's
own fit check counts its assumed pods, so an assumption can only make the pick better
informed, never let a pod onto a full node. Each extender replica counts its own picks.

Here too the one place a pod starts or stops being counted on its node (``_place``,
``_unplace``), for the watch's events and for the picks alike.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from extender import metrics
from extender.records import PodRecord, record_on

#: Seconds a pick counts without the watch confirming it. A binding takes
#: milliseconds; a gang's members wait at Permit for their siblings, seconds.
ASSUME_TTL = 30.0


class AssumedPicks:
    """Mixed into :class:`~extender.cache.ClusterCache`, whose pods it counts."""

    _lock: threading.RLock
    _pods: dict[str, PodRecord]
    _monotonic: Callable[[], float]
    _pod_version: int
    #: uid -> (when it stops counting, the record as if bound there)
    _assumed: dict[str, tuple[float, PodRecord]]

    _node_pods: dict[str, list[str]]
    _account: Callable[[PodRecord, int], None]
    _refresh_free: Callable[[str], None]
    _touch: Callable[..., None]
    picked_at: Callable[[str, Mapping[str, Any]], None]

    def assume(self, pod: Mapping[str, Any], node: str) -> None:
        """The filter picked ``node`` for ``pod``: count it there from now on."""
        found = record_on(pod, node)
        if found is None:
            return
        uid, record = found
        with self._lock:
            if uid in self._pods and uid not in self._assumed:
                return  # the watch has it bound already
            self._place(uid, record, self._unplace(uid))
            self._assumed[uid] = (self._monotonic() + ASSUME_TTL, record)
            self.picked_at(uid, pod)
            self._pod_version += 1
        metrics.child(metrics.CACHE_OBJECTS, "assumed").set(len(self._assumed))

    def forget(self, uid: str | None) -> None:
        """``uid`` is being filtered again: its earlier pick no longer counts."""
        if uid is None or uid not in self._assumed:
            return
        with self._lock:
            if self._assumed.pop(uid, None) is not None:
                self._unplace(uid)
                self._pod_version += 1
        metrics.child(metrics.CACHE_OBJECTS, "assumed").set(len(self._assumed))

    def _expire_assumed(self) -> None:
        """Drop the picks whose time is up (lock held)."""
        now = self._monotonic()
        gone = [uid for uid, (until, _) in self._assumed.items() if until <= now]
        for uid in gone:
            del self._assumed[uid]
            self._unplace(uid)
        if gone:
            self._pod_version += 1
            metrics.child(metrics.CACHE_OBJECTS, "assumed").set(len(self._assumed))

    def _place(self, uid: str, record: PodRecord, previous: PodRecord | None = None) -> None:
        """Count a pod on its node (lock held). ``previous``: what was counted of it
        until now; on the same node the pod keeps its place in the node's order."""
        if previous is not None and previous.node == record.node:
            record.seq = previous.seq
        elif not record.seq:
            self._seq += 1
            record.seq = self._seq
        self._pods[uid] = record
        self._node_pods.setdefault(record.node, []).append(uid)
        self._account(record, 1)
        self._refresh_free(record.node)
        self._touch(record.node)

    def _unplace(self, uid: str) -> PodRecord | None:
        """Stop counting a pod (lock held); what was counted."""
        old = self._pods.pop(uid, None)
        if old is not None:
            uids = self._node_pods.get(old.node)
            if uids is not None and uid in uids:  # (always, unless a bug: never raise here)
                uids.remove(uid)
                if not uids:
                    del self._node_pods[old.node]
            self._account(old, -1)
            self._refresh_free(old.node)
            self._touch(old.node)
        return old

    def _keep_assumed(self) -> None:
        """After a relist (lock held): the picks the list did not find bound count on."""
        for uid, (_, record) in list(self._assumed.items()):
            if uid in self._pods:
                del self._assumed[uid]
            else:
                self._place(uid, record)
