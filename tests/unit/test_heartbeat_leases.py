"""The cluster cache reads the agents' heartbeats from their Leases: a Lease names its
node, a node without one is not agent-managed, and only Leases of the install's
namespace with the agents' label are watched."""

from __future__ import annotations

from extender.cache import ClusterCache
from gpu_scheduler import contract
from tests.factories import make_lease, make_node
from tests.fakeapi import FakeCore, FakeListWatch

H100 = {"product": "NVIDIA-H100-80GB-HBM3", "memory_mib": 81559}
RENEWED = "2027-01-15T07:55:00.250000Z"
SECONDS = 1_800_000_000.0 - 300 + 0.25


def test_a_lease_gives_its_node_a_heartbeat_and_its_deletion_takes_it_away():
    cache = ClusterCache()
    cache.replace_nodes([make_node("a", 8, **H100), make_node("b", 8, **H100)])
    cache.replace_leases([make_lease("a", RENEWED), make_lease("gone", RENEWED)])
    view = cache.view()
    assert view.nodes["a"].heartbeat == SECONDS
    assert view.nodes["b"].heartbeat is None  # no Lease: not agent-managed
    assert "gone" not in view.nodes  # a Lease whose node is gone adds no node
    cache.lease_event("MODIFIED", make_lease("a", "2027-01-15T08:00:00.000000Z"))
    assert cache.view().nodes["a"].heartbeat == 1_800_000_000.0
    cache.lease_event("DELETED", make_lease("a", None))  # the agent's pod went: GC'd
    assert cache.view().nodes["a"].heartbeat is None


def test_a_node_that_arrives_after_its_lease_gets_the_heartbeat():
    cache = ClusterCache()
    cache.replace_nodes([])
    cache.replace_leases([make_lease("late", RENEWED)])
    cache.node_event("ADDED", make_node("late", 8, **H100))
    assert cache.view().nodes["late"].heartbeat == SECONDS


def test_the_nodes_own_facts_are_not_changed_by_a_heartbeat():
    cache = ClusterCache()
    cache.replace_nodes([make_node("a", 8, **H100)])
    base = cache._base["a"]
    cache.replace_leases([make_lease("a", RENEWED)])
    assert base.heartbeat is None and cache.view().nodes["a"].heartbeat == SECONDS
    assert cache.view().beats == [SECONDS]


def test_leases_without_the_agents_label_are_ignored():
    cache = ClusterCache()
    cache.replace_nodes([make_node("a", 8, **H100)])
    other = make_lease("a", RENEWED)
    other["metadata"]["labels"] = {"app": "leader-election"}
    cache.replace_leases([other])
    cache.lease_event("ADDED", other)
    assert cache.view().nodes["a"].heartbeat is None


class Coordination:
    def __init__(self, leases):
        self.list_namespaced_lease = FakeListWatch(leases)


def test_the_leases_are_watched_in_one_namespace_with_the_agents_label():
    cache = ClusterCache()
    coordination = Coordination([make_lease("a", RENEWED)])
    cache.start(FakeCore([make_node("a", 8, **H100)]), None, coordination, "gpu-scheduler")
    try:
        for reflector in cache.reflectors.values():
            assert reflector.synced.wait(5), reflector.kind
        assert set(cache.reflectors) == {"nodes", "pods", "pending", "leases"}
        coordination.list_namespaced_lease.wait_for_watch(1)
        watch = coordination.list_namespaced_lease.watches[0]
        assert watch["namespace"] == "gpu-scheduler"
        assert watch["label_selector"] == contract.LEASE_SELECTOR
        assert cache.view().nodes["a"].heartbeat == SECONDS
        assert "1 agent heartbeats" in cache.ready()[1]
    finally:
        cache.stop()


def test_without_a_namespace_no_leases_are_watched():
    cache = ClusterCache()
    cache.start(FakeCore([make_node("a", 8, **H100)]), None, Coordination([]), None)
    try:
        assert set(cache.reflectors) == {"nodes", "pods", "pending"}
    finally:
        cache.stop()


def test_the_views_heartbeats_stay_sorted_and_in_step_with_the_nodes():
    """The sorted heartbeats are kept incrementally (a renewal moves one value): after
    renewals, deletions, a node gone and a relist they equal the nodes' own."""
    import random

    rng = random.Random(7)
    cache = ClusterCache()
    cache.replace_nodes([make_node(f"n{i}", 8, **H100) for i in range(30)])
    cache.replace_leases([make_lease(f"n{i}", RENEWED) for i in range(0, 30, 2)])
    for step in range(300):
        name = f"n{rng.randrange(30)}"
        minute = rng.randrange(60)
        action = rng.random()
        if action < 0.6:
            cache.lease_event("MODIFIED", make_lease(name, f"2027-01-15T07:{minute:02d}:00Z"))
        elif action < 0.8:
            cache.lease_event("DELETED", make_lease(name, None))
        elif action < 0.9:
            cache.node_event("DELETED", make_node(name))
        else:
            cache.node_event("ADDED", make_node(name, 8, **H100))
        view = cache.view()
        expected = sorted(f.heartbeat for f in view.nodes.values() if f.heartbeat is not None)
        assert view.beats == expected, step
    cache.replace_nodes([make_node("n1", 8, **H100)])
    assert cache.view().beats == sorted(
        f.heartbeat for f in cache.view().nodes.values() if f.heartbeat is not None
    )
