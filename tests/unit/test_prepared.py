"""Prioritize's answer prepared after filter (extender/prepared.py): served only to
the call it was prepared for (the same pod, the same names, within a second), scored
on the view filter decided on, and byte for byte what prioritize computes there."""

from __future__ import annotations

import pytest

from extender import app as app_module
from extender import metrics
from extender.app import create_app
from extender.config import ExtenderConfig
from extender.explain import Explainer
from extender.prepared import PreparedAnswers
from tests.factories import make_node, make_pod
from tests.fakeapi import synced_cache

MODELS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB", "NVIDIA-L4")
NAMES = [f"n{i:02d}" for i in range(24)]


def body(pod, names):
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def used(outcome: str) -> float:
    return metrics.PREPARED.labels(outcome)._value.get()


@pytest.fixture
def cluster():
    nodes = [
        make_node(name, 8, zone=f"z{i % 3}", product=MODELS[i % 3], memory_mib=40960)
        for i, name in enumerate(NAMES)
    ]
    pods = [make_pod(f"r{i}", 1 + i % 7, node=NAMES[i % 24], phase="Running") for i in range(30)]
    cache = synced_cache(nodes, pods, clock=lambda: 1_800_000_000.0)
    remembered: list = []
    explainer = Explainer(lambda b: None)
    explainer.remember = remembered.append  # type: ignore[method-assign]
    # kube-scheduler picks (filterChooses off, or a pod with preferences): filter
    # passes every node that fits, and prioritize follows.
    both = ExtenderConfig(filter_chooses=False)
    app = create_app(both, node_source="cluster", cache=cache, explainer=explainer)
    # The same cache behind a second app that is only ever asked prioritize: what the
    # answer is when nothing was prepared.
    fresh = create_app(both, node_source="cluster", cache=cache)
    yield app.test_client(), fresh.test_client(), cache, remembered
    cache.stop()


def post(client, verb, payload):
    response = client.post(f"/{verb}", json=payload)
    data = response.get_data()
    response.close()  # what gunicorn does once the answer is written: runs call_on_close
    assert response.status_code == 200, data[:300]
    return data


def filtered(client, pod, names=NAMES):
    import orjson

    return orjson.loads(post(client, "filter", body(pod, names)))["NodeNames"]


def test_the_prepared_answer_is_used_and_is_the_computed_one(cluster):
    client, fresh, _, remembered = cluster
    pod = make_pod("p", 2)
    passed = filtered(client, pod)
    assert 2 <= len(passed) < len(NAMES)  # some nodes are too full: a real subset
    assert remembered == []  # nothing is explained before prioritize is asked
    before = used("used")
    answer = post(client, "prioritize", body(pod, passed))
    assert used("used") == before + 1
    assert answer == post(fresh, "prioritize", body(pod, passed))
    (decision,) = remembered  # explained once, when prioritize was asked
    assert decision.name == "p" and decision.candidates == len(passed)
    # Used once: asked again, the answer is computed (and the same).
    assert post(client, "prioritize", body(pod, passed)) == answer
    assert used("used") == before + 1


def test_the_cycle_is_scored_on_the_view_filter_decided_on(cluster, caplog):
    """A binding that lands between the verbs makes a newer view; prioritize answers
    from filter's, as kube-scheduler scores a cycle on the snapshot it filtered on."""
    import orjson

    client, fresh, cache, _ = cluster
    pod = make_pod("p", 2)
    passed = filtered(client, pod)
    on_filters_view = post(fresh, "prioritize", body(pod, passed))
    best = max(orjson.loads(on_filters_view), key=lambda h: h["Score"])["Host"]
    cache.pod_event("ADDED", make_pod("late", 5, node=best, phase="Running"))
    on_the_newer_view = post(fresh, "prioritize", body(pod, passed))
    assert on_the_newer_view != on_filters_view  # the binding moved the scores
    older = used("used-older-view")
    scored_on = cache.view().pods - 1  # filter's view: without the late binding
    with caplog.at_level("INFO", logger="extender"):
        assert post(client, "prioritize", body(pod, passed)) == on_filters_view
    assert used("used-older-view") == older + 1
    (line,) = [r for r in caplog.records if r.getMessage() == "prioritize"]
    assert line.prepared is True and line.view_pods == scored_on  # the view it scored on
    # when the call came after filter's answer, and how long it waited (none: done)
    assert line.prepared_after_ms > 0 and line.prepared_wait_ms >= 0 and line.prepared_ms > 0
    # Asked again (a new call, nothing prepared for it): the newer view.
    assert post(client, "prioritize", body(pod, passed)) == on_the_newer_view


