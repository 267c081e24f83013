"""The victims the extender adds respect PodDisruptionBudgets as kube-scheduler's
DefaultPreemption does (extender/budgets.py): protected pods last, the violations
counted in the answer, the victims sorted most important first; no pick waiting for
its binding is ever offered."""

from __future__ import annotations

import itertools

import pytest

from extender.app import create_app
from extender.budgets import Ledger, NodePod, budget, label_selector
from tests.factories import make_lease, make_node, make_pod
from tests.fakeapi import FakeCore, synced_cache
from tests.unit import test_preemption
from tests.unit.test_gpu_health import NOW, RENEWED
from tests.unit.test_preemption import sick, uid

NAMES = itertools.count()


def low(name, gpus, node, priority=0, labels=None, started=None):
    pod = make_pod(name, gpus, node=node, phase="Running")
    pod["spec"]["priority"] = priority
    pod["metadata"]["labels"] = dict(labels or {})
    if started:
        pod["status"]["startTime"] = started
    return pod


def pdb(name, labels, allowed, disrupted=()):
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"matchLabels": labels}, "minAvailable": 1},
        "status": {"disruptionsAllowed": allowed, "disruptedPods": dict.fromkeys(disrupted, NOW)},
    }


def preemptor(gpus=4, priority=1000):
    pod = make_pod(f"infer-{next(NAMES)}", gpus)
    pod["spec"]["priority"] = priority
    return pod


@pytest.fixture
def world():
    made = []

    def make(pods, budgets=(), nodes=None):
        core = FakeCore(nodes or [sick()], pods)
        for item in budgets:
            core.list_pod_disruption_budget_for_all_namespaces.objects[item["metadata"]["name"]] = (
                item
            )
        cache = synced_cache(core=core, clock=lambda: NOW)
        cache.replace_leases([make_lease("h", RENEWED)])
        made.append(cache)
        return core, cache, create_app(cache=cache).test_client()

    yield make
    for cache in made:
        cache.stop()


def ask(client, pod, proposal):
    """The answer as kube-scheduler reads it: victims in the order given."""
    return test_preemption.ask(client, pod, proposal, ordered=True)


def test_a_budget_protected_pod_is_kept_while_a_sick_gpu_needs_an_extra_victim(world):
    """The measured case: 8 GPUs, GPU 3 sick, seven 1-GPU pods, the newest protected
    (minAvailable: 1, no disruption allowed). kube-scheduler proposes 3 for a 4-GPU
    pod; a fourth must go, and it is an unprotected one."""
    pods = [low(f"t{i}", 1, "h") for i in range(6)] + [low("t6", 1, "h", labels={"app": "db"})]
    _, _, client = world(pods, [pdb("db", {"app": "db"}, 0)])
    victims, violations = ask(client, preemptor(4), {"h": (["t0", "t1", "t2"], 0)})["h"]
    assert uid("t6") not in victims and len(victims) == 4 and violations == 0
    assert victims[3] == uid("t5")  # the newest unprotected, as the cache counted them


def test_when_only_protected_pods_are_left_the_violation_is_counted(world):
    pods = [low(f"t{i}", 1, "h") for i in range(3)]
    pods += [low(f"p{i}", 1, "h", labels={"app": "db"}) for i in range(4)]
    _, _, client = world(pods, [pdb("db", {"app": "db"}, 1)])
    victims, violations = ask(client, preemptor(4), {"h": (["t0", "t1", "t2"], 0)})["h"]
    # one p may go within the budget (1 allowed): no violation for the first one added
    assert len(victims) == 4 and violations == 0
    _, _, client = world(pods, [pdb("db", {"app": "db"}, 0)])
    victims, violations = ask(client, preemptor(5), {"h": (["t0", "t1", "t2"], 2)})["h"]
    assert len(victims) == 5 and violations == 2 + 2  # kube-scheduler's 2, and our 2


