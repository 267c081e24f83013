"""GPU health as the extender reads it: the agent's per-GPU annotation, believed only on
a node whose agent holds its heartbeat Lease, caps the GPUs a pod can be given."""

from __future__ import annotations

import json

import pytest

from extender.config import ExtenderConfig
from extender.engine import filter_nodes
from extender.model import pod_facts
from extender.policies import build_policies
from gpu_scheduler import contract
from gpu_scheduler.contract import GpuHealth, gpu_health
from tests.factories import make_lease, make_node, make_pod
from tests.helpers import score_nodes

NOW = 1_800_000_000.0
RENEWED = "2027-01-15T08:00:00.000000Z"  # fresh against NOW


def annotation(*healthy: bool, mig=None, xid=79):
    gpus = []
    for i, ok in enumerate(healthy):
        gpu = {"index": i, "uuid": f"GPU-{i}", "healthy": ok}
        if not ok:
            gpu |= {"xid": xid, "reason": "fell off the bus", "since": "2026-12-01T10:00:00Z"}
        if mig is not None:
            gpu |= {
                "migEnabled": True,
                "migDevices": [{"uuid": f"MIG-{i}-{m}"} for m in range(mig)],
            }
        gpus.append(gpu)
    return json.dumps(gpus)


def test_the_annotation_read_into_units():
    assert gpu_health(annotation(True, False, True)) == GpuHealth(
        2, 3, ("GPU-1 (XID 79; fell off the bus; since 2026-12-01T10:00:00Z)",)
    )
    assert gpu_health(annotation(True, False), replicas=4).healthy == 4  # time-sliced x4
    assert gpu_health(annotation(True, False, mig=7), mig_single=True) == GpuHealth(
        7, 14, gpu_health(annotation(True, False, mig=7)).unhealthy
    )
    assert gpu_health(annotation(True, True, mig=7)).total == 0  # mixed: not nvidia.com/gpu


@pytest.mark.parametrize(
    "value",
    [
        None,
        3,
        "",
        "not json",
        "{}",
        "[1, 2]",
        '[{"healthy": false}, 7]',
        "[" * 60_000,  # nested too deep for the parser
        "[" * 100_000,  # longer than any node's GPUs need
    ],
)
def test_what_cannot_be_read_is_no_health_at_all(value):
    assert gpu_health(value) is None


@pytest.mark.parametrize(
    ("healthy", "total", "allocatable", "usable"),
    [
        (7, 8, 8, 7),  # the device plugin still counts the sick GPU: cap at the healthy
        (7, 8, 7, 7),  # it already left it out: nothing more to take
        (6, 8, 7, 6),  # it left one of two out
        (28, 32, 32, 28),
        (7, 8, 32, 28),  # it shares x4 and the labels do not say: a quarter each
        (8, 8, 8, 8),
        (0, 0, 8, 8),  # no units known (MIG, mixed): nothing held back
        (0, 8, 8, 0),
    ],
)
def test_usable_units(healthy, total, allocatable, usable):
    assert GpuHealth(healthy, total, ()).usable(allocatable) == usable


def listed(nodes, pods=()):
    """A cache as its reflectors would fill it, without their threads."""
    from extender.cache import ClusterCache

    cache = ClusterCache(clock=lambda: NOW)
    cache.replace_nodes(nodes)
    cache.replace_pods(pods)
    return cache


def cache_with(node, lease=True):
    cache = listed([node])
    if lease:
        cache.replace_leases([make_lease(node["metadata"]["name"], RENEWED)])
    return cache


def decide(cache, gpus):
    view = cache.view()
    pod = pod_facts(make_pod(gpus=gpus))
    cfg = ExtenderConfig()
    names = list(view.nodes)
    out = filter_nodes(pod, names, view.candidates(names), view, build_policies(cfg))
    return out, score_nodes(pod, view.candidates(names), view, build_policies(cfg), cfg)


def sick_node(*healthy):
    node = make_node("h", len(healthy), product="NVIDIA-H100-80GB-HBM3")
    node["metadata"]["annotations"][contract.ANN_GPUS] = annotation(*healthy)
    return node


def test_a_sick_gpu_the_device_plugin_still_counts_is_not_offered():
    cache = cache_with(sick_node(True, True, True, False, True, True, True, True))
    try:
        out, _ = decide(cache, 8)
        reason = out.unresolvable["h"]
        assert "7 of 8 GPUs healthy; pod requests 8" in reason
        assert "GPU-3 (XID 79; fell off the bus; since 2026-12-01T10:00:00Z)" in reason
        out, scores = decide(cache, 7)
        assert out.passed == ["h"] and scores == [10]
        assert cache.view().free["h"][0] == 7
    finally:
        cache.stop()


def test_without_the_agents_lease_the_annotation_holds_nothing_back():
    """A node whose agent is gone (its Lease goes with its pod) keeps the annotation it
    last wrote; it must never hold GPUs back for ever (the heartbeat's lesson)."""
    cache = cache_with(sick_node(False, True), lease=False)
    try:
        out, _ = decide(cache, 2)
        assert out.passed == ["h"]
        cache.replace_leases([make_lease("h", RENEWED)])
        out, _ = decide(cache, 2)
        assert "1 of 2 GPUs healthy" in out.unresolvable["h"]
        cache.replace_leases([])
        assert decide(cache, 2)[0].passed == ["h"]
    finally:
        cache.stop()


