"""The cache's index of each node's pods (extender/cache.py ``_node_pods``): what a
recheck reads of a node (extender/cache_recheck.py) without walking every pod under
the lock. Through any run of watch events and relists it holds exactly the pods the
cache keeps on each node."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.cache import ClusterCache
from tests.factories import make_node, make_pod

NODES = [f"n{i}" for i in range(4)]
EVENT = st.tuples(
    st.sampled_from(["ADDED", "MODIFIED", "DELETED", "RELIST"]),
    st.integers(0, 7),  # which pod
    st.sampled_from([*NODES, None]),  # where it is bound (None: pending)
    st.integers(0, 2),  # GPUs (a pod without any is not kept)
    st.sampled_from(["Running", "Succeeded"]),
)


def pod(i: int, node: str | None, gpus: int, phase: str) -> dict:
    obj = make_pod(f"p{i}", gpus, node=node, phase=phase)
    obj["metadata"]["uid"] = f"uid-{i}"
    return obj


def scanned(cache: ClusterCache, name: str) -> dict:
    return {uid: r for uid, r in cache._pods.items() if r.node == name}


@settings(max_examples=200, deadline=None)
@given(st.lists(EVENT, max_size=60))
def test_the_node_index_is_the_scan_of_every_pod(events):
    cache = ClusterCache()
    cache.replace_nodes([make_node(name, 8) for name in NODES])
    live: dict[int, dict] = {}
    for kind, i, node, gpus, phase in events:
        if kind == "RELIST":
            cache.replace_pods(list(live.values()))
            continue
        obj = pod(i, node, gpus, phase)
        if kind == "DELETED":
            live.pop(i, None)
        else:
            live[i] = obj
        cache.pod_event(kind, obj)
    for name in NODES:
        assert cache.recheck_snapshot(name).pods == scanned(cache, name)
    indexed = sorted(uid for uids in cache._node_pods.values() for uid in uids)
    assert indexed == sorted(cache._pods)  # each kept pod once, none left behind
    assert all(cache._node_pods.values())  # no empty lists kept


def test_a_recheck_snapshot_reads_the_nodes_pods_only():
    cache = ClusterCache()
    cache.replace_nodes([make_node("a", 8), make_node("b", 8)])
    cache.replace_pods([pod(1, "a", 1, "Running"), pod(2, "b", 2, "Running")])
    cache.pod_event("MODIFIED", pod(1, "b", 1, "Running"))  # moved (a test's liberty)
    assert set(cache.recheck_snapshot("b").pods) == {"uid-1", "uid-2"}
    assert cache.recheck_snapshot("a").pods == {}