def test_the_answer_lists_victims_most_important_first(world):
    """pickOneNodeForPreemption reads victims.Pods[0] as the highest priority."""
    pods = [
        low("a", 1, "h", priority=5, started="2026-12-06T10:00:00Z"),
        low("b", 1, "h", priority=50, started="2026-12-06T11:00:00Z"),
        low("c", 1, "h", priority=50, started="2026-12-06T09:00:00Z"),
        low("d", 1, "h", priority=1, started="2026-12-06T08:00:00Z"),
    ] + [low(f"x{i}", 1, "h", priority=2000) for i in range(3)]
    _, _, client = world(pods)
    victims, _ = ask(client, preemptor(4), {"h": (["a", "b", "d"], 0)})["h"]
    assert victims == [uid("c"), uid("b"), uid("a"), uid("d")]


def test_no_victims_are_added_where_budgets_cannot_be_read(world):
    from kubernetes.client.exceptions import ApiException

    pods = [low(f"t{i}", 1, "h") for i in range(7)]
    pods += [low(f"o{i}", 4, "o") for i in range(2)]
    core, _, client = world(
        pods, nodes=[sick(), make_node("o", 8, product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)]
    )
    core.list_pod_disruption_budget_for_all_namespaces.fail_next.append(
        ApiException(status=403, reason="Forbidden")
    )
    answer = ask(client, preemptor(4), {"h": (["t0", "t1", "t2"], 0), "o": (["o0"], 0)})
    assert list(answer) == ["o"]  # enough victims there by kube-scheduler's own count


def test_a_pick_waiting_for_its_binding_is_never_a_victim(world):
    """kube-scheduler would not find it on the node: the whole preemption fails
    (``claims to preempt pod ... not found``)."""
    pods = [low(f"t{i}", 1, "h", priority=10) for i in range(6)]
    _, _, client = world(pods)
    picked = make_pod("picked", 1)  # lowest priority (0), assumed on h by the filter
    body = client.post("/filter", json={"Pod": picked, "Nodes": None, "NodeNames": ["h"]})
    assert body.get_json()["NodeNames"] == ["h"]
    victims, _ = ask(client, preemptor(4), {"h": (["t0", "t1"], 0)})["h"]
    # 7 GPUs: six pods and the pick; two more must go, and not the pick (priority 0)
    assert uid("picked") not in victims and len(victims) == 4


# --- the budget arithmetic, as upstream's FilterVictimsWithPDBViolation -------------
def pod(name, labels, namespace="default"):
    return NodePod(f"u-{name}", namespace, name, 0, "~", labels)


def test_a_budget_counts_only_matching_pods_of_its_namespace_not_yet_disrupted():
    budgets = [
        budget(pdb("db", {"app": "db"}, 1, disrupted=["gone"])),
        budget({"metadata": {"name": "all"}, "spec": {"selector": {}}, "status": {}}),
    ]
    ledger = Ledger(budgets)
    assert ledger.take(pod("x", {})) is False  # no labels: never violates
    assert ledger.take(pod("o", {"app": "db"}, namespace="other")) is False
    assert ledger.take(pod("gone", {"app": "db"})) is False  # already disrupted
    assert ledger.take(pod("a", {"app": "db"})) is False  # the one allowed
    assert ledger.take(pod("b", {"app": "db"})) is True
    assert ledger.take(pod("c", {"app": "web"})) is False  # the empty selector: none


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]},
            {"a": "2"},
            True,
        ),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"b": "1"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"b": "1"}, True),
        (
            {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]},
            {"a": "1"},
            False,
        ),
    ],
)
def test_label_selectors(selector, labels, matches):
    assert label_selector(selector)(labels) is matches


@pytest.mark.parametrize(
    "selector",
    [
        None,
        {},
        {"matchLabels": {}},
        {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]},
        {"matchExpressions": [{"key": "a", "operator": "In"}]},
        {"matchLabels": {"a": 1}},
        "a=b",
    ],
)
def test_an_empty_or_invalid_selector_matches_nothing(selector):
    assert label_selector(selector) is None
