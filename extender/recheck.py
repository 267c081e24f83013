"""Read a pod's few candidates again before turning it away: filter's guard against a
watch that is behind kube-scheduler's.

kube-scheduler retries a pod that an extender turned away on any cluster event
(kubernetes#122019): a Node's labels or annotations changing, a bound pod going. It
calls filter a millisecond or two after its informer saw that event, and the
extender's own watch of the same objects may not have delivered it yet. Measured in
the GPU-health e2e on a loaded machine: the agent's patch that healed a GPU, and a
filter call that still saw the GPU sick, were 1 ms apart. Answered from that view,
the pod is parked as unschedulable until the next cluster event; in a quiet cluster
that is kube-scheduler's 5-minute flush of its unschedulable pods. Without the
recheck, the watch-behind fault tests (tests/e2e/test_faults.py) wait out that flush.

So when filter would pass none of at most :data:`MAX_NODES` candidates, it reads
those Nodes and the pods bound to them from the API server (quorum reads), and on a
node whose GPUs a DRA driver publishes its ResourceSlices (a device taint cleared),
takes what differs into the cache as a watch event would, and decides again. What was
read is applied only if the watch has not touched the node since the read began
(extender/cache_recheck.py): a watch event that lands in between is newer than the
cache's snapshot, and the recheck defers to it rather than put an older state back.
The watch later delivers the same objects, or older states of them followed by the
same ones: the cache ends where the API server is either way.

Bounded, because this is kube-scheduler's hot path and the API server's load:
- only a verdict of no node, for a pod whose own spec is readable;
- only up to :data:`MAX_NODES` candidates: a pod that thousands of nodes turn away is
  not waiting on one event, and a cluster that size has its next event soon;
- :data:`RATE` node reads a second across the process (burst :data:`BURST`), of which
  :data:`RESERVED` are kept for pods kube-scheduler has nominated a node for (a
  preemptor waiting for its victims to go: the watch that tells of them is the one
  it waits on); such a pod's nominated node is read first;
- one filter's reads share :data:`BUDGET` s, a small part of kube-scheduler's
  serial cycle and of its extender ``httpTimeout`` (5 s): each API call may take
  :data:`TIMEOUT` s or what is left of the budget, whichever is less, over a client
  of its own that urllib3 does not retry (its default would try 4 times, each with the
  whole timeout); a node whose read timed out is read once more over a new
  connection. A failed read is logged and counted, and the verdict stands.

Not read again: DRA claims (which devices are in use; a claim names no node a field
selector can find), DeviceTaintRules, a ResourceSlice deleted or spanning nodes
(``perDeviceNodeSelection``: no node's list returns it, so its absence says nothing),
and the agents' Leases (kube-scheduler does not watch Leases: a renewal is never the
event that a retry follows).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from extender import metrics
from extender.bucket import TokenBucket
from extender.cache_recheck import Snapshot
from extender.model import node_facts
from extender.records import pod_record
from extender.sources import LIVE_PODS
from gpu_scheduler.fields import FieldError
from gpu_scheduler.jsondecode import decode_json
from gpu_scheduler.kube import is_timeout, reset_connections

log = logging.getLogger(__name__)

#: Most candidates a verdict of no node is checked against the API server for.
MAX_NODES = 8
#: Node reads a second (each a Node, its pods, a DRA node's slices), and the most at once.
RATE, BURST = 5.0, 20
#: Reads of the burst only a pod with a nominated node may take.
RESERVED = 5
#: Seconds one API call may take, and all of one filter's reads together: what the
#: watch-behind e2e needs (a read of a Node and its pods takes 5-20 ms there).
TIMEOUT, BUDGET = 0.1, 0.25


#: At most this many picks of one node are read by name in one recheck.
MAX_PICKS = 8
#: Marks what the recheck read of a pick whose pod is gone.
GONE = "gpu-scheduler.io/gone"


class OutOfTime(Exception):
    """The filter's budget for reads is spent."""


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
        self._core, self._resource = _without_retries(core, resource)
        self._bucket = bucket or TokenBucket(RATE, BURST, clock)
        self._clock = clock

    @property
    def apis(self) -> tuple[Any, Any]:
        """(CoreV1Api, PolicyV1Api) over this client (no retries), for the preempt
        verb's reads of a node's pods and budgets (extender/budgets.py); a fake API
        serves both from one object."""
        core = self._core
        if getattr(core, "api_client", None) is None:
            return core, core if hasattr(
                core, "list_pod_disruption_budget_for_all_namespaces"
            ) else None
        from kubernetes import client

        return core, client.PolicyV1Api(core.api_client)

    def __call__(self, names: Sequence[str], nominated: str | None = None) -> int:
        """Read ``names`` again; ``nominated``: the node kube-scheduler nominated the
        pod for, if any (read first, from the reserve)."""
        if not names or len(names) > MAX_NODES:
            return 0
        deadline, changed = self._clock() + BUDGET, 0
        order = dict.fromkeys(names)
        if nominated in order:
            order = {nominated: None, **order}
        keep = 0.0 if nominated else float(RESERVED)
        for name in order:
            if self._clock() >= deadline or not self._bucket.take(keep):
                metrics.RECHECKS.labels("skipped").inc()
                continue
            try:
                found = self._read_again(name, deadline)
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

    def _read_again(self, name: str, deadline: float) -> int:
        """Snapshot, read everything, then apply it all at once (or nothing)."""
        for attempt in (1, 2):
            snapshot = self._cache.recheck_snapshot(name)
            try:
                read = self._read_node(name, snapshot, deadline)
            except Exception as exc:
                if attempt == 2 or not is_timeout(exc):
                    raise
                # Maybe a half-open pooled connection (the watches find theirs only
                # after 50 s of silence): drop the idle ones, ask over a new one.
                reset_connections(self._core.api_client)
                continue
            return self._cache.apply_unless_moved(snapshot, name, partial(self._apply, *read))
        return 0  # not reached: the second attempt returns or raises

    def _read_node(self, name: str, snapshot: Snapshot, deadline: float) -> tuple[Any, ...]:
        try:
            node = self._read(deadline, self._core.read_node, name)
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                raise
            node = None
        pods = self._items(
            deadline, self._core.list_pod_for_all_namespaces, f"spec.nodeName={name},{LIVE_PODS}"
        )
        pods = [*pods, *self._read_picks(snapshot, pods, deadline)]
        slices: Any = ()
        base = snapshot.base
        # A node whose Node advertises no GPUs: a DRA driver's, or about to be.
        if self._resource and snapshot.slices_served and not (base and base.allocatable):
            slices = self._items(
                deadline, self._resource.list_resource_slice, f"spec.nodeName={name}"
            )
        return name, snapshot, node, pods, slices

    def _read_picks(self, snapshot: Snapshot, bound: Any, deadline: float) -> list[Any]:
        """The node's picks that the list of its bound pods does not show, each read
        by name: one still pending (at Permit, or binding) stays counted; one bound is
        taken as bound; one gone (deleted while pending: kube-scheduler retries the
        pods it turned away at once) stops counting now, as a DELETED marker."""
        listed = {item.get("metadata", {}).get("uid") for item in bound}
        out: list[Any] = []
        for uid, key in list(snapshot.picks.items())[:MAX_PICKS]:
            if uid in listed:
                continue
            namespace, _, pod_name = key.partition("/")
            try:
                pod = self._read(deadline, self._core.read_namespaced_pod, pod_name, namespace)
            except Exception as exc:
                if getattr(exc, "status", None) != 404:
                    raise
                out.append({"metadata": {"uid": uid}, GONE: True})
                continue
            meta = pod.get("metadata") if isinstance(pod, dict) else None
            if not isinstance(meta, dict) or meta.get("uid") != uid:
                out.append({"metadata": {"uid": uid}, GONE: True})  # recreated: not ours
            elif (pod.get("spec") or {}).get("nodeName"):
                out.append(pod)
        return out

    def _items(self, deadline: float, call: Callable[..., Any], selector: str) -> Any:
        return self._read(deadline, call, field_selector=selector).get("items") or ()

    def _apply(self, name: str, snapshot: Snapshot, node: Any, pods: Any, slices: Any) -> int:
        """Under the cache's lock, nothing having touched the node since the snapshot."""
        changed = 0
        if node is None and snapshot.base is not None:
            self._cache.node_event("DELETED", {"metadata": {"name": name}})
            changed += 1
        elif node is not None and _differs(snapshot.base, node, self._cache.levels):
            self._cache.node_event("MODIFIED", node)
            changed += 1
        fresh = {}
        for item in pods:
            if item.get(GONE):
                self._cache.pod_event("DELETED", item)  # a pick whose pod is gone
                changed += 1
            elif (record := pod_record(item)) is not None:
                fresh[record[0]] = (record[1], item)
        for uid, (record, item) in fresh.items():
            if snapshot.pods.get(uid) != record:
                self._cache.pod_event("MODIFIED", item)
                changed += 1
        for uid in snapshot.pods.keys() - fresh.keys():
            self._cache.pod_event("DELETED", {"metadata": {"uid": uid}})
            changed += 1
        before = self._cache.state_of(name)
        for item in slices:
            if not self._cache.slice_held(item):
                self._cache.slice_event("MODIFIED", item)
        return changed + int(bool(slices) and self._cache.state_of(name) != before)

    def _read(self, deadline: float, call: Callable[..., Any], *args: Any, **params: Any) -> Any:
        left = deadline - self._clock()
        if left <= 0:
            raise OutOfTime(f"the recheck's {BUDGET * 1000:.0f} ms are spent")
        # One number: the client makes it urllib3's total for connecting and reading.
        timeout = min(TIMEOUT, left)
        response = call(*args, _preload_content=False, _request_timeout=timeout, **params)
        try:
            return decode_json(response.data)
        finally:
            response.release_conn()


def _differs(known: Any, obj: Any, levels: Sequence[str]) -> bool:
    try:
        return known != node_facts(obj, levels)
    except FieldError:
        return False  # the watch skips it too, and says so


def _without_retries(core: Any, resource: Any) -> tuple[Any, Any]:
    """The same APIs over a client of their own whose calls urllib3 does not retry
    (kubernetes' client leaves ``retries`` unset: urllib3 tries 4 times, each with the
    whole timeout), so a call takes at most its timeout. Fakes pass through."""
    configuration = getattr(getattr(core, "api_client", None), "configuration", None)
    if configuration is None:
        return core, resource
    from kubernetes import client

    configuration = copy.copy(configuration)
    configuration.retries = False
    api = client.ApiClient(configuration)
    return client.CoreV1Api(api), client.ResourceV1Api(api) if resource is not None else None