@pytest.mark.parametrize("change", ["other names", "other order", "other pod"])
def test_a_call_that_is_not_the_prepared_one_is_scored_afresh(cluster, change):
    client, fresh, _, _ = cluster
    pod = make_pod("p", 2)
    passed = filtered(client, pod)
    names = {"other names": passed[:-1], "other order": passed[::-1], "other pod": passed}[change]
    asked = make_pod("q", 3) if change == "other pod" else pod
    stale = used("stale")
    answer = post(client, "prioritize", body(asked, names))
    assert used("stale") == stale + 1
    assert answer == post(fresh, "prioritize", body(asked, names))


def test_a_failed_preparation_leaves_prioritize_to_compute_it(cluster, monkeypatch):
    client, fresh, _, _ = cluster
    pod = make_pod("p", 2)
    real = app_module.Decider._score
    calls = []

    def score(self, req):
        calls.append(len(req.args.names))
        if len(calls) == 1:
            raise RuntimeError("boom")  # the preparation
        return real(self, req)

    monkeypatch.setattr(app_module.Decider, "_score", score)
    passed = filtered(client, pod)
    unfinished = used("unfinished")
    answer = post(client, "prioritize", body(pod, passed))
    assert used("unfinished") == unfinished + 1 and len(calls) == 2
    monkeypatch.setattr(app_module.Decider, "_score", real)
    assert answer == post(fresh, "prioritize", body(pod, passed))


def test_nothing_is_prepared_for_one_node_node_objects_or_a_pod_in_error(cluster, monkeypatch):
    client, _, _, _ = cluster
    calls = []
    real = app_module.Decider._score
    monkeypatch.setattr(
        app_module.Decider, "_score", lambda self, req: calls.append(1) or real(self, req)
    )
    assert filtered(client, make_pod("p", 2), NAMES[:1]) in ([NAMES[0]], [])
    bad = make_pod("bad", 1)
    resources = bad["spec"]["containers"][0]["resources"]
    resources["requests"]["nvidia.com/gpu"] = resources["limits"]["nvidia.com/gpu"] = "1e999999"
    assert filtered(client, bad) == []
    # Node objects in the request: prioritize judges those, not the cache's rows.
    objects = {"Pod": make_pod("p", 1), "Nodes": {"items": [make_node(n, 8) for n in NAMES[:3]]}}
    response = client.post("/filter", json=objects)
    assert len(response.get_json()["Nodes"]["items"]) >= 2  # enough to be scored
    response.close()
    assert calls == []


def test_prioritize_waits_briefly_for_a_preparation_in_progress():
    import threading

    answers = PreparedAnswers(wait=5)
    pod, view, names = object(), object(), ["a", "b"]
    entry = answers.begin(pod, names, view)
    got = []
    taker = threading.Thread(target=lambda: got.append(answers.take(pod, list(names), view)))
    taker.start()
    answers.finish(entry, "answer")
    taker.join(5)
    (taken,) = got
    assert taken.answer == "answer" and 0 <= taken.waited < 5 and 0 <= taken.after < 5
    assert answers.take(pod, names, view) is None  # used once


def test_a_preparation_over_a_second_old_is_not_this_cycle():
    now = [100.0]
    answers = PreparedAnswers(clock=lambda: now[0])
    pod, view = object(), object()
    answers.finish(answers.begin(pod, ["a", "b"], view), "answer")
    now[0] += 1.5
    assert answers.take(pod, ["a", "b"], view) is None
    answers.finish(answers.begin(pod, ["a", "b"], view), "again")
    now[0] += 0.5
    # came half a second after filter's answer; it was ready: no wait
    assert answers.take(pod, ["a", "b"], view) == ("again", 0.5, 0.0)


def test_a_preparation_not_finished_in_time_is_not_waited_for():
    answers = PreparedAnswers(wait=0.01)
    pod, view = object(), object()
    answers.begin(pod, ["a", "b"], view)
    assert answers.take(pod, ["a", "b"], view) is None


