"""A pod the filter answered one node for (picked, or the only fit) counts there until
the watch shows it bound or gone, it is filtered again, or the TTL passes
(extender/cache_assumed.py): gang siblings and bursts pack whatever order
kube-scheduler sends the candidates in."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender import cache_assumed
from extender.app import create_app
from extender.records import pod_record
from tests.factories import make_node, make_pod
from tests.fakeapi import FakeCore, synced_cache
from tests.helpers import ManualClock as Clock

NODES = [f"n{i}" for i in range(4)]


@pytest.fixture
def world():
    core = FakeCore([make_node(n, 8) for n in NODES], [])
    clock = Clock()
    cache = synced_cache(core=core, monotonic=clock, clock=lambda: 1_800_000_000.0)
    client = create_app(cache=cache).test_client()
    core.list_pod_for_all_namespaces.wait_for_watch(1)
    yield core, cache, client, clock
    cache.stop()


def pick(client, pod, names):
    body = {"Pod": pod, "Nodes": None, "NodeNames": names}
    answer = client.post("/filter", json=body).get_json()
    assert answer["Error"] == "" and len(answer["NodeNames"]) == 1, answer
    return answer["NodeNames"][0]


def used(cache, node):
    return cache.view().used_gpus(node)


@pytest.mark.parametrize("seed", range(12))
def test_a_gang_packs_whatever_order_the_candidates_come_in(world, seed):
    """Four 4-GPU members of one group, none bound yet (they wait at Permit for each
    other), over four empty 8-GPU nodes in a random order each call: two nodes."""
    _, cache, client, _ = world
    shuffle = random.Random(seed).sample
    annotations = {"gpu-scheduler.io/group": "train"}
    picks = [
        pick(client, make_pod(f"w{i}", 4, annotations=annotations), shuffle(NODES, 4))
        for i in range(4)
    ]
    assert len(set(picks)) == 2, picks
    assert sorted(used(cache, n) for n in NODES) == [0, 0, 8, 8]


def test_the_watch_binding_takes_the_picks_place_and_counts_once(world):
    core, cache, client, _ = world
    pod = make_pod("p", 4)
    node = pick(client, pod, NODES)
    assert used(cache, node) == 4
    seen = []
    cache.on_bound = lambda uid, where: seen.append((uid, where))
    bound = make_pod("p", 4, node=node, phase="Running")
    core.list_pod_for_all_namespaces.event("ADDED", bound)
    _wait(lambda: seen, "the binding seen")
    assert used(cache, node) == 4  # not 8
    assert seen == [(bound["metadata"]["uid"], node)]  # the placement Event still fires
    assert cache._assumed == {}


def test_bound_elsewhere_moves_it(world):
    core, cache, client, _ = world
    node = pick(client, make_pod("p", 4), NODES)
    other = next(n for n in NODES if n != node)
    core.list_pod_for_all_namespaces.event("ADDED", make_pod("p", 4, node=other, phase="Running"))
    _wait(lambda: used(cache, other) == 4, "counted where it was bound")
    assert used(cache, node) == 0


def test_filtered_again_its_earlier_pick_no_longer_counts(world):
    """kube-scheduler is placing the pod anew (its binding failed, Permit timed out):
    its own earlier pick must not stand in its way."""
    _, cache, client, _ = world
    big = make_pod("big", 8)
    first = pick(client, big, NODES[:1])
    assert used(cache, first) == 8
    assert pick(client, big, NODES[:1]) == first  # not refused by itself


def test_a_pick_the_watch_never_confirms_stops_counting_after_the_ttl(world):
    _, cache, client, clock = world
    node = pick(client, make_pod("p", 4), NODES)
    clock.now += cache_assumed.ASSUME_TTL - 1
    assert used(cache, node) == 4
    clock.now += 2
    assert used(cache, node) == 0


def test_readyz_counts_the_picks_apart_and_drops_them_after_the_ttl_unread(world):
    _, cache, client, clock = world
    pick(client, make_pod("p", 4), NODES)
    ok, detail = cache.ready()
    assert ok and "0 pods cached, 1 picked and not bound yet" in detail, detail
    clock.now += cache_assumed.ASSUME_TTL + 1  # no view is read in between
    ok, detail = cache.ready()
    assert ok and "0 pods cached;" in detail and "picked" not in detail, detail


def test_a_pod_deleted_before_it_was_bound_stops_counting(world):
    """What the API server sends: the pending pod (no nodeName) DELETED, on the
    pending pods' watch only; the bound pods' watch never saw it
    (extender/cache_pending.py)."""
    core, cache, client, clock = world
    pod = make_pod("p", 4)
    core.list_pod_for_all_namespaces.event("ADDED", pod)  # created: pending
    node = pick(client, pod, NODES)
    core.list_pod_for_all_namespaces.event("DELETED", pod)
    _wait(lambda: cache._assumed["uid-default-p"][0] <= clock() + 1.0, "the pick cut short")
    assert used(cache, node) == 4  # deleted or bound? the bound watch has a second to say
    clock.now += 1.01
    assert used(cache, node) == 0


def test_a_relist_keeps_the_picks_it_does_not_find_bound(world):
    _, cache, client, _ = world
    node = pick(client, make_pod("p", 4), NODES)
    cache.replace_pods([])
    assert used(cache, node) == 4


def _wait(condition, what, timeout=5.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out: {what}")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    status=JSON | st.fixed_dictionaries({"phase": JSON}),
    annotations=JSON | st.dictionaries(st.sampled_from(["gpu-scheduler.io/group"]), JSON),
    resources=JSON,
    uid=JSON,
)
def test_a_hostile_pod_from_a_filter_call_never_breaks_the_pick(
    status, annotations, resources, uid
):
    """A filter call's Pod is not what the API server validated: whatever its status,
    annotations, resources or uid hold, pod_record (what the cache assumes) never
    raises (the fuzz campaign found status.phase as a list answered 500)."""
    pod = make_pod("p", 2)
    pod["status"] = status
    pod["metadata"]["annotations"] = annotations
    pod["metadata"]["uid"] = uid
    pod["spec"]["containers"][0]["resources"] = resources
    pod_record({**pod, "spec": {**pod["spec"], "nodeName": "n0"}})
