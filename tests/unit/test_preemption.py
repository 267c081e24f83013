"""The preempt verb (extender/preemption.py): kube-scheduler proposes victims per node
by its own filters; the extender recounts by its own, adds victims where too few,
drops nodes no victims can help or where a gang would be split, and keeps the nodes
with the least to avoid. Through the app, over the wire format kube-scheduler uses."""

from __future__ import annotations

import itertools
import json

import pytest

from extender.app import create_app
from extender.config import load_config
from extender.model import pod_facts
from extender.policies import build_policies
from extender.preemption import Victims, decide
from gpu_scheduler import contract
from tests.factories import make_lease, make_node, make_pod
from tests.fakeapi import synced_cache
from tests.unit.test_extender_shares import share_pod, shared_node
from tests.unit.test_gpu_health import NOW, RENEWED, annotation

H100 = dict(product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)


def low(name, gpus, node, priority=0, **kw):
    pod = make_pod(name, gpus, node=node, phase="Running", **kw)
    pod["spec"]["priority"] = priority
    return pod


NAMES = itertools.count()


def preemptor(gpus=4, priority=1000, **kw):
    """A new preemptor each call (the extender agrees to victims once per pod a while)."""
    pod = make_pod(f"infer-{next(NAMES)}", gpus, **kw)
    pod["spec"]["priority"] = priority
    return pod


def uid(name):
    return f"uid-default-{name}"


@pytest.fixture
def make_client():
    caches = []

    def make(nodes, pods, leases=()):
        cache = synced_cache(nodes, pods, clock=lambda: NOW)
        if leases:
            cache.replace_leases([make_lease(n, RENEWED) for n in leases])
        caches.append(cache)
        return create_app(cache=cache).test_client()

    yield make
    for cache in caches:
        cache.stop()


def ask(client, pod, proposal, ordered=False):
    """The preempt verb's answer per node: (victims' UIDs, sorted unless ``ordered``:
    as kube-scheduler reads them, in the order given; budget violations)."""
    body = {
        "Pod": pod,
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid(v)} for v in victims], "NumPDBViolations": pdb}
            for node, (victims, pdb) in proposal.items()
        },
    }
    response = client.post("/preempt", json=body)
    assert response.status_code == 200, response.get_json()
    return {
        node: (
            [p["UID"] for p in v["Pods"]] if ordered else sorted(p["UID"] for p in v["Pods"]),
            v["NumPDBViolations"],
        )
        for node, v in response.get_json()["NodeNameToMetaVictims"].items()
    }


def sick(name="h", healthy=(True,) * 3 + (False,) + (True,) * 4):
    node = make_node(name, len(healthy), **H100)
    node["metadata"]["annotations"][contract.ANN_GPUS] = annotation(*healthy)
    return node


def test_enough_victims_go_back_as_they_came(make_client):
    pods = [low(f"t{i}", 1, "n") for i in range(8)]
    client = make_client([make_node("n", 8, **H100)], pods)
    proposal = {"n": (["t0", "t1", "t2", "t3"], 0)}
    assert ask(client, preemptor(4), proposal) == {"n": (sorted(map(uid, proposal["n"][0])), 0)}


def test_a_sick_gpu_gets_the_victim_kube_scheduler_did_not_count(make_client):
    """7 of 8 GPUs healthy, seven low-priority 1-GPU pods: kube-scheduler, counting the
    device plugin's 8, proposes 3 victims for a 4-GPU pod; 4 must go. The one added is
    the lowest priority, then the last counted."""
    pods = [low(f"t{i}", 1, "h", priority=10 if i < 6 else 5) for i in range(7)]
    client = make_client([sick()], pods, leases=["h"])
    answer = ask(client, preemptor(4), {"h": (["t0", "t1", "t2"], 1)})
    assert answer == {"h": (sorted(map(uid, ["t0", "t1", "t2", "t6"])), 1)}


def test_only_lower_priority_pods_are_added(make_client):
    pods = [low(f"t{i}", 1, "h", priority=10) for i in range(4)]
    pods += [low(f"u{i}", 1, "h", priority=2000) for i in range(3)]
    client = make_client([sick()], pods, leases=["h"])
    # 3 free by kube-scheduler's count (8 - 4 - 3 + 2 victims): 2 by ours; the rest
    # of the lower-priority pods make 4 free; the higher-priority ones are never taken
    answer = ask(client, preemptor(4), {"h": (["t0", "t1"], 0)})
    assert answer == {"h": (sorted(map(uid, ["t0", "t1", "t2", "t3"])), 0)}
    answer = ask(client, preemptor(5), {"h": (["t0", "t1", "t2"], 0)})
    assert answer == {}  # 4 is all the lower-priority pods can free