def test_a_prepared_answer_is_served_without_looking_the_names_up(cluster, monkeypatch):
    """On a hit the names are filter's own (already checked against its view): the
    lookup into the view's rows is skipped; on a miss it is made, and a malformed
    name is still a 400."""
    from extender.view import View

    client, _, _, _ = cluster
    pod = make_pod("p", 2)
    passed = filtered(client, pod)
    lookups: list[int] = []
    real = View.candidates
    monkeypatch.setattr(View, "candidates", lambda v, n: lookups.append(len(n)) or real(v, n))
    before = used("used")
    post(client, "prioritize", body(pod, passed))
    assert used("used") == before + 1 and lookups == []
    post(client, "prioritize", body(pod, passed))  # used once: now computed
    assert lookups == [len(passed)]
    response = client.post("/prioritize", json=body(pod, [*passed, 7]))
    assert response.status_code == 400 and "NodeNames" in response.get_json()["error"]


def test_past_the_event_rate_no_explanation_is_worked_out_and_the_answer_is_the_same(cluster):
    client, fresh, _, remembered = cluster
    explainer = client.application.extensions["gpu_scheduler"]["explainer"]
    explainer.admit = lambda: False  # type: ignore[method-assign]
    pod = make_pod("p", 2)
    passed = filtered(client, pod)
    answer = post(client, "prioritize", body(pod, passed))
    assert remembered == []  # not explained: its Event would be dropped for the rate
    assert answer == post(fresh, "prioritize", body(pod, passed))
    assert explainer.dropped == 1  # once for the pod, though its answer was prepared
    post(client, "prioritize", body(pod, passed))  # the preparation used: computed now
    assert explainer.dropped == 2  # one answer given, one Event counted dropped


def test_a_prepared_answer_is_served_without_building_a_view(cluster, monkeypatch):
    """A binding between the verbs makes the view old; prioritize answered from the
    preparation only compares the cache's version, and builds no view on its path."""
    from extender import cache as cache_module

    client, _, cache, _ = cluster
    pod = make_pod("p", 2)
    passed = filtered(client, pod)
    monkeypatch.setattr(cache_module, "READERS_ACTIVE", 0.0)  # no watch builds it either
    cache.pod_event("ADDED", make_pod("late", 1, node=passed[0], phase="Running"))
    built = []
    real = cache._build_view
    monkeypatch.setattr(cache, "_build_view", lambda: built.append(1) or real())
    older = used("used-older-view")
    post(client, "prioritize", body(pod, passed))
    assert used("used-older-view") == older + 1
    assert built == []


def test_the_calls_log_line_and_metrics_come_once_the_answer_is_written(cluster, caplog):
    client, _, _, _ = cluster
    requests = metrics.REQUESTS.labels("filter", "200")
    with caplog.at_level("INFO", logger="extender"):
        before = requests._value.get()
        response = client.post("/filter", json=body(make_pod("p", 2), NAMES))
        assert response.status_code == 200
        assert [r for r in caplog.records if r.getMessage() == "filter"] == []
        assert requests._value.get() == before
        response.close()  # gunicorn closes the response once it is written
    (line,) = [r for r in caplog.records if r.getMessage() == "filter"]
    assert line.ms > 0 and line.view_pods == 30 and line.nodes == len(NAMES)
    assert requests._value.get() == before + 1


def test_a_filter_that_passed_every_candidate_is_told_on_prioritizes_line(cluster, caplog):
    """One INFO line a pod: filter's own line only where it turned nodes away (or no
    prepared prioritize follows); otherwise prioritize's line carries its time."""
    client, _, _, _ = cluster
    pod = make_pod("q", 2)
    roomy = filtered(client, pod)  # the nodes with room: filter passes all of them
    with caplog.at_level("DEBUG", logger="extender"):
        assert filtered(client, pod, roomy) == roomy
        post(client, "prioritize", body(pod, roomy))
    (quiet,) = [r for r in caplog.records if r.getMessage() == "filter"]
    assert quiet.levelname == "DEBUG" and quiet.nodes == len(roomy)
    (line,) = [r for r in caplog.records if r.getMessage() == "prioritize"]
    assert line.levelname == "INFO" and line.prepared is True
    assert line.filter_ms > 0 and line.nodes == len(roomy)
    caplog.clear()
    with caplog.at_level("INFO", logger="extender"):
        filtered(client, pod)  # some nodes are too full: filter's reasons are news
        (only_filter,) = [r for r in caplog.records if r.getMessage() == "filter"]
        assert only_filter.levelname == "INFO" and only_filter.failed > 0
        post(client, "prioritize", body(pod, roomy))  # prepared: the names it passed
    (line,) = [r for r in caplog.records if r.getMessage() == "prioritize"]
    assert line.prepared is True and not hasattr(line, "filter_ms")
