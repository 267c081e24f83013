"""The two-verb path (kube-scheduler picks: filterChooses off, or a pod with
preferences): prioritize scores the names filter passed when it is asked, explains
its decision then (or counts its Event dropped past the rate), and each call writes
its own log line and metrics once its answer is written."""

from __future__ import annotations

import orjson
import pytest

from extender import metrics
from extender.app import create_app
from extender.config import ExtenderConfig
from extender.explain import Explainer
from tests.factories import make_node, make_pod
from tests.fakeapi import synced_cache

MODELS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB", "NVIDIA-L4")
NAMES = [f"n{i:02d}" for i in range(24)]


def body(pod, names):
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


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
    both = ExtenderConfig(filter_chooses=False)
    app = create_app(both, cache=cache, explainer=explainer)
    # The same cache behind a second app that is only ever asked prioritize.
    fresh = create_app(both, cache=cache)
    yield app.test_client(), fresh.test_client(), cache, remembered
    cache.stop()


def post(client, verb, payload):
    response = client.post(f"/{verb}", json=payload)
    data = response.get_data()
    response.close()  # what gunicorn does once the answer is written: runs call_on_close
    assert response.status_code == 200, data[:300]
    return data


def filtered(client, pod, names=NAMES):
    return orjson.loads(post(client, "filter", body(pod, names)))["NodeNames"]


def test_prioritize_scores_the_names_filter_passed_and_explains_it_then(cluster):
    client, fresh, _, remembered = cluster
    pod = make_pod("p", 2)
    passed = filtered(client, pod)
    assert 2 <= len(passed) < len(NAMES)  # some nodes are too full: a real subset
    assert remembered == []  # nothing is explained before prioritize is asked
    answer = post(client, "prioritize", body(pod, passed))
    assert answer == post(fresh, "prioritize", body(pod, passed))
    (decision,) = remembered  # explained once, when prioritize was asked
    assert decision.name == "p" and decision.candidates == len(passed)
    assert post(client, "prioritize", body(pod, passed)) == answer  # asked again: the same


def test_prioritize_scores_on_the_view_it_takes_when_asked(cluster):
    """A binding that lands between the verbs is in prioritize's scores."""
    client, fresh, cache, _ = cluster
    pod = make_pod("p", 2)
    passed = filtered(client, pod)
    before = post(fresh, "prioritize", body(pod, passed))
    best = max(orjson.loads(before), key=lambda h: h["Score"])["Host"]
    cache.pod_event("ADDED", make_pod("late", 5, node=best, phase="Running"))
    after = post(client, "prioritize", body(pod, passed))
    assert after != before and after == post(fresh, "prioritize", body(pod, passed))


def test_a_malformed_name_is_a_400(cluster):
    client, _, _, _ = cluster
    pod = make_pod("p", 2)
    passed = filtered(client, pod)
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
    assert explainer.dropped == 1  # once for the answer given
    post(client, "prioritize", body(pod, passed))
    assert explainer.dropped == 2  # one answer given, one Event counted dropped


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


def test_each_verb_writes_its_own_info_line(cluster, caplog):
    """A filter that passed every candidate still writes its line; prioritize's is
    its own (its time, best node and score, the view it scored on)."""
    client, _, _, _ = cluster
    pod = make_pod("q", 2)
    roomy = filtered(client, pod)  # the nodes with room: filter passes all of them
    with caplog.at_level("INFO", logger="extender"):
        assert filtered(client, pod, roomy) == roomy
        post(client, "prioritize", body(pod, roomy))
    (filter_line,) = [r for r in caplog.records if r.getMessage() == "filter"]
    assert filter_line.levelname == "INFO" and filter_line.passed == len(roomy)
    assert filter_line.picker == "kube-scheduler"
    (line,) = [r for r in caplog.records if r.getMessage() == "prioritize"]
    assert line.levelname == "INFO" and line.nodes == len(roomy) and line.ms > 0
    assert line.best in roomy and line.view_pods == 30
    assert not hasattr(line, "filter_ms") and not hasattr(line, "picker")
