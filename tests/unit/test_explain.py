"""Placement explanations: what a prioritize call decided, the Event's words once the
pod is bound, and the writer's bounds (rate, queue, expiry, a second replica)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.explain import (
    REASON,
    Explainer,
    best,
    decision,
    event_body,
    event_name,
    explain,
    only_fit,
)

WEIGHTS = {"gpu": 3, "scarcity": 6, "fragmentation": 6}


def sample(uid="uid-1"):
    return decision(
        "ml",
        "train-0",
        uid,
        2,
        ["a", "b", "c"],
        [9, 6, 9],
        {
            "gpu": [10.0, 4.0, 10.0],
            "scarcity": [10.0, 10.0, 10.0],
            "fragmentation": [8.0, 2.0, 7.0],
        },
        WEIGHTS,
    )


def test_a_decision_keeps_the_best_candidates_with_their_parts():
    d = sample()
    assert [c.node for c in d.top] == ["a", "c", "b"]  # by score, ties by name
    assert d.top[0].parts == (("gpu", 10.0), ("scarcity", 10.0), ("fragmentation", 8.0))
    assert d.candidates == 3
    names = [f"n{i}" for i in range(50)]
    many = decision("ns", "p", "u", 1, names, list(range(50)), {}, {}, keep=8)
    assert len(many.top) == 8 and many.top[0].node == "n49"


def test_the_message_names_rank_parts_and_why_the_runner_up_lost():
    text = explain(sample(), "a")
    assert text.startswith("2 GPUs on a: extender score 9/10, rank 1 of 3 candidates")
    assert "gpu 10, scarcity 10, fragmentation 8" in text
    assert "c scored 9 too (kube-scheduler broke the tie); it is lower on fragmentation 7" in text
    lower = explain(sample(), "c")
    assert "The extender preferred a (score 9)" not in lower  # a tie, not a preference


def test_when_kube_scheduler_chose_another_node_it_says_so():
    text = explain(sample(), "b")
    assert "rank 3 of 3" in text
    assert "The extender preferred a (score 9); kube-scheduler's own plugins outweighed" in text
    outside = explain(sample(), "zzz")
    assert "not among the extender's best 3 of 3 candidates" in outside
    assert "the extender's best: a" in outside


def test_the_event_is_on_the_pod_and_named_by_its_uid():
    body = event_body(sample(), "a", datetime(2026, 11, 30, tzinfo=UTC), "replica-0")
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "train-0",
        "uid": "uid-1",
    }
    assert body["reason"] == REASON and body["type"] == "Normal"
    assert body["metadata"]["name"] == event_name("train-0", "uid-1")
    assert event_name("train-0", "uid-1") != event_name("train-0", "uid-2")
    assert len(event_name("x" * 253, "u")) <= 253
    assert len(body["message"]) <= 1024


class Api:
    def __init__(self):
        self.events: dict[str, dict] = {}

    def create(self, body):
        name = body["metadata"]["name"]
        if name in self.events:
            error = RuntimeError("AlreadyExists")
            error.status = 409
            raise error
        self.events[name] = body


def test_only_scored_pods_get_an_event_and_two_replicas_write_one():
    api = Api()
    one, two = Explainer(api.create), Explainer(api.create)
    one.remember(sample())
    two.remember(sample())
    one.bound("uid-1", "a")
    two.bound("uid-1", "a")
    one.bound("never-scored", "a")
    one.drain()
    two.drain()
    assert list(api.events) == [event_name("train-0", "uid-1")]
    assert one.written == 1 and two.written == 0 and two.failed == 0
    one.bound("uid-1", "a")  # seen again (a later watch event): nothing more
    one.drain()
    assert one.written == 1


def test_a_binding_seen_before_its_decision_is_remembered_still_gets_its_event():
    """A filter that picks remembers its decision after the answer is on the wire;
    kube-scheduler may bind the pod, and the watch say so, before that."""
    api = Api()
    explainer = Explainer(api.create)
    explainer.expect("uid-1")
    explainer.bound("uid-1", "b")  # the watch was quicker
    explainer.bound("not-expected", "b")  # never scored: nothing kept
    explainer.remember(sample())
    explainer.drain()
    assert list(api.events) == [event_name("train-0", "uid-1")]
    assert api.events[event_name("train-0", "uid-1")]["message"].startswith("2 GPUs on b")
    explainer.expect("uid-2")  # the usual order: remembered, then bound
    explainer.remember(sample("uid-2"))
    explainer.bound("uid-2", "a")
    explainer.drain()
    assert explainer.written == 2


def test_decisions_expire_and_are_bounded():
    now = [0.0]
    api = Api()
    explainer = Explainer(api.create, capacity=2, ttl=60, clock=lambda: now[0])
    for i in range(3):
        explainer.remember(sample(f"u{i}"))
    explainer.bound("u0", "a")  # evicted: the oldest of three with room for two
    now[0] = 61
    explainer.bound("u1", "a")  # expired
    explainer.drain()
    assert api.events == {}


def test_the_writer_is_rate_limited_and_the_queue_bounded():
    now = [0.0]
    api = Api()
    explainer = Explainer(api.create, rate=1, burst=2, queue_size=3, clock=lambda: now[0])
    for i in range(5):
        explainer.remember(sample(f"u{i}"))
        explainer.bound(f"u{i}", "a")
    explainer.drain()
    assert explainer.written == 2  # the burst
    assert explainer.dropped == 3  # 2 found the queue full, 1 found no token
    now[0] = 10
    explainer.remember(sample("later"))
    explainer.bound("later", "a")
    explainer.drain()
    assert explainer.written == 3


def test_the_one_node_a_filter_left_is_explained_by_the_others_failures():
    reasons = {
        "a": "2 of 8 GPUs free; pod requests 4",
        "b": "2 of 8 GPUs free; pod requests 4",
        "c": "node is not spot capacity",
    }
    d = only_fit("ml", "p", "u", 4, "d", 4, reasons)
    text = explain(d, "d")
    assert text == (
        "4 GPUs on d: the only one of 4 candidates that fits; the others: "
        "2 x 2 of 8 GPUs free; pod requests 4; 1 x node is not spot capacity"
    )


def test_the_explanation_names_the_topology_level_that_drew_a_group():
    words = "3 of its group's 4 placed pods in nvidia.com/gpu.clique=c1"
    d = decision(
        "ns",
        "p",
        "u",
        8,
        ["a", "b"],
        [9, 6],
        {"group": [10.0, 0.0]},
        {"group": 15},
        note=lambda i: words if i == 0 else None,
    )
    assert d.top[0].note == words and d.top[1].note is None
    assert f"8 GPUs on a, with its placement group ({words}):" in explain(d, "a")
    assert "placement group" not in explain(d, "b")


def test_a_clear_winner_names_the_runner_up_and_where_it_lost():
    d = decision("ns", "p", "u", 1, ["a", "b"], [9, 6], {"gpu": [10.0, 4.0]}, {"gpu": 4})
    assert explain(d, "a").endswith("Runner-up b, score 6: lower on gpu 4 against 10")
    only = only_fit("ns", "p", "u", 1, "a", 1, {})
    assert explain(only, "a") == "1 GPU on a: the only node kube-scheduler's own filters left"


@settings(max_examples=300, deadline=None)
@given(
    scores=st.lists(st.integers(0, 10), max_size=60),
    keep=st.integers(0, 70),
    data=st.data(),
)
def test_best_is_the_top_scores_then_by_name(scores, keep, data):
    """The explanation's best candidates (found in numpy) are the first ``keep`` of
    all candidates by score, highest first, then in the order they came (a tie at
    the edge keeps the first ones), shown by score then by name."""
    names = data.draw(
        st.lists(
            st.text("abcxyz09-", min_size=1, max_size=6),
            min_size=len(scores),
            max_size=len(scores),
            unique=True,
        )
    )
    kept = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:keep]
    assert best(names, scores, keep) == sorted(kept, key=lambda i: (-scores[i], names[i]))


def test_the_engines_parts_are_read_as_plain_lists_are():
    """decision() reads the engine's lazy parts in one step (``pick``): the same
    figures as reading them one by one, known and unknown candidates alike."""
    from extender.config import ExtenderConfig
    from extender.model import NodeFacts, PodFacts
    from extender.policies import build_policies
    from extender.view import View
    from tests.helpers import score_nodes

    nodes = [
        NodeFacts(f"n{i}", 8, labelled_gpu=True, product=p, capacity_type=c, zone="z")
        for i, (p, c) in enumerate([("A", "spot"), ("B", None), ("A", None), ("B", "spot")])
    ]
    view = View(nodes={n.name: n for n in nodes}, used={"n0": 6, "n2": 2})
    cfg = ExtenderConfig()
    for candidates in (nodes, [*nodes[:2], None, *nodes[2:]]):
        names = [n.name if n is not None else "gone" for n in candidates]
        parts: dict = {}
        pod = PodFacts("ns", "p", 2, spot="prefer")
        scores = score_nodes(pod, candidates, view, build_policies(cfg), cfg, parts, names)
        plain = {policy: list(values) for policy, values in parts.items()}
        assert parts and any(len(set(v)) > 1 for v in plain.values())
        fast = decision("ns", "p", "u", 2, names, scores, parts, cfg.weights, keep=3)
        slow = decision("ns", "p", "u", 2, names, scores, plain, cfg.weights, keep=3)
        assert fast == slow


def test_a_decision_is_worked_out_only_while_the_rate_leaves_room_for_its_event():
    now = [0.0]
    api = Api()
    explainer = Explainer(api.create, rate=1, burst=2, clock=lambda: now[0])
    assert explainer.admit()
    for uid in ("u0", "u1"):
        explainer.remember(sample(uid))
        explainer.bound(uid, "a")
    assert not explainer.admit()  # two tokens, two Events queued for them
    assert explainer.dropped == 0  # a reading: the answer given says whether it was used
    explainer.unexplained()
    assert explainer.dropped == 1  # counted as the writer would have
    explainer.drain()
    assert explainer.written == 2 and not explainer.admit()  # the bucket is empty
    now[0] = 0.5
    assert not explainer.admit()
    now[0] = 1.0  # one token again
    assert explainer.admit() and explainer.dropped == 1