def test_gpus_in_use_and_sick_ones_both_count():
    node = sick_node(True, True, True, False)
    pods = [make_pod("r", 2, node="h", phase="Running")]
    cache = listed([node], pods)
    cache.replace_leases([make_lease("h", RENEWED)])
    try:
        out, _ = decide(cache, 2)
        assert out.failed["h"] == "1 of 3 GPUs free (1 unhealthy); pod requests 2"
        assert decide(cache, 1)[0].passed == ["h"]
    finally:
        cache.stop()


# --- DRA: a device with a blocking taint (KEP-5055) is not offered -----------------------
def tainted_device(i, effect="NoSchedule"):
    from tests.factories import gpu_device

    device = gpu_device(i)
    device["taints"] = [
        {"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": effect},
        {"key": "note", "value": "x", "effect": "None"},  # not blocking: left out
    ]
    return device


def dra_cache(devices, claims=()):
    from extender.cache import ClusterCache
    from tests.factories import claim, device_class, resource_slice

    cache = ClusterCache(clock=lambda: NOW)
    cache.replace_nodes([make_node("dra")])
    cache.replace_device_classes([device_class()])
    cache.replace_slices([resource_slice("dra", devices)])
    cache.replace_claims([claim(name, "dra", held) for name, held in claims])
    cache.replace_pods([])
    return cache


def test_a_tainted_dra_device_is_not_offered_and_the_reason_names_it():
    from tests.factories import gpu_device

    devices = [gpu_device(0), gpu_device(1), tainted_device(2, "NoExecute"), gpu_device(3)]
    cache = dra_cache(devices)
    out, _ = decide(cache, 4)
    reason = out.unresolvable["dra"]
    assert reason.startswith("3 of 4 GPUs healthy; pod requests 4; unhealthy: device gpu-2")
    assert "gpu.nvidia.com/unhealthy=xid-79:NoExecute" in reason and "note" not in reason
    assert decide(cache, 3)[0].passed == ["dra"]
    assert cache.view().free["dra"][0] == 3
    from tests.factories import claim

    cache.claim_event("ADDED", claim("late", "dra", ["gpu-2"]))  # a claim on it: no change
    assert cache.view().free["dra"][0] == 3
    cache.claim_event("ADDED", claim("real", "dra", ["gpu-1"]))
    assert cache.view().free["dra"][0] == 2


def test_a_claim_on_a_tainted_device_does_not_count_twice():
    """The tainted device is out of the pool whether or not a claim holds it: the three
    others minus the one a claim holds are free."""
    from tests.factories import gpu_device

    devices = [gpu_device(0), gpu_device(1), tainted_device(2), gpu_device(3)]
    cache = dra_cache(devices, [("c1", ["gpu-2"]), ("c2", ["gpu-0"])])
    assert cache.view().free["dra"][0] == 2
    assert decide(cache, 2)[0].passed == ["dra"]
    out, _ = decide(cache, 3)
    assert out.failed["dra"] == "2 of 3 GPUs free (1 unhealthy); pod requests 3"


def test_a_device_taint_rule_takes_its_devices_out_and_deleting_it_gives_them_back():
    from tests.factories import gpu_device

    cache = dra_cache([gpu_device(i) for i in range(4)])
    rule = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "maintenance"},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "dra", "device": "gpu-3"},
            "taint": {"key": "maintenance", "value": "true", "effect": "NoExecute"},
        },
    }
    cache.taint_rule_event("ADDED", rule)
    assert cache.view().free["dra"][0] == 3
    assert "device gpu-3 (maintenance=true:NoExecute)" in decide(cache, 4)[0].unresolvable["dra"]
    every = {**rule, "metadata": {"name": "all"}, "spec": {**rule["spec"], "deviceSelector": {}}}
    cache.replace_taint_rules([rule, every])  # an empty selector: every device
    assert cache.view().free["dra"][0] == 0
    effectless = {**rule, "spec": {**rule["spec"], "taint": {"key": "k", "effect": "None"}}}
    cache.replace_taint_rules([effectless])  # a taint that does not block: nothing
    assert cache.view().free["dra"][0] == 4
    cache.taint_rule_event("ADDED", rule)
    cache.taint_rule_event("DELETED", rule)
    assert cache.view().free["dra"][0] == 4


def test_the_explanation_says_how_many_gpus_are_healthy_where_some_are_not():
    from extender.app import Decider
    from extender.explain import Explainer, explain

    node = sick_node(True, True, True, False, True, True, True, True)
    healthy = make_node("ok", 8, product="NVIDIA-H100-80GB-HBM3")
    cache = listed([node, healthy])
    cache.replace_leases([make_lease("h", RENEWED), make_lease("ok", RENEWED)])
    remembered = []
    explainer = Explainer(lambda body: None)
    explainer.remember = remembered.append  # type: ignore[method-assign]
    decider = Decider(ExtenderConfig(), cache, explainer)
    pod = make_pod("p", 2)
    req = decider.parse({"Pod": pod, "Nodes": None, "NodeNames": ["h", "ok"]})
    decider.prioritize(req)
    (decided,) = remembered
    health = {c.node: c.health for c in decided.top}
    assert health == {"h": (7, 8), "ok": None}
    assert explain(decided, "h").startswith("2 GPUs on h (7 of 8 GPUs there healthy): ")
    assert explain(decided, "ok").startswith("2 GPUs on ok: ")
