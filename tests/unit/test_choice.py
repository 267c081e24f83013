"""A filter that picks (extender/choice.py): one node answered where the extender may
decide alone, every node that fits where kube-scheduler must weigh the pod's own
preferences; soft taints and ties as documented."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender import metrics
from extender.app import create_app
from extender.choice import EXTENDER, SCHEDULER, pick
from extender.columns import Candidates
from extender.config import ConfigError, ExtenderConfig, config_from_mapping
from extender.explain import Explainer, explain
from extender.model import UNREADABLE_PREFERENCES, NodeFacts, PodFacts, pod_facts
from gpu_scheduler.fields import FieldError
from gpu_scheduler.podspec import pod_preference
from gpu_scheduler.taints import (
    UNREADABLE,
    intolerable,
    node_soft_taints,
    pod_soft_tolerations,
    tolerates,
)
from tests.factories import make_node, make_pod
from tests.fakeapi import synced_cache

POD = PodFacts("default", "p", 1)
CA_TAINT = {
    "key": "DeletionCandidateOfClusterAutoscaler",
    "value": "1",
    "effect": "PreferNoSchedule",
}


def batch(rows, taints=None):
    """Candidates from (free GPUs, free CPU, free memory) per node."""
    names = [f"n{i}" for i in range(len(rows))]
    facts = [NodeFacts(name, 8, soft_taints=(taints or {}).get(name, ())) for name in names]
    free = {name: (g, c, r, None) for name, (g, c, r) in zip(names, rows, strict=True)}
    return names, Candidates.from_facts(names, facts, free, {})


# --- the ranking ---------------------------------------------------------------------
def test_the_finer_score_decides_before_cpu_and_memory():
    _, nodes = batch([(8, 1, 1), (8, 1, 1), (8, 1, 1)])
    assert pick(POD, nodes, np.array([7.2, 7.4, 7.3])) == 1


def test_ties_on_the_score_go_to_the_least_free_cpu_then_memory_then_the_first():
    _, nodes = batch([(8, 9000, 5), (8, 4000, 9), (8, 4000, 7), (8, 4000, 7)])
    assert pick(POD, nodes, np.array([5.0, 5.0, 5.0, 5.0])) == 2
    assert pick(POD, nodes, None) == 2  # no policy scores: all tie


def test_a_node_with_a_soft_taint_the_pod_does_not_tolerate_comes_last():
    taint = (("DeletionCandidateOfClusterAutoscaler", "1"),)
    _, nodes = batch([(8, 1, 1), (8, 1, 1)], {"n0": taint})
    means = np.array([9.0, 3.0])
    assert pick(POD, nodes, means) == 1
    tolerant = PodFacts("default", "p", 1, soft_tolerations=(("", "Exists", ""),))
    assert pick(tolerant, nodes, means) == 0
    _, both = batch([(8, 1, 1), (8, 1, 1)], {"n0": taint, "n1": taint})
    assert pick(POD, both, means) == 0  # all tainted alike: the score decides


# --- taints and tolerations ----------------------------------------------------------
@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        (("", "Exists", ""), ("any", "v"), True),
        (("k", "Exists", ""), ("k", "v"), True),
        (("k", "Exists", ""), ("other", "v"), False),
        (("k", "Equal", "v"), ("k", "v"), True),
        (("k", "Equal", "v"), ("k", "w"), False),
        (("k", "Equal", ""), ("k", ""), True),
        (("k", "Lt", "5"), ("k", "3"), False),  # an operator it does not know
    ],
)
def test_tolerates_follows_tolerates_taint(toleration, taint, expected):
    assert tolerates((toleration,), taint) is expected


def test_only_prefer_no_schedule_taints_are_kept_and_unreadable_ones_are_avoided():
    spec = {
        "taints": [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            CA_TAINT,
            {"key": "soft", "effect": "PreferNoSchedule"},
        ]
    }
    assert node_soft_taints(spec) == (("DeletionCandidateOfClusterAutoscaler", "1"), ("soft", ""))
    assert node_soft_taints(None) == ()
    assert node_soft_taints({"taints": "x"}) == UNREADABLE
    assert node_soft_taints({"taints": [{"effect": 5}]}) == UNREADABLE
    assert intolerable((), UNREADABLE) == 1
    assert intolerable((("", "Exists", ""),), UNREADABLE) == 0


def test_only_tolerations_that_can_match_a_soft_taint_are_kept():
    spec = {
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "a", "operator": "Exists"},
            {"key": "b", "value": "1", "effect": "PreferNoSchedule"},
        ]
    }
    assert pod_soft_tolerations(spec) == (("a", "Exists", ""), ("b", "Equal", "1"))
    with pytest.raises(FieldError):
        pod_soft_tolerations({"tolerations": [7]})


# --- the pod's own preferences ---------------------------------------------------------
TERM = [{"weight": 1, "preference": {"matchExpressions": []}}]
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def affinity(kind, key, value):
    return {"affinity": {kind: {key: value}}}


def spread(when):
    return {"topologySpreadConstraints": [{"whenUnsatisfiable": when}]}


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({}, None),
        (affinity("nodeAffinity", REQUIRED, {}), None),
        (affinity("nodeAffinity", PREFERRED, TERM), "preferred node affinity"),
        (affinity("podAffinity", PREFERRED, TERM), "preferred pod affinity"),
        (affinity("podAntiAffinity", PREFERRED, TERM), "preferred pod anti-affinity"),
        (spread("DoNotSchedule"), None),
        (spread("ScheduleAnyway"), "a ScheduleAnyway topology spread constraint"),
    ],
)
def test_a_pods_preferences_are_named(spec, words):
    assert pod_preference(spec) == words


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=3),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
            ["affinity", "nodeAffinity", "podAffinity", "podAntiAffinity", "tolerations",
             "preferredDuringSchedulingIgnoredDuringExecution", "topologySpreadConstraints",
             "whenUnsatisfiable", "effect", "key", "operator", "value"]), inner, max_size=4),
        max_leaves=12,
    )
)  # fmt: skip
def test_a_spec_of_any_shape_gives_preferences_or_says_it_cannot_read_them(spec):
    facts = pod_facts({"metadata": {"name": "p"}, "spec": spec})
    assert facts.preference is None or isinstance(facts.preference, str)
    if not isinstance(spec, dict | type(None)):
        assert facts.preference == UNREADABLE_PREFERENCES or facts.error is not None


# --- the verb ---------------------------------------------------------------------------
def picks(outcome: str) -> float:
    return metrics.FILTER_PICKS.labels(outcome)._value.get()


@pytest.fixture
def cluster():
    nodes = [
        make_node("a", 8, zone="z1"),
        make_node("b", 8, zone="z1"),
        make_node("c", 8, zone="z1"),
        make_node("full", 8, zone="z1"),
    ]
    pods = [
        make_pod("r1", 6, node="a", phase="Running"),
        make_pod("r2", 2, node="b", phase="Running"),
        make_pod("r3", 8, node="full", phase="Running"),
    ]
    cache = synced_cache(nodes, pods, clock=lambda: 1_800_000_000.0)
    remembered: list = []
    explainer = Explainer(lambda b: None)
    explainer.remember = remembered.append  # type: ignore[method-assign]
    app = create_app(cache=cache, explainer=explainer)
    yield app.test_client(), cache, remembered
    cache.stop()


def post(client, verb, pod, names):
    response = client.post(f"/{verb}", json={"Pod": pod, "Nodes": None, "NodeNames": names})
    body = response.get_json()
    response.close()  # gunicorn closes it once written: what follows runs then
    return body


def test_the_filter_answers_the_node_prioritize_would_rank_first(cluster):
    client, _, remembered = cluster
    before = picks(EXTENDER)
    body = post(client, "filter", make_pod("p", 2), ["c", "b", "a", "full"])
    assert body["NodeNames"] == ["a"]  # binpack: a has 2 free, b 6, c 8
    assert body["FailedNodes"] == {"full": "0 of 8 GPUs free; pod requests 2"}
    assert picks(EXTENDER) == before + 1
    (d,) = remembered
    assert d.picked and d.top[0].node == "a" and d.candidates == 3


def test_a_pod_with_preferences_gets_every_node_that_fits_and_prioritize(cluster, caplog):
    client, _, _ = cluster
    pod = make_pod("p", 2)
    pod["spec"] |= affinity("nodeAffinity", PREFERRED, TERM)
    before = picks(SCHEDULER)
    with caplog.at_level("INFO", logger="extender"):
        body = post(client, "filter", pod, ["c", "b", "a"])
        assert body["NodeNames"] == ["c", "b", "a"]
        answer = post(client, "prioritize", pod, ["c", "b", "a"])
    assert picks(SCHEDULER) == before + 1
    scores = {h["Host"]: h["Score"] for h in answer}
    assert scores["a"] == max(scores.values())
    # filter's line says who picks and why; prioritize's follows
    lines = [r for r in caplog.records if r.levelname == "INFO"]
    assert [r.getMessage() for r in lines] == ["filter", "prioritize"]
    assert lines[0].picker == SCHEDULER and lines[0].preference == "preferred node affinity"
    assert lines[1].best == "a"


def test_with_filter_chooses_off_every_node_that_fits_goes_back(cluster):
    _, cache, _ = cluster
    both = create_app(ExtenderConfig(filter_chooses=False), cache=cache)
    body = post(both.test_client(), "filter", make_pod("p", 2), ["c", "b", "a"])
    assert body["NodeNames"] == ["c", "b", "a"]


def remembering_app(cache):
    remembered: list = []
    explainer = Explainer(lambda b: None)
    explainer.remember = remembered.append  # type: ignore[method-assign]
    return create_app(cache=cache, explainer=explainer), remembered


def test_a_soft_tainted_node_is_passed_over_unless_tolerated():
    tainted = make_node("a", 8)
    tainted["spec"] = {"taints": [CA_TAINT]}
    cache = synced_cache(
        [tainted, make_node("b", 8)],
        [make_pod("r1", 6, node="a", phase="Running")],
        clock=lambda: 1_800_000_000.0,
    )
    try:
        app, remembered = remembering_app(cache)
        client = app.test_client()
        assert post(client, "filter", make_pod("p", 1), ["a", "b"])["NodeNames"] == ["b"]
        (d,) = remembered
        assert [c.node for c in d.top] == ["b", "a"] and d.top[1].avoided
        assert "PreferNoSchedule taint the pod does not tolerate" in explain(d, "b")
        tolerant = make_pod("q", 1)
        tolerant["spec"]["tolerations"] = [{"operator": "Exists"}]
        assert post(client, "filter", tolerant, ["a", "b"])["NodeNames"] == ["a"]
        assert not remembered[-1].top[1].avoided
    finally:
        cache.stop()


def test_a_tie_lost_to_a_soft_taint_says_so():
    tainted = make_node("a", 8)
    tainted["spec"] = {"taints": [CA_TAINT]}
    cache = synced_cache([tainted, make_node("b", 8)], [], clock=lambda: 1_800_000_000.0)
    try:
        app, remembered = remembering_app(cache)
        assert post(app.test_client(), "filter", make_pod("p", 1), ["a", "b"])["NodeNames"] == ["b"]
        (d,) = remembered
        assert d.top[0].score == d.top[1].score  # alike but for the taint
        message = explain(d, "b")
        assert "PreferNoSchedule taint" in message and "broke the tie" not in message
    finally:
        cache.stop()


def test_a_pick_with_no_scoring_policy_is_not_told_as_the_only_fit():
    every = ["gpu", "spot", "group", "scarcity", "fragmentation"]
    cache = synced_cache([make_node("a", 8), make_node("b", 8)], [], clock=lambda: 1.8e9)
    try:
        remembered: list = []
        explainer = Explainer(lambda b: None)
        explainer.remember = remembered.append  # type: ignore[method-assign]
        cfg = ExtenderConfig(disabled=frozenset(every))
        app = create_app(cfg, cache=cache, explainer=explainer)
        assert post(app.test_client(), "filter", make_pod("p", 1), ["a", "b"])["NodeNames"] == ["a"]
        message = explain(remembered[0], "a")
        assert "the only one" not in message and "rank 1 of 2" in message, message
    finally:
        cache.stop()


def test_the_event_says_the_extender_broke_the_tie():
    from extender.explain import Candidate, Decision

    top = (Candidate("a", 9, (("gpu", 10.0),)), Candidate("b", 9, (("gpu", 9.0),)))
    d = Decision("ns", "p", "u", 1, 2, top, (("gpu", 5),), picked=True)
    assert "(the extender broke the tie)" in explain(d, "a")
    runner = Candidate("b", 9, (("gpu", 9.0),), avoided=True)
    tainted = (Candidate("a", 6, (("gpu", 6.0),)), runner)
    d = Decision("ns", "p", "u", 1, 2, tainted, (("gpu", 5),), picked=True)
    assert "PreferNoSchedule taint the pod does not tolerate" in explain(d, "a")


def test_filter_chooses_is_read_and_checked():
    assert ExtenderConfig().filter_chooses is True
    assert config_from_mapping({"filterChooses": False}).filter_chooses is False
    with pytest.raises(ConfigError, match="filterChooses"):
        config_from_mapping({"filterChooses": "yes"})