def test_a_node_no_victims_can_help_is_dropped(make_client):
    pods = [low(f"t{i}", 1, "h") for i in range(7)]
    pods += [low(f"a{i}", 1, "a") for i in range(8)]
    client = make_client([sick(), make_node("a", 8, product="NVIDIA-A100", memory_mib=40960)],
                         pods, leases=["h"])  # fmt: skip
    pod = preemptor(8)
    assert ask(client, pod, {"h": (["t0"], 0), "a": ([f"a{i}" for i in range(8)], 0)}) == {
        "a": (sorted(uid(f"a{i}") for i in range(8)), 0)
    }  # h: 7 healthy GPUs never hold 8
    restricted = preemptor(1, annotations={contract.ANN_GPU_PRODUCTS: "NVIDIA-H100-80GB-HBM3"})
    assert list(ask(client, restricted, {"h": (["t0"], 0), "a": (["a0"], 0)})) == ["h"]


def test_a_gang_is_evicted_whole_or_not_at_all(make_client):
    group = {contract.ANN_GROUP: "train"}
    pods = [low("g0", 4, "n", annotations=group), low("g1", 4, "m", annotations=group)]
    pods += [low("w0", 4, "m"), low("solo", 4, "k"), low("k1", 4, "k")]
    nodes = [make_node(n, 8, **H100) for n in ("n", "m", "k")]
    client = make_client(nodes, pods)
    # g0's sibling g1 keeps its GPUs on m: n is dropped; k has no gang member
    answer = ask(client, preemptor(8), {"n": (["g0"], 0), "k": (["solo", "k1"], 0)})
    assert list(answer) == ["k"]
    # both members on one node, both victims: the whole gang goes
    pods = [low("g0", 4, "n", annotations=group), low("g1", 4, "n", annotations=group)]
    client = make_client([make_node("n", 8, **H100)], pods)
    assert list(ask(client, preemptor(8), {"n": (["g0", "g1"], 0)})) == ["n"]


def test_a_victim_of_a_podgroup_or_a_kueue_workload_counts_as_a_gang_member(make_client):
    podgroup = low("p0", 4, "n")
    podgroup["spec"]["schedulingGroup"] = {"podGroupName": "job"}
    sibling = low("p1", 4, "m")
    sibling["spec"]["schedulingGroup"] = {"podGroupName": "job"}
    kueue = low("q0", 4, "k")
    kueue["metadata"]["labels"] = {contract.LABEL_KUEUE_PODSET: "main"}
    kueue["metadata"]["ownerReferences"] = [{"controller": True, "uid": "job-1"}]
    kin = low("q1", 4, "m")
    kin["metadata"]["labels"] = {contract.LABEL_KUEUE_PODSET: "main"}
    kin["metadata"]["ownerReferences"] = [{"controller": True, "uid": "job-1"}]
    nodes = [make_node(n, 4, **H100) for n in ("n", "m", "k")]
    client = make_client(nodes, [podgroup, sibling, kueue, kin])
    assert ask(client, preemptor(4), {"n": (["p0"], 0), "k": (["q0"], 0)}) == {}


def test_the_nodes_with_the_least_to_avoid_are_kept(make_client):
    nodes = [make_node("spot", 8, capacity_type="SPOT", **H100), make_node("od", 8, **H100)]
    pods = [low("s", 8, "spot"), low("o", 8, "od")]
    client = make_client(nodes, pods)
    proposal = {"spot": (["s"], 0), "od": (["o"], 0)}
    assert list(ask(client, preemptor(8), proposal)) == ["od"]  # GPU pods avoid spot
    wants = preemptor(8, annotations={contract.ANN_SPOT: "prefer"})
    assert sorted(ask(client, wants, proposal)) == ["od", "spot"]


