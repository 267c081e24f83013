"""The cluster cache's side of filter's recheck (extender/recheck.py).

The recheck reads a node from the API server outside the cache's lock, and a watch
event may land in between: applied after it, what the recheck read could put back an
older state (a pod the watch has just deleted, bound again forever). So the recheck
first takes a :class:`Snapshot` of the node under the lock, with the node's *mark*:
which change of the cache last touched what the recheck reads of it (its Node, its
pods, its ResourceSlices; not claims or Leases, which it does not read). It applies
what it read only if the mark has not moved since
(:meth:`RecheckAccess.apply_unless_moved`, under the same lock); if it has, the watch
has spoken about the node meanwhile, and the recheck defers to it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from extender.dra_index import DraIndex
from extender.model import NodeFacts
from extender.records import PodRecord


class Snapshot(NamedTuple):
    mark: tuple[int, int | None]
    #: What the Node object itself says (no DRA devices, no heartbeat).
    base: NodeFacts | None
    #: What filter reads of the node: its facts as the policies see them, its FreeState.
    state: tuple[Any, Any]
    pods: dict[str, PodRecord]
    #: Whether the API server serves ResourceSlices (a DRA node's GPUs may be there).
    slices_served: bool
    #: The picks counted on the node (not bound when last seen): uid -> namespace/name.
    picks: dict[str, str] = {}


class RecheckAccess:
    """Mixed into :class:`~extender.cache.ClusterCache`, whose state it reads."""

    _lock: threading.RLock
    _base: dict[str, NodeFacts]
    _nodes: dict[str, NodeFacts]
    _free: Mapping[str, Any]
    _pods: dict[str, PodRecord]
    _assumed: dict[str, tuple[float, PodRecord]]
    _node_pods: dict[str, list[str]]
    _dra: DraIndex
    _marks: dict[str, int]
    _epoch: int
    _changes: int
    reflectors: Mapping[str, Any]

    def _touch(self, *names: str) -> None:
        """What the recheck reads of these nodes changed (lock held): a new mark."""
        self._changes += 1
        for name in names:
            self._marks[name] = self._changes

    def _mark(self, name: str) -> tuple[int, int | None]:
        return self._epoch, self._marks.get(name)

    def recheck_snapshot(self, name: str) -> Snapshot:
        slices = self.reflectors.get("resourceslices")
        with self._lock:
            # Not the picks waiting for their binding (at Permit, or binding): the API
            # server has them unbound, which says nothing of whether they will bind.
            # They are read one by one instead (Recheck._read_picks).
            assumed, pods, picks = self._assumed, {}, {}
            for uid in self._node_pods.get(name, ()):
                record = self._pods[uid]
                if uid not in assumed:
                    pods[uid] = record
                elif record.name:
                    picks[uid] = record.name
            return Snapshot(
                self._mark(name),
                self._base.get(name),
                (self._nodes.get(name), self._free.get(name)),
                pods,
                slices is not None and slices.absent is None,
                picks,
            )

    def apply_unless_moved(self, snapshot: Snapshot, name: str, apply: Callable[[], int]) -> int:
        """``apply()`` (it calls the cache's event methods) if nothing has touched the
        node since ``snapshot``; else 0."""
        with self._lock:
            return apply() if self._mark(name) == snapshot.mark else 0

    def slice_held(self, obj: Mapping[str, Any]) -> bool:
        with self._lock:
            return self._dra.holds(obj)

    def state_of(self, name: str) -> tuple[Any, Any]:
        with self._lock:
            return self._nodes.get(name), self._free.get(name)
