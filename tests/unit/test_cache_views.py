"""When the cluster cache builds the view requests read (extender/cache.py): a watch
event builds the next one itself while requests are coming, so that the request after
a binding does not build it on kube-scheduler's path; at most once every EAGER_GAP
seconds, and not at all when no request has read a view for READERS_ACTIVE seconds
(the next request then builds it, as before)."""

from __future__ import annotations

from extender import cache as cache_module
from tests.factories import make_node, make_pod
from tests.fakeapi import synced_cache


def bound(name: str, node: str, gpus: int = 1) -> dict:
    return make_pod(name, gpus, node=node, phase="Running")


def test_a_watch_event_builds_the_next_view_while_requests_come():
    now = [100.0]
    cache = synced_cache([make_node("n1", 8), make_node("n2", 8)], monotonic=lambda: now[0])
    try:
        first = cache.view()  # a request reads the view
        cache.pod_event("ADDED", bound("a", "n1", 2))
        built = cache._view
        assert built is not first and built.version == cache.version()
        assert built.used["n1"] == 2
        assert cache.view() is built  # the request after the binding builds nothing

        # a second event within EAGER_GAP of the first build: left to the next request
        cache.pod_event("ADDED", bound("b", "n2"))
        assert cache._view is built
        now[0] += cache_module.EAGER_GAP
        cache.pod_event("ADDED", bound("c", "n2"))  # a gap later: built again
        assert cache._view.version == cache.version() and cache._view.used["n2"] == 2

        # nobody has asked for READERS_ACTIVE seconds: events build nothing
        now[0] += cache_module.READERS_ACTIVE + 1
        idle = cache._view
        cache.pod_event("DELETED", bound("a", "n1", 2))
        assert cache._view is idle
        fresh = cache.view()  # the next request builds it
        assert fresh is not idle and "n1" not in fresh.used
    finally:
        cache.stop()


def test_a_node_or_lease_event_builds_the_view_too():
    now = [100.0]
    cache = synced_cache([make_node("n1", 8)], monotonic=lambda: now[0])
    try:
        cache.view()
        cache.node_event("ADDED", make_node("n2", 4))
        assert "n2" in cache._view.nodes and cache._view.version == cache.version()
    finally:
        cache.stop()


def test_a_view_that_fails_to_build_does_not_stop_the_watch(monkeypatch, caplog):
    cache = synced_cache([make_node("n1", 8)])
    try:
        cache.view()
        real = cache._build_view

        def broken():
            raise RuntimeError("boom")

        monkeypatch.setattr(cache, "_build_view", broken)
        cache.pod_event("ADDED", bound("a", "n1"))  # applied, the build's failure logged
        assert cache.version()[1] > 0 and "building the view" in caplog.text
        monkeypatch.setattr(cache, "_build_view", real)
        assert cache.view().used["n1"] == 1  # the next request builds it
    finally:
        cache.stop()


def test_while_views_fail_to_build_the_verbs_answer_from_the_last_good_one(monkeypatch):
    """A bug of ours meeting some object must not turn every verb into a 500: filter
    answers from the last good view, /readyz stays 200 (both replicas would fail
    alike) and says the view is degraded, the gauge is 1; a good build clears it."""
    from extender import metrics
    from extender.app import create_app

    cache = synced_cache([make_node("n1", 8), make_node("n2", 8)])
    try:
        client = create_app(cache=cache).test_client()
        cache.view()
        real = cache._build_view

        def broken():
            raise RuntimeError("boom")

        monkeypatch.setattr(cache, "_build_view", broken)
        cache.pod_event("ADDED", bound("a", "n1"))  # the next view cannot be built
        body = {"Pod": make_pod("p", 2), "Nodes": None, "NodeNames": ["n1", "n2"]}
        answer = client.post("/filter", json=body)
        assert answer.status_code == 200 and answer.get_json()["Error"] == ""
        assert len(answer.get_json()["NodeNames"]) == 1
        ready = client.get("/readyz")
        assert ready.status_code == 200 and "degraded" in ready.get_json()["detail"]
        assert "boom" in ready.get_json()["detail"]
        assert metrics.VIEW_DEGRADED._value.get() == 1
        monkeypatch.setattr(cache, "_build_view", real)
        cache.pod_event("ADDED", bound("b", "n2"))
        assert cache.view().version == cache.version()  # built again, with a and b
        assert "degraded" not in client.get("/readyz").get_json()["detail"]
        assert metrics.VIEW_DEGRADED._value.get() == 0
    finally:
        cache.stop()
