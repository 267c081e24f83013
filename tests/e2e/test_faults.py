"""What the control plane does to the extender, injected on a control plane of its own.

Each scenario runs its own extender and its own kube-scheduler profile (so pods pick
the scenario by ``schedulerName``); where the fault is in the network, the extender
reaches the API server through :class:`tests.e2e.faults.Proxy`. Measured bounds are
quoted in the README's "Failure modes".
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import requests

from gpu_scheduler import contract
from tests.e2e.kube import (
    bind_pod,
    core,
    create_node,
    delete_pod,
    gpu_labels,
    play_kubelet_with_device_plugin,
    pod_manifest,
    put_lease,
    server_minor,
    unique,
    wait_bound,
    wait_event,
)
from tests.e2e.scenarios import (
    GPU_TAINT,
    H100,
    Scenario,
    create_gpu_device_class,
    own_stack,
    publish_slice,
    scenario,
)
from tests.helpers import wait_for


@pytest.fixture(scope="module")
def faults(tmp_path_factory, control_plane_binary):
    stack = own_stack(tmp_path_factory.mktemp("faults"), control_plane_binary)
    yield stack
    stack.stop()


def test_a_half_open_connection_is_detected_and_healed(faults):
    """The proxy freezes the extender's connections (new ones still go through): within
    the silence bound (50 s) the watches are abandoned and the kinds listed again over
    new connections. /readyz says 503 while the view is over 40 s old."""
    with scenario(faults, "halfopen") as s:
        wait_for(lambda: s.ready() == 200, 30, "extender ready")
        assert s.proxy is not None and s.proxy.freeze() >= 2  # both watches frozen
        frozen_at = time.monotonic()
        node = s.node("halfopen")
        pod = s.pod(1, "halfopen")
        states: list[tuple[float, int]] = []
        bound_at = None
        while time.monotonic() - frozen_at < 120:
            states.append((time.monotonic() - frozen_at, s.ready()))
            if core(faults).read_namespaced_pod(pod, "default").spec.node_name:
                bound_at = time.monotonic() - frozen_at
                break
            time.sleep(0.5)
        assert bound_at is not None, f"pod not bound in 120 s; readyz: {states[-5:]}"
        assert core(faults).read_namespaced_pod(pod, "default").spec.node_name == node
        assert bound_at < 90, bound_at
        stale = [t for t, code in states if code == 503]
        assert stale, f"/readyz never said the view was too old: {states}"
        assert any(code == 200 for t, code in states if t > stale[-1]) or s.ready() == 200
        assert "went silent" in s.extender.log_path.read_text()
        print(f"half-open: 503 from {stale[0]:.0f}s to {stale[-1]:.0f}s; bound {bound_at:.0f}s")


def _bound_behind_the_watch(
    s: Scenario, waiting: str, node: str, change: Callable[[], object]
) -> float:
    """Freeze every connection the extender holds, its watches included (they hear
    nothing more until the 50 s silence bound), make ``change`` on the API server, and
    return how long the waiting pod took to be bound to ``node`` after it: only the
    recheck (extender/recheck.py) can have told the extender."""
    assert s.proxy is not None and s.proxy.freeze() >= 2
    changed_at = time.monotonic()
    change()
    assert wait_bound(s.stack, waiting, timeout=45) == node
    took = time.monotonic() - changed_at
    assert took < 30, took  # the watches were still silent
    assert s.metric('gpu_scheduler_extender_rechecks_total{outcome="changed"}') >= 1
    return took


def test_a_retry_the_watch_has_not_caught_up_with_reads_the_node_again(faults):
    """A pod waits for the GPUs another pod holds. The extender's watches are frozen
    (they hear nothing more until the 50 s silence bound), and the holder is deleted:
    kube-scheduler retries the pod at once, on a view that still shows the GPUs held.
    Filter reads the node and its pods again (extender/recheck.py; its pooled
    connections are frozen too, so the read times out and is asked again over a new
    one) and the pod is bound, not parked until the watch recovers."""
    with scenario(faults, "behind") as s:
        wait_for(lambda: s.ready() == 200, 30, "extender ready")
        node = s.node("behind")
        holder = s.pod(8, "behind")
        assert wait_bound(faults, holder) == node
        waiting = s.pod(8, "behind")
        wait_event(faults, waiting, "Insufficient nvidia.com/gpu")  # kube-scheduler's own fit
        took = _bound_behind_the_watch(s, waiting, node, lambda: delete_pod(faults, holder))
        assert "went silent" not in s.extender.log_path.read_text()
        print(f"watch behind: the waiting pod bound {took:.1f}s after the holder went")


def test_gpus_that_appear_while_the_watch_is_behind_take_the_waiting_pod(faults):
    """The autoscaler's path: a new node has registered without GPUs, a GPU pod waits,
    and the device plugin then advertises 8. kube-scheduler retries the pod on that
    Node update at once; the extender's watches are frozen, so its view still has a
    node without GPUs. Filter reads the node again and the pod is bound."""
    with scenario(faults, "appear") as s:
        wait_for(lambda: s.ready() == 200, 30, "extender ready")
        labels = gpu_labels(8, *H100)
        node = create_node(faults, unique("appear"), case="appear", labels=labels, taints=GPU_TAINT)
        waiting = s.pod(8, "appear")
        wait_event(faults, waiting, "Insufficient nvidia.com/gpu")  # kube-scheduler's own fit
        probe = pod_manifest("probe", 8)
        reason = "advertises no allocatable"
        wait_for(
            lambda: reason in s.filter(probe, [node])["FailedNodes"].get(node, ""),
            30,
            "the extender knows the node, labelled but without GPUs",
        )
        advertise = partial(play_kubelet_with_device_plugin, faults, node, 8)
        took = _bound_behind_the_watch(s, waiting, node, advertise)
        print(f"GPUs appearing behind the watch: the waiting pod bound {took:.1f}s later")


def test_a_dra_device_healed_while_the_watch_is_behind_takes_the_waiting_pod(faults):
    """A node of 4 DRA GPUs, one tainted NoSchedule by the driver's health check
    (KEP-5055, served from 1.37); a 4-GPU pod waits. The extender's watches are frozen,
    and the driver clears the taint: kube-scheduler retries the pod on the slice
    update, the extender's view still has the taint, and filter reads the node's
    ResourceSlices again."""
    from kubernetes import client

    resource = client.ResourceV1Api(faults.api)
    if server_minor(faults) < 37:
        pytest.skip("device taints are served from 1.37")
    create_gpu_device_class(faults)
    node = create_node(faults, unique("drasick"), case="drasick", taints=GPU_TAINT)
    taint = {"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    publish_slice(faults, node, "NVIDIA L4", 23034, 4, taints={1: [taint]})
    with scenario(faults, "drasick") as s:
        wait_for(lambda: s.ready() == 200, 30, "extender ready")
        probe = pod_manifest("probe", 4)
        wait_for(
            lambda: (
                "healthy" in s.filter(probe, [node])["FailedAndUnresolvableNodes"].get(node, "")
            ),
            30,
            "the extender sees the tainted device",
        )
        waiting = s.pod(4, "drasick")
        wait_event(faults, waiting, "FailedScheduling")

        def heal() -> None:
            (found,) = resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items
            healed = faults.api.sanitize_for_serialization(found)
            for each in healed["spec"]["devices"]:
                each.pop("taints", None)
            resource.replace_resource_slice(healed["metadata"]["name"], healed)

        took = _bound_behind_the_watch(s, waiting, node, heal)
        print(f"DRA device healed behind the watch: the waiting pod bound {took:.1f}s later")


def test_a_slow_first_list_does_not_park_pods(faults):
    """The extender's first list is held for 20 s; GPU pods created meanwhile get an
    error answer (kube-scheduler retries within 10 s), not 'unknown node', and are
    bound within 30 s of the cache syncing."""
    with scenario(faults, "slowlist", hold=True) as s:
        node = s.node("slowlist")
        pod = s.pod(2, "slowlist")
        time.sleep(20)
        assert s.ready() == 503
        assert not core(faults).read_namespaced_pod(pod, "default").spec.node_name
        wait_event(faults, pod, "has not synced yet", timeout=10)
        assert s.proxy is not None
        s.proxy.release()
        wait_for(lambda: s.ready() == 200, 60, "extender synced")
        synced_at = time.monotonic()
        assert wait_bound(faults, pod, timeout=45) == node
        waited = time.monotonic() - synced_at
        assert waited < 30, waited
        print(f"slow first list: bound {waited:.1f}s after the cache synced")


class Hammer:
    """Calls /filter every 0.2 s and keeps every answer."""

    def __init__(self, s: Scenario, pod: dict[str, Any], names: list[str]) -> None:
        self.s, self.pod, self.names = s, pod, names
        self.answers: list[tuple[int, str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Hammer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)

    def _run(self) -> None:
        body = {"Pod": self.pod, "NodeNames": self.names}
        while not self.stop.wait(0.2):
            try:
                r = requests.post(self.s.url + "/filter", json=body, timeout=5)
                self.answers.append((r.status_code, r.json().get("Error", "")))
            except requests.RequestException as exc:
                self.answers.append((0, repr(exc)))


def gpu_pod_json(gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "probe", "namespace": "default"},
        "spec": {"containers": [{"resources": {"limits": {contract.RESOURCE_GPU: str(gpus)}}}]},
    }


def test_apiserver_restart_and_a_compacted_history(faults):
    """SIGKILL the API server: the extender answers 200 from what it knew throughout,
    and is current within 10 s of the API server being ready again. Then, with its
    watches frozen behind the proxy, pods change, etcd is compacted and the API server
    restarted: its watches resume from a compacted resourceVersion, get 410 Gone, list
    again, and the free GPUs it reports are the truth."""
    cluster = faults.cluster
    with scenario(faults, "restart") as s:
        wait_for(lambda: s.ready() == 200, 30, "extender ready")
        a = s.node("restart")
        wait_for(lambda: s.filter(gpu_pod_json(1), [a])["NodeNames"] == [a], 10, "a known")
        with Hammer(s, gpu_pod_json(1), [a]) as hammer:
            cluster.kill("kube-apiserver")
            time.sleep(3)
            cluster.respawn("kube-apiserver")
            ready_at = time.monotonic()
            b = s.node("restart")
            wait_for(lambda: s.filter(gpu_pod_json(1), [b])["NodeNames"] == [b], 30, "b seen")
            current = time.monotonic() - ready_at
        assert current < 10, current
        answers = hammer.answers
        assert answers and all(code == 200 and not error for code, error in answers), answers
        print(f"restart: {len(answers)} calls answered 200; current {current:.1f}s after ready")

        # A compacted history behind a frozen watch.
        assert s.proxy is not None
        s.proxy.freeze()
        for gpus in (3, 2):
            bind_pod(faults, a, gpus)
        gone_before = s.metric('gpu_scheduler_extender_cache_relists_total{kind="pods",why="gone"')
        cluster.compact_etcd()
        cluster.kill("kube-apiserver")
        cluster.respawn("kube-apiserver")
        s.proxy.reset()  # the frozen watches end; they resume from before the compaction
        wait_for(
            lambda: (
                s.metric('gpu_scheduler_extender_cache_relists_total{kind="pods",why="gone"')
                > gone_before
            ),
            30,
            "a relist after 410 Gone",
        )
        assert s.filter(gpu_pod_json(3), [a])["NodeNames"] == [a]  # 8 - 3 - 2 = 3 free
        refused = s.filter(gpu_pod_json(4), [a])["FailedNodes"][a]
        assert refused == "3 of 8 GPUs free; pod requests 4"


def test_the_extender_packs_by_usage(faults):
    """The pair from the issue: an 8-GPU node with 7 in use and an empty 2-GPU node;
    a 1-GPU pod, then a 2-GPU pod. The extender's cache knows the 7 GPUs in use (where
    kube-scheduler, after the filter of an extender that is sent whole Node objects,
    scores fresh NodeInfos without pods: pkg/scheduler/extender.go), so the 1-GPU pod
    fills the big node and both pods land."""
    pair = [("big", 8), ("small", 2)]
    with scenario(faults, "clustermode", proxied=False) as s:
        big, small = (s.node("clustermode", gpus) for _, gpus in pair)
        bind_pod(faults, big, 7)
        wait_for(lambda: s.filter(gpu_pod_json(2), [big])["FailedNodes"], 10, "usage seen")
        one = s.pod(1, "clustermode")
        assert wait_bound(faults, one, timeout=30) == big
        two = s.pod(2, "clustermode")
        assert wait_bound(faults, two, timeout=30) == small


def test_heartbeat_guard(faults):
    """One silent agent among many keeps its node free of new GPU pods; every agent
    silent at once (a partition, not five failures) trips the guard: pods are placed,
    and the metric and the log say why."""
    now = dt.datetime.now(dt.UTC)
    fresh, old = now, now - dt.timedelta(hours=1)
    with scenario(faults, "heartbeat", proxied=False) as s:
        nodes = [s.node("heartbeat") for _ in range(4)]
        silent = s.node("heartbeat")
        for name in nodes:
            put_lease(faults, name, fresh)
        put_lease(faults, silent, old)
        wait_for(lambda: s.ready() == 200, 30, "extender ready")
        pinned = s.pod(1, "heartbeat", node_selector={"kubernetes.io/hostname": silent})
        wait_event(faults, pinned, "agent on this node is silent", timeout=30)
        assert s.metric("gpu_scheduler_extender_heartbeat_guard_tripped") == 0
        free = s.pod(1, "heartbeat")
        assert wait_bound(faults, free, timeout=30) in nodes
        assert not core(faults).read_namespaced_pod(pinned, "default").spec.node_name
        for name in nodes:
            put_lease(faults, name, old)
        # A Lease is not an event kube-scheduler watches (it would retry the pod within
        # 5 minutes anyway); a change to the pod's node is one.
        time.sleep(1)  # the extender's Lease watch has seen them
        core(faults).patch_node(silent, {"metadata": {"labels": {"e2e-touched": "1"}}})
        assert wait_bound(faults, pinned, timeout=60) == silent
        assert s.metric("gpu_scheduler_extender_heartbeat_guard_tripped") == 1
        assert "heartbeat guard tripped" in s.extender.log_path.read_text()
