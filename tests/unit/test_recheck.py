"""Filter's recheck (extender/recheck.py): before every candidate turns a pod away, the
few candidates are read again from the API server, so a watch that is behind
kube-scheduler's informer does not park the pod as unschedulable. The fake API server
changes its objects without the watch saying so: a watch that is behind."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY

from extender import recheck as recheck_module
from extender.app import create_app
from extender.bucket import TokenBucket
from extender.config import ExtenderConfig
from extender.recheck import RESERVED, Recheck
from tests.factories import make_node, make_pod
from tests.fakeapi import FakeCore, synced_cache
from tests.helpers import wait_for

H100 = dict(product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)
HOLDER = make_pod("holder", 8, node="a", phase="Running")
FULL = "0 of 8 GPUs free; pod requests 8"


@pytest.fixture
def cluster():
    core = FakeCore(
        [make_node("a", 8, **H100), make_node("small", 4, **H100)]
        + [make_node(f"n{i}", 8, **H100) for i in range(recheck_module.MAX_NODES)],
        [HOLDER] + [make_pod(f"h{i}", 8, node=f"n{i}", phase="Running") for i in range(8)],
    )
    cache = synced_cache(core=core)
    yield create_app(cache=cache).test_client(), cache, core
    cache.stop()


def _filter(client, pod, names):
    return client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": names}).get_json()


def _rechecks(outcome: str) -> float:
    value = REGISTRY.get_sample_value("gpu_scheduler_extender_rechecks_total", {"outcome": outcome})
    return value or 0.0


def test_a_freed_node_the_watch_has_not_told_of_is_read_again_and_offered(cluster):
    client, cache, core = cluster
    changed = _rechecks("changed")
    core.list_pod_for_all_namespaces.remove("holder")  # deleted; the watch is behind
    pod = make_pod("p", 8)
    body = _filter(client, pod, ["a"])
    assert body["Error"] == "" and body["NodeNames"] == ["a"], body
    assert core.node_reads == ["a"]
    # the holder is gone; what counts on "a" now is the pod just answered (assumed
    # there until bound: extender/cache_assumed.py)
    assert cache.view().used_gpus("a") == 8
    # ... which the recheck's snapshot leaves out: the API server has it unbound,
    # which says nothing of whether it will bind (test_a_pick_waiting_for_its_binding...)
    assert list(cache.recheck_snapshot("a").pods) == []
    cache.forget(pod["metadata"]["uid"])
    assert cache.view().used_gpus("a") == 0 and cache.recheck_snapshot("a").pods == {}
    assert _rechecks("changed") == changed + 1
    # The watch then says what the cache already took: nothing moves.
    core.list_pod_for_all_namespaces.event("DELETED", HOLDER)
    core.list_node.event("MODIFIED", make_node("small", 4, **H100))  # a marker behind it
    wait_for(lambda: cache.view().version[0] > 1, 5, "the node event")
    assert cache.view().used_gpus("a") == 0


def test_a_node_changed_on_the_api_server_is_read_again(cluster):
    client, cache, core = cluster
    core.list_node.change(make_node("small", 8, **H100))  # the device plugin grew it to 8
    body = _filter(client, make_pod("p", 8), ["small"])
    assert body["NodeNames"] == ["small"], body
    assert cache.recheck_snapshot("small").base.allocatable == 8


def test_pods_the_watch_has_not_told_of_are_taken_in_and_the_verdict_stands(cluster):
    client, cache, core = cluster
    pods = core.list_pod_for_all_namespaces
    pods.remove("holder")  # gone, and another took 6 of its GPUs; the watch told neither
    pods.change(make_pod("new", 6, node="a", phase="Running"))
    body = _filter(client, make_pod("p", 4), ["a"])
    assert body["NodeNames"] == [], body
    # decided again on what the API server holds, not on what the watch had said
    assert body["FailedNodes"] == {"a": "2 of 8 GPUs free; pod requests 4"}
    assert cache.view().used_gpus("a") == 6


def test_when_nothing_differs_the_answer_is_the_same_and_nothing_is_decided_again(cluster):
    client, cache, core = cluster
    same = _rechecks("same")
    version = cache.view().version
    body = _filter(client, make_pod("p", 8), ["a"])
    assert body["NodeNames"] == [] and body["FailedNodes"] == {
        "a": "0 of 8 GPUs free; pod requests 8"
    }
    assert core.node_reads == ["a"] and _rechecks("same") == same + 1
    assert cache.view().version == version


def test_a_pod_that_fits_somewhere_or_has_many_candidates_reads_nothing(cluster):
    client, _, core = cluster
    assert _filter(client, make_pod("p", 4), ["a", "small"])["NodeNames"] == ["small"]
    many = ["a"] + [f"n{i}" for i in range(recheck_module.MAX_NODES)]
    assert _filter(client, make_pod("p", 8), many)["NodeNames"] == []
    assert core.node_reads == []


def test_a_pod_whose_own_spec_is_unreadable_reads_nothing(cluster):
    client, _, core = cluster
    pod = make_pod("p", 1)
    pod["spec"]["containers"] = "not a list"
    body = _filter(client, pod, ["a"])
    assert body["NodeNames"] == [] and core.node_reads == []


def test_a_failed_read_leaves_the_verdict_as_it_was(cluster):
    client, _, core = cluster
    failed = _rechecks("failed")
    core.fail_reads.append(ApiException(status=500, reason="etcd timeout"))
    core.list_pod_for_all_namespaces.remove("holder")
    body = _filter(client, make_pod("p", 8), ["a"])
    assert body["Error"] == "" and body["FailedNodes"] == {"a": FULL}
    assert _rechecks("failed") == failed + 1


def test_a_node_gone_from_the_api_server_leaves_the_cache(cluster):
    _, cache, core = cluster
    core.list_node.remove("small")
    assert cache.recheck(["small"]) == 1
    assert cache.recheck_snapshot("small").base is None and "small" not in cache.view().nodes


def test_reads_are_rate_limited_across_calls(cluster):
    _, cache, core = cluster
    skipped = _rechecks("skipped")
    limited = Recheck(cache, core, bucket=TokenBucket(0.0, 1 + RESERVED))
    core.list_pod_for_all_namespaces.remove("holder")
    assert limited(["small", "a"]) == 0  # "small" took the one free token; "a" waits
    assert core.node_reads == ["small"] and _rechecks("skipped") == skipped + 1
    # a pod nominated for "a" (a preemptor waiting for its victims) draws on the
    # reserve, and its nominated node is read first
    assert limited(["small", "a"], nominated="a") == 1
    assert core.node_reads == ["small", "a", "small"]
    assert Recheck(cache, core)(["a"]) == 0  # the cache has it now


def test_a_timed_out_read_is_asked_once_more_over_a_new_connection(cluster):
    from urllib3.exceptions import ReadTimeoutError

    client, cache, core = cluster
    silence = ReadTimeoutError(None, "/api/v1/nodes/a", "Read timed out.")
    core.fail_reads.append(silence)
    core.list_pod_for_all_namespaces.remove("holder")
    body = _filter(client, make_pod("p", 8), ["a"])
    assert body["NodeNames"] == ["a"] and core.node_reads == ["a", "a"]
    # a second silence in a row is a failure: the verdict stands, the cache unchanged
    core.list_pod_for_all_namespaces.event("ADDED", make_pod("again", 8, node="a", phase="Running"))
    # (16: the pick of "p" counts there too; waiting for 8 passed before the event)
    wait_for(lambda: cache.view().used_gpus("a") == 16, 5, "the watch's new holder")
    core.list_pod_for_all_namespaces.remove("again")  # gone; the watch has not said so
    failed = _rechecks("failed")
    core.fail_reads.extend([silence, silence])
    body = _filter(client, make_pod("p", 8), ["a"])
    assert body["NodeNames"] == [] and body["FailedNodes"] == {"a": FULL}
    assert core.node_reads == ["a"] * 4 and _rechecks("failed") == failed + 1


def test_what_the_watch_says_during_the_read_wins_over_the_read(cluster):
    """The read sees a pod bound; while it is under way, the watch delivers that pod's
    binding and its deletion. Applied after them, the read would bring back a pod the
    watch will never speak of again: it is not applied."""
    _, cache, core = cluster
    ghost = make_pod("ghost", 8, node="small", phase="Running")
    core.list_pod_for_all_namespaces.change(ghost)  # the API server has it bound
    record = {**ghost, "metadata": {**ghost["metadata"], "uid": "ghost-uid"}}
    core.list_pod_for_all_namespaces.change(record)
    real = core.read_node

    def read_while_the_watch_speaks(name: str, **kwargs):
        cache.pod_event("ADDED", record)
        cache.pod_event("DELETED", record)
        return real(name, **kwargs)

    core.read_node = read_while_the_watch_speaks  # type: ignore[method-assign]
    assert cache.recheck(["small"]) == 0
    assert "ghost-uid" not in cache.recheck_snapshot("small").pods
    assert cache.view().used_gpus("small") == 0


def test_the_reads_of_one_filter_share_a_budget():
    """Each API call takes at most what is left of the budget: a slow API server
    cannot hold kube-scheduler past its extender timeout."""
    from extender.recheck import BUDGET, TIMEOUT, OutOfTime

    now = [0.0]
    timeouts: list[float] = []
    took = [0.8 * BUDGET]  # what the slow API server takes to answer a read of the Node

    class SlowCore(FakeCore):
        def read_node(self, name, **kwargs):
            timeouts.append(kwargs["_request_timeout"])
            now[0] += took[0]
            return super().read_node(name, **kwargs)

    core = SlowCore([make_node("a", 8, **H100)], [HOLDER])
    pods = core.list_pod_for_all_namespaces
    core.list_pod_for_all_namespaces = lambda **kw: (
        timeouts.append(kw["_request_timeout"]) or pods(**kw)
    )
    cache = synced_cache(core=core)
    try:
        recheck = Recheck(cache, core, clock=lambda: now[0])
        recheck._read_again("a", deadline=now[0] + BUDGET)
        # the Node, then its pods in what is left
        assert timeouts[-2:] == [TIMEOUT, pytest.approx(0.2 * BUDGET)]
        took[0] = BUDGET
        with pytest.raises(OutOfTime):  # the pods' list finds no time left
            recheck._read_again("a", deadline=now[0] + BUDGET)
    finally:
        cache.stop()


def test_a_client_of_its_own_that_urllib3_does_not_retry():
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = "https://127.0.0.1:1"
    core = client.CoreV1Api(client.ApiClient(configuration))
    own_core, own_resource = recheck_module._without_retries(core, object())
    assert own_core.api_client is not core.api_client
    assert own_core.api_client.configuration.retries is False
    assert configuration.retries is None  # the watches' client is left as it was
    assert own_resource.api_client is own_core.api_client


def test_a_dra_device_taint_cleared_behind_the_watch_is_read_again():
    """A node of 4 DRA GPUs, one tainted NoSchedule (the driver's health check); the
    driver clears the taint and the slice watch has not said so."""
    from tests.factories import device_class, gpu_device, resource_slice
    from tests.fakeapi import FakeListWatch

    sick = [gpu_device(i, "NVIDIA L4", 23034) for i in range(4)]
    sick[1]["taints"] = [
        {"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    ]

    class ResourceApi:
        list_device_class = FakeListWatch([device_class()])
        list_resource_slice = FakeListWatch([resource_slice("dra", sick)])
        list_resource_claim_for_all_namespaces = FakeListWatch()
        list_device_taint_rule = FakeListWatch()

    core = FakeCore([make_node("dra"), make_node("dp", 8, **H100)])
    cache = synced_cache(core=core, resource=ResourceApi())
    try:
        client = create_app(cache=cache).test_client()
        wait_for(lambda: "dra" in cache.view().nodes and cache.view().nodes["dra"].dra, 5, "DRA")
        healed = resource_slice("dra", [gpu_device(i, "NVIDIA L4", 23034) for i in range(4)])
        ResourceApi.list_resource_slice.change(healed)
        body = _filter(client, make_pod("p", 4), ["dra"])
        assert body["NodeNames"] == ["dra"], body
        assert core.node_reads == ["dra"]
        # a device-plugin node's slices are not read: its GPUs are the Node's
        reads = ResourceApi.list_resource_slice.lists
        _filter(client, make_pod("p", 9), ["dp"])
        assert ResourceApi.list_resource_slice.lists == reads
    finally:
        cache.stop()


def test_a_slice_that_spans_nodes_is_left_alone():
    """perDeviceNodeSelection: each device names its node and the slice none, so no
    node's list returns it; its absence from one node's list says nothing."""
    from tests.factories import device_class, gpu_device, resource_slice
    from tests.fakeapi import FakeListWatch

    spanning = resource_slice("d1", [])
    del spanning["spec"]["nodeName"]
    spanning["spec"]["perDeviceNodeSelection"] = True
    spanning["spec"]["devices"] = [
        {**gpu_device(i), "name": f"gpu-{node}-{i}", "nodeName": node}
        for node in ("d1", "d2")
        for i in range(2)
    ]

    class ResourceApi:
        list_device_class = FakeListWatch([device_class()])
        list_resource_slice = FakeListWatch([spanning])
        list_resource_claim_for_all_namespaces = FakeListWatch()
        list_device_taint_rule = FakeListWatch()

    cache = synced_cache(core=FakeCore([make_node("d1"), make_node("d2")]), resource=ResourceApi())
    try:
        wait_for(lambda: cache.view().nodes.get("d2") is not None, 5, "the DRA nodes")
        assert cache.recheck(["d1"]) == 0
        assert cache.view().nodes["d1"].allocatable == 2 == cache.view().nodes["d2"].allocatable
    finally:
        cache.stop()


def test_a_watch_event_that_lands_during_the_read_is_decided_on(cluster):
    """The watch delivers the holder's deletion while the recheck reads: the read is
    not applied (the node's mark moved), but the pod is decided again on the view the
    watch brought, not turned away on the old one."""
    client, cache, core = cluster
    holder = core.list_pod_for_all_namespaces.objects["holder"]
    core.list_pod_for_all_namespaces.remove("holder")
    real = core.read_node

    def read_while_the_watch_speaks(name: str, **kwargs):
        cache.pod_event("DELETED", holder)
        return real(name, **kwargs)

    core.read_node = read_while_the_watch_speaks  # type: ignore[method-assign]
    same = _rechecks("same")
    body = _filter(client, make_pod("p", 8), ["a"])
    assert body["NodeNames"] == ["a"], body
    assert _rechecks("same") == same + 1  # the read itself changed nothing


def test_a_filter_that_read_its_candidates_again_keeps_its_own_log_line(cluster, caplog):
    """Every candidate passed, but only after the recheck: filter's line says so."""
    _, cache, core = cluster
    # kube-scheduler picks here (a filter that picks always keeps its line)
    both = ExtenderConfig(filter_chooses=False)
    client = create_app(both, cache=cache).test_client()
    for i in (0, 1):
        core.list_pod_for_all_namespaces.remove(f"h{i}")  # freed; the watch is behind
    with caplog.at_level("INFO", logger="extender"):
        pod = make_pod("p", 8)
        response = client.post("/filter", json={"Pod": pod, "NodeNames": ["n0", "n1"]})
        body = response.get_json()
        response.close()  # gunicorn closes it once written: the line is written then
    assert body["NodeNames"] == ["n0", "n1"], body
    (line,) = [r for r in caplog.records if r.getMessage() == "filter"]
    assert line.levelname == "INFO" and line.rechecked == 2


def test_a_pick_waiting_for_its_binding_survives_a_recheck_of_its_node(cluster):
    """A gang member at Permit is not bound on the API server: a recheck of its node
    (another pod turned away everywhere) must not delete the pick, or the next
    member is placed as if its sibling's GPUs were free."""
    client, cache, core = cluster
    core.list_pod_for_all_namespaces.remove("holder")  # "a" is free, the watch is behind
    waiting = make_pod("member-0", 8)
    core.list_pod_for_all_namespaces.change(waiting)  # it exists, pending
    assert _filter(client, waiting, ["a"])["NodeNames"] == ["a"]  # picked, at Permit
    assert cache.view().used_gpus("a") == 8
    # the next member fits nowhere: the recheck reads "a" again
    body = _filter(client, make_pod("member-1", 8), ["a"])
    assert body["NodeNames"] == [] and core.node_reads.count("a") >= 1, body
    assert cache.view().used_gpus("a") == 8  # the waiting member still counts there


def test_a_pick_whose_pod_was_deleted_while_pending_is_let_go_by_the_recheck(cluster):
    """kube-scheduler retries the pods it turned away the moment a pod waiting at
    Permit is deleted (AssignedPodDelete): the pending watch may not have told the
    extender yet. The recheck reads the node's picks by name: the one whose pod is
    gone stops counting, and the pod turned away gets the node."""
    client, cache, core = cluster
    core.list_pod_for_all_namespaces.remove("holder")  # "a" is free, the watch is behind
    waiting = make_pod("member-0", 8)
    core.list_pod_for_all_namespaces.change(waiting)  # it exists, pending
    assert _filter(client, waiting, ["a"])["NodeNames"] == ["a"]  # picked, at Permit
    core.list_pod_for_all_namespaces.remove("member-0")  # deleted; no watch has said so
    body = _filter(client, make_pod("next", 8), ["a"])
    assert body["NodeNames"] == ["a"], body
    assert "uid-default-member-0" not in cache._assumed
