"""Read a pod's few candidates again before turning it away: filter's guard against a
watch that is behind kube-scheduler's.

kube-scheduler retries a pod that an extender turned away on any cluster event
(kubernetes#122019): a Node's labels or annotations changing, a bound pod going. It
calls filter a millisecond or two after its informer saw that event, and the
extender's own watch of the same objects may not have delivered it yet. Measured in
the GPU-health e2e on a loaded machine: the agent's patch that healed a GPU, and a
filter call that still saw the GPU sick, were 1 ms apart. Answered from that view,
the pod is parked as unschedulable until the next cluster event; in a quiet cluster
that is kube-scheduler's 5-minute flush of its unschedulable pods.

So when filter would pass none of at most :data:`MAX_NODES` candidates, it reads
those Nodes and the pods bound to them from the API server (quorum reads), and on a
node whose GPUs a DRA driver publishes its ResourceSlices (a device taint cleared),
takes what differs into the cache as a watch event would, and decides again. The watch
later delivers the same objects, or older states of them followed by the same ones:
the cache ends where the API server is either way.

Bounded, because this is kube-scheduler's hot path and the API server's load:
- only a verdict of no node, for a pod whose own spec is readable;
- only up to :data:`MAX_NODES` candidates: a pod that thousands of nodes turn away is
  not waiting on one event, and a cluster that size has its next event soon;
- :data:`RATE` node reads a second across the process (burst :data:`BURST`);
- each API call gives up after :data:`TIMEOUT` s (a timed-out node is asked once
  more over a new connection), and no node is begun after :data:`DEADLINE` s
  (kube-scheduler's extender ``httpTimeout`` is 5 s). A failed read is logged and
  counted, and the verdict stands.

Not read again: DRA claims (which devices are in use; a claim names no node a field
selector can find) and DeviceTaintRules, and the agents' Leases (kube-scheduler does
not watch Leases: a renewal is never the event that a retry follows).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from extender import metrics
from extender.bucket import TokenBucket
from extender.model import node_facts
from extender.records import PodRecord, object_key, pod_record
from extender.sources import LIVE_PODS
from gpu_scheduler.fields import FieldError
from gpu_scheduler.kube import decode_json, is_timeout, reset_connections

log = logging.getLogger(__name__)

#: Most candidates a verdict of no node is checked against the API server for.
MAX_NODES = 8
#: Node reads a second (each a Node and its pods), and the most at once.
RATE, BURST = 5.0, 20
#: Seconds one API call may take (connect, then read), and all of one filter's reads
#: before the next begins: at worst 1.5 + 2 x 2 x 0.5 = 3.5 s, inside kube-scheduler's
#: extender httpTimeout of 5 s.
TIMEOUT, DEADLINE = 0.5, 1.5


class Recheck:
    """``recheck(names)`` -> how many objects differed and are now in the cache."""

    def __init__(
        self,
        cache: Any,  # extender.cache.ClusterCache (which builds this one)
        core: Any,  # kubernetes.client.CoreV1Api
        resource: Any = None,  # kubernetes.client.ResourceV1Api (DRA)
        *,
        bucket: TokenBucket | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cache = cache
        self._core, self._resource = core, resource
        self._bucket = bucket or TokenBucket(RATE, BURST, clock)
        self._clock = clock

    def __call__(self, names: Sequence[str]) -> int:
        if not names or len(names) > MAX_NODES:
            return 0
        started, changed = self._clock(), 0
        for name in dict.fromkeys(names):
            if self._clock() - started > DEADLINE or not self._bucket.take():
                metrics.RECHECKS.labels("skipped").inc()
                continue
            try:
                found = self._read_again(name)
            except Exception as exc:
                metrics.RECHECKS.labels("failed").inc()
                log.warning(
                    "could not read a candidate again; the verdict stands",
                    extra={"node": name, "error": repr(exc)},
                )
                continue
            metrics.RECHECKS.labels("changed" if found else "same").inc()
            changed += found
        return changed

    def _read_again(self, name: str) -> int:
        try:
            return self._node(name) + self._pods(name) + self._slices(name)
        except Exception as exc:
            if not is_timeout(exc):
                raise
        # Maybe a half-open pooled connection (the watches find theirs only after
        # 50 s of silence): drop the idle ones and ask once more over a new one.
        reset_connections(self._core.api_client)
        return self._node(name) + self._pods(name) + self._slices(name)

    def _slices(self, name: str) -> int:
        """On a node whose GPUs a DRA driver publishes (or may: the Node itself says
        none), its ResourceSlices; 1 where what filter reads of the node changed."""
        before, known = self._cache.node_state(name)
        base = self._cache.facts_of(name)
        if self._resource is None or known is None or (base and base.allocatable):
            return 0
        page = self._read(
            self._resource.list_resource_slice, field_selector=f"spec.nodeName={name}"
        )
        listed = set()
        for item in page.get("items") or ():
            self._cache.slice_event("MODIFIED", item)
            listed.add(object_key(item))
        for key in known - listed:
            self._cache.slice_event("DELETED", {"metadata": {"uid": key}})
        return int(self._cache.node_state(name)[0] != before)

    def _node(self, name: str) -> int:
        known = self._cache.facts_of(name)
        try:
            obj = self._read(self._core.read_node, name)
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                raise
            if known is None:
                return 0
            self._cache.node_event("DELETED", {"metadata": {"name": name}})
            return 1
        try:
            if known == node_facts(obj, self._cache.levels):
                return 0
        except FieldError:
            return 0  # the watch skips it too, and says so
        self._cache.node_event("MODIFIED", obj)
        return 1

    def _pods(self, name: str) -> int:
        page = self._read(
            self._core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={name},{LIVE_PODS}",
        )
        objects: dict[str, Any] = {}
        fresh: dict[str, PodRecord] = {}
        for item in page.get("items") or ():
            if (record := pod_record(item)) is not None:
                objects[record[0]], fresh[record[0]] = item, record[1]
        known = self._cache.pods_on(name)
        changed = [uid for uid, record in fresh.items() if known.get(uid) != record]
        for uid in changed:
            self._cache.pod_event("MODIFIED", objects[uid])
        gone = known.keys() - fresh.keys()
        for uid in gone:
            self._cache.pod_event("DELETED", {"metadata": {"uid": uid}})
        return len(changed) + len(gone)

    def _read(self, call: Callable[..., Any], *args: Any, **params: Any) -> Any:
        timeout = (TIMEOUT, TIMEOUT)
        response = call(*args, _preload_content=False, _request_timeout=timeout, **params)
        try:
            return decode_json(response.data)
        finally:
            response.release_conn()