def test_a_share_needs_one_gpu_freed_not_the_node_total(make_client):
    """Two 80 GiB GPUs: 40+40 on one, 50 on the other. kube-scheduler counts the node's
    160 GiB: evicting one 40 leaves 70 free, enough for 60 by its count; by GPU, 40 and
    30. Another must go: of the pods of the lowest priority, the last counted, the 50,
    which frees GPU 1."""
    pods = [
        share_pod("a", 40, node="s"),
        share_pod("b", 40, node="s"),
        share_pod("c", 50, node="s"),
    ]
    for pod in pods:
        pod["spec"]["priority"] = 0
    client = make_client([shared_node("s")], pods)
    pod = share_pod("infer", 60)
    pod["spec"]["priority"] = 1000
    answer = ask(client, pod, {"s": (["a"], 0)})
    assert answer == {"s": (sorted([uid("a"), uid("c")]), 0)}


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"Pod": "x"},
        {"Pod": {}, "NodeNameToMetaVictims": []},
        {"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": 7}]}}},
        {"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": {}}}},
        {"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [], "NumPDBViolations": "1e999999"}}},
        {"Pod": {}, "NodeNameToMetaVictims": {"": {"Pods": []}}},
        {"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": "u"}] * 5000}}},
    ],
)
def test_a_malformed_call_is_refused_with_400(make_client, body):
    client = make_client([make_node("n", 8, **H100)], [])
    response = client.post("/preempt", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 400 and response.get_json()["error"]


def test_a_node_the_cache_does_not_know_is_dropped_and_a_malformed_pod_gets_none(make_client):
    client = make_client([make_node("n", 8, **H100)], [low("t0", 8, "n")])
    assert ask(client, preemptor(8), {"gone": (["x"], 0), "n": (["t0"], 0)}) == {
        "n": ([uid("t0")], 0)
    }
    bad = preemptor(8)
    bad["metadata"]["annotations"][contract.ANN_PLACEMENT] = "sideways"
    assert ask(client, bad, {"n": (["t0"], 0)}) == {}


def test_a_pod_gets_victims_once_until_they_had_time_to_go(make_client):
    """kube-scheduler preempts asynchronously and tries the pod again at once, its view
    still counting a victim that is gone: it proposes another. The extender agrees to
    none for that pod for a few seconds."""
    client = make_client([make_node("n", 8, **H100)], [low(f"t{i}", 2, "n") for i in range(4)])
    pod = preemptor(4)
    assert ask(client, pod, {"n": (["t0", "t1"], 0)}) == {"n": (sorted(map(uid, ["t0", "t1"])), 0)}
    assert ask(client, pod, {"n": (["t2"], 0)}) == {}
    assert ask(client, preemptor(4), {"n": (["t2", "t3"], 0)})  # another pod is not held


def test_recent_answers_are_forgotten_after_a_while():
    from extender.preemption import RECENT, Recent

    now = [0.0]
    recent = Recent(clock=lambda: now[0])
    assert recent.held("u") is None
    recent.note("u")
    now[0] += 1.0
    assert recent.held("u") == pytest.approx(1.0)
    now[0] += RECENT
    assert recent.held("u") is None


def test_a_nominated_node_is_behind_only_after_this_replica_agreed_to_victims_there():
    """The victims this replica agreed to are gone from its view, not yet from
    kube-scheduler's, which proposes a live pod on the same node: that node is
    dropped, and only that node. Without such an agreement (another replica's, or
    kube-scheduler nominated the node for CPU, memory, ports or anti-affinity, which
    the extender does not count) the victims stand."""
    nodes = [make_node("n", 8, **H100), make_node("m", 8, **H100)]
    pods = [low(f"t{i}", 2, "n") for i in range(2)] + [low(f"u{i}", 2, "m") for i in range(4)]
    cache = synced_cache(nodes, pods, clock=lambda: NOW)
    try:
        on, gangs, fixed = cache.preemption_pods(["n", "m"])
        policies = build_policies(load_config(None))
        proposed = {"n": Victims((uid("t0"),)), "m": Victims((uid("u0"), uid("u1")))}
        args = (pod_facts(preemptor(4)), 1000, proposed, cache.view(), on, gangs, policies)
        behind = decide(*args, "n", fixed=fixed, agreed=True)
        assert set(behind.kept) == {"m"} and "behind" in behind.dropped["n"]
        assert set(decide(*args, "n", fixed=fixed, agreed=False).kept) == {"n", "m"}
        # nominated where it does not fit by our count: the victims are needed there
        assert set(decide(*args, "m", fixed=fixed, agreed=True).kept) == {"n", "m"}
    finally:
        cache.stop()
