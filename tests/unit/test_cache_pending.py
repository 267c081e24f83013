"""The pending pods' watch (extender/cache_pending.py) and what filter does with it
(extender/nominated.py): picks kube-scheduler abandoned stop counting, a pick whose
pod is deleted unbound frees its node, and pods nominated by preemption keep their
room against pods of lower priority, by the extender's own count."""

from __future__ import annotations

import pytest

from extender.app import create_app
from gpu_scheduler import contract
from tests.factories import make_lease, make_node, make_pod
from tests.fakeapi import FakeCore, synced_cache
from tests.helpers import ManualClock, wait_for
from tests.unit.test_gpu_health import NOW, RENEWED, annotation

H100 = dict(product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)


@pytest.fixture
def world():
    # "sick": 8 GPUs, GPU 3 sick (its agent says so): kube-scheduler counts 8, we 7.
    sick = make_node("sick", 8, **H100)
    sick["metadata"]["annotations"][contract.ANN_GPUS] = annotation(
        *(True,) * 3, False, *(True,) * 4
    )
    core = FakeCore([make_node("a", 8, **H100), sick], [])
    clock = ManualClock()
    cache = synced_cache(core=core, monotonic=clock, clock=lambda: NOW)
    cache.replace_leases([make_lease("sick", RENEWED)])
    client = create_app(cache=cache).test_client()
    core.list_pod_for_all_namespaces.wait_for_watch(2)
    yield core, cache, client, clock
    cache.stop()


def with_priority(pod, priority):
    pod["spec"]["priority"] = priority
    return pod


def filter_(client, pod, names):
    body = {"Pod": pod, "Nodes": None, "NodeNames": names}
    return client.post("/filter", json=body).get_json()


def nominate(core, pod, node):
    pod = {**pod, "status": {**pod.get("status", {}), "nominatedNodeName": node}}
    core.list_pod_for_all_namespaces.event("MODIFIED", pod)
    return pod


def scheduling_failed(pod, message="0/2 nodes are available", nominated=None):
    status = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
            }
        ],
    }
    if nominated:
        status["nominatedNodeName"] = nominated
    return {**pod, "status": status}


def test_a_pick_kube_scheduler_abandons_stops_counting_at_once(world):
    """Refused at Permit (or its binding failed): kube-scheduler writes
    PodScheduled=False on the pod after the pick. The node is free at once, not after
    the pick's 30 s."""
    core, cache, client, _ = world
    pod = make_pod("p", 4)
    core.list_pod_for_all_namespaces.event("ADDED", pod)
    pod = core.list_pod_for_all_namespaces.objects["p"]
    assert filter_(client, pod, ["a"])["NodeNames"] == ["a"]
    assert cache.view().used_gpus("a") == 4
    core.list_pod_for_all_namespaces.event("MODIFIED", scheduling_failed(pod, "rejected at permit"))
    wait_for(lambda: cache.view().used_gpus("a") == 0, 5, "the abandoned pick gone")
    assert not cache._assumed


def test_an_old_failure_or_a_nomination_of_the_picked_node_keeps_the_pick(world):
    """The failure that came before the pick (the version filter saw), and
    kube-scheduler nominating the node it is binding to, say nothing against it."""
    core, cache, client, _ = world
    pods = core.list_pod_for_all_namespaces
    pods.event("ADDED", scheduling_failed(make_pod("p", 4)))
    seen = pods.objects["p"]  # the version kube-scheduler scheduled from
    assert filter_(client, seen, ["a"])["NodeNames"] == ["a"]
    cache.pending_event("MODIFIED", seen)  # delivered late: the same version
    pods.event("MODIFIED", scheduling_failed(seen, nominated="a"))  # expectation
    nominate(core, make_pod("marker", 1), "sick")  # behind the others on the watch
    wait_for(lambda: cache.view().nominated.get("sick"), 5, "the events before it")
    assert cache.view().used_gpus("a") == 4 and "uid-default-p" in cache._assumed


def test_a_nominated_preemptor_keeps_its_room_on_a_sick_gpu_node(world):
    """Victims for a 7-GPU preemptor were taken on "sick" (kube-scheduler counts 8
    GPUs, we count 7 usable). A lower-priority 1-GPU pod arriving meanwhile passes
    kube-scheduler's count (8 - 7 = 1), and must be refused by ours."""
    core, cache, client, _ = world
    preemptor = with_priority(make_pod("big", 7), 1000)
    nominate(core, preemptor, "sick")
    wait_for(lambda: cache.view().nominated.get("sick"), 5, "the nomination")
    small = with_priority(make_pod("small", 1), 10)
    body = filter_(client, small, ["sick", "a"])
    assert body["NodeNames"] == ["a"], body
    assert "nominated here by preemption" in body["FailedNodes"]["sick"]
    assert "default/big" in body["FailedNodes"]["sick"]
    # the preemptor itself is not held back by its own nomination
    assert filter_(client, preemptor, ["sick"])["NodeNames"] == ["sick"]


def test_a_higher_priority_pod_is_not_held_back_by_a_lower_nomination(world):
    core, cache, client, _ = world
    nominate(core, with_priority(make_pod("big", 7), 100), "sick")
    wait_for(lambda: cache.view().nominated.get("sick"), 5, "the nomination")
    urgent = with_priority(make_pod("urgent", 1), 1000)
    assert filter_(client, urgent, ["sick"])["NodeNames"] == ["sick"]
    same = with_priority(make_pod("same", 1), 100)  # equal priority: held, as upstream
    assert filter_(client, same, ["sick"])["NodeNames"] == []


def test_a_nomination_ends_when_the_preemptor_is_bound_or_deleted(world):
    core, cache, client, _ = world
    preemptor = nominate(core, with_priority(make_pod("big", 7), 1000), "sick")
    wait_for(lambda: cache.view().nominated.get("sick"), 5, "the nomination")
    core.list_pod_for_all_namespaces.event("DELETED", preemptor)
    wait_for(lambda: not cache.view().nominated, 5, "the nomination gone")
    small = with_priority(make_pod("small", 1), 10)
    assert filter_(client, small, ["sick"])["NodeNames"] == ["sick"]


def test_a_relist_of_pending_pods_reads_the_nominations_anew(world):
    _, cache, _, _ = world
    nominated = with_priority(make_pod("big", 7), 1000)
    nominated["status"] = {"nominatedNodeName": "a"}
    cache.replace_pending([nominated, make_pod("plain", 1), make_pod("cpu", 0)])
    assert [uid for uid, _ in cache.view().nominated["a"]] == ["uid-default-big"]
    cache.replace_pending([])
    assert cache.view().nominated == {}
