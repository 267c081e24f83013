"""The reflector on its own, against the explicit fake list+watch: what it lists,
watches, applies and skips, and how it recovers from Gone, errors and silence."""

from __future__ import annotations

import threading

import pytest

from extender.reflector import Reflector
from tests.factories import make_node
from tests.fakeapi import FakeListWatch
from tests.helpers import wait_for


class Sink:
    """What the reflector hands to the cache."""

    def __init__(self) -> None:
        self.lists: list[list[str]] = []
        self.events: list[tuple[str, str]] = []

    def replace(self, items) -> None:
        self.lists.append([i["metadata"]["name"] for i in items])

    def apply(self, kind, obj) -> None:
        self.events.append((kind, obj["metadata"]["name"]))


@pytest.fixture
def world():
    api = FakeListWatch([make_node("a"), make_node("b")], version=100)
    sink = Sink()
    stop = threading.Event()
    resets: list[int] = []
    reflector = Reflector(
        "nodes",
        api,
        {},
        sink.replace,
        sink.apply,
        stop=stop,
        reset_connections=lambda: resets.append(1),
        silence=0.5,
    )
    yield api, sink, reflector, resets
    stop.set()
    api.end_watch()


def test_lists_then_watches_from_the_lists_version(world):
    api, sink, reflector, _ = world
    reflector.start()
    api.wait_for_watch(1)
    assert sink.lists == [["a", "b"]] and reflector.synced.is_set()
    first = api.watches[0]
    assert first["resource_version"] == "100" and first["allow_watch_bookmarks"] is True
    assert 30 <= first["timeout_seconds"] <= 35
    assert first["_request_timeout"][1] == 0.5  # the silence bound is the read timeout
    api.event("ADDED", make_node("c"))
    api.event("DELETED", make_node("a"))
    wait_for(lambda: len(sink.events) == 2, 5, "two events")
    assert sink.events == [("ADDED", "c"), ("DELETED", "a")]


def test_bookmarks_move_the_version_and_the_contact_but_apply_nothing(world):
    api, sink, reflector, _ = world
    reflector.start()
    api.wait_for_watch(1)
    api.version = 150
    before = reflector.contact
    api.bookmark()
    api.end_watch()  # the server ends the watch on time: re-watch, no relist
    api.wait_for_watch(2)
    assert api.watches[1]["resource_version"] == "150"
    assert sink.events == [] and api.lists == 1
    assert reflector.contact is not None and before is not None and reflector.contact > before


def test_gone_relists(world):
    api, sink, reflector, _ = world
    reflector.start()
    api.wait_for_watch(1)
    api.objects.pop("a")
    api.gone()
    api.wait_for_watch(2)
    assert sink.lists == [["a", "b"], ["b"]] and api.lists == 2


def test_silence_drops_the_connections_and_relists(world):
    api, _sink, reflector, resets = world
    reflector.start()
    api.wait_for_watch(1)
    # Nothing arrives for longer than the silence bound (0.5 s): a half-open connection.
    api.wait_for_watch(2, timeout=5)
    assert resets and api.lists == 2
    assert reflector.age() is not None and reflector.age() < 1.0


def test_a_failed_list_is_retried_after_a_backoff(world):
    api, sink, reflector, resets = world
    api.fail_next.append(ConnectionError("refused"))
    reflector.start()
    api.wait_for_watch(1, timeout=5)
    assert sink.lists == [["a", "b"]] and resets
    assert reflector.synced.is_set()


def test_age_is_unknown_before_the_first_list():
    reflector = Reflector("x", FakeListWatch(), {}, print, print, stop=threading.Event())
    assert reflector.age() is None and not reflector.synced.is_set()


def test_a_broken_watch_resumes_from_where_it_was(world):
    api, sink, reflector, resets = world
    reflector.start()
    api.wait_for_watch(1)
    api.event("ADDED", make_node("c"))
    wait_for(lambda: sink.events, 5, "the event")
    api.fail_next.append(ConnectionResetError("reset by peer"))
    api.end_watch()  # ends; the next watch call fails; the one after resumes
    api.wait_for_watch(2, timeout=5)
    assert api.watches[1]["resource_version"] == "101" and api.lists == 1 and resets


def test_a_list_is_handed_over_page_by_page(monkeypatch):
    """Each page is reduced before the next is asked for: the reflector never holds
    more than one page of raw objects (what keeps a relist of 50,000 pods small)."""
    monkeypatch.setattr("extender.reflector.PAGE_SIZE", 2)
    api = FakeListWatch([make_node(n) for n in "abcde"], version=7)
    seen: list[tuple[str, int]] = []

    def replace(items) -> None:
        seen.extend((item["metadata"]["name"], api.lists) for item in items)

    stop = threading.Event()
    reflector = Reflector("nodes", api, {}, replace, lambda *_: None, stop=stop)
    try:
        assert reflector._list("start") == "7"
    finally:
        stop.set()
    # a and b arrived while only the first page had been asked for, and so on.
    assert seen == [("a", 1), ("b", 1), ("c", 2), ("d", 2), ("e", 3)]


def test_a_replace_that_stops_early_is_an_error():
    api = FakeListWatch([make_node(n) for n in "ab"])
    reflector = Reflector(
        "nodes", api, {}, lambda items: None, lambda *_: None, stop=threading.Event()
    )
    with pytest.raises(RuntimeError, match="did not read the list"):
        reflector._list("start")


def test_an_api_server_that_refuses_is_failing_until_it_answers_again(world):
    api, _sink, reflector, _ = world
    reflector.start()
    api.wait_for_watch(1)
    assert reflector.failing is None
    api.fail_next.extend([ConnectionRefusedError("refused")] * 2)
    api.end_watch()  # the watch ends; the next two calls are refused
    wait_for(lambda: reflector.failing is not None, 5, "the refusal seen")
    assert "refused" in reflector.failing
    api.wait_for_watch(2, timeout=10)
    api.bookmark()  # it answers again: its first word clears the failure
    wait_for(lambda: reflector.failing is None, 5, "the failure cleared")


def test_a_stale_view_is_ready_only_where_the_api_server_does_not_answer_either():
    from extender.reflector import stale_readiness

    def reflector(age, failing=None):
        made = Reflector("k", FakeListWatch(), {}, print, print, stop=threading.Event())
        made.contact, made.clock, made.failing = 0.0, lambda: age, failing
        return made

    # the API server answers; only this replica's watch went silent: not ready
    ok, why = stale_readiness({"nodes": reflector(45), "pods": reflector(1)}, 45, 40, "s")
    assert not ok and "45s old" in why
    # it refuses this replica for every stale kind: the other replica sees the same
    stale = {"nodes": reflector(45, "ConnectionRefusedError()"), "pods": reflector(45, "x")}
    ok, why = stale_readiness(stale, 45, 40, "s")
    assert ok and why.startswith("degraded:") and "ConnectionRefusedError" in why
    # one stale kind silent, one refused: not the shared cause
    ok, _ = stale_readiness({"nodes": reflector(45, "x"), "pods": reflector(45)}, 45, 40, "s")
    assert not ok
