"""Each policy, the engine's sorting of nodes, and the normalisation to 0..10."""

from __future__ import annotations

import pytest

from extender.config import ConfigError, ExtenderConfig, config_from_mapping
from extender.engine import UNKNOWN_NODE, filter_nodes
from extender.model import NodeFacts, lease_heartbeat, node_facts, pod_facts
from extender.policies import build_policies
from extender.view import View as ClusterView
from gpu_scheduler import contract
from gpu_scheduler.fields import FieldError
from tests.factories import make_lease, make_node, make_pod
from tests.helpers import score_nodes

CFG = ExtenderConfig()
POLICIES = build_policies(CFG)
NOW = 1_800_000_000.0


def View(used=None, groups=None, pressure=None, nodes=None, **kw):
    """A cluster-mode view (usage known) at NOW."""
    return ClusterView(
        used=used or {},
        groups=groups or {},
        pressure=pressure or {},
        nodes=nodes or {},
        now=NOW,
        age=1.0,
        **kw,
    )


def facts(*nodes):
    return [node_facts(n) for n in nodes]


def run_filter(pod, nodes, view=None):
    names = [n.name for n in nodes]
    return filter_nodes(pod_facts(pod), names, nodes, view or View(), POLICIES)


def run_score(pod, nodes, view=None, cfg=CFG):
    return score_nodes(pod_facts(pod), nodes, view or View(), build_policies(cfg), cfg)


H100 = dict(product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)
A100 = dict(product="NVIDIA-A100-SXM4-40GB", memory_mib=40960)


# --- gpu: fit ----------------------------------------------------------------------
def test_cpu_node_is_unresolvable_for_gpu_pod():
    out = run_filter(make_pod(gpus=1), facts(make_node("cpu")))
    assert out.unresolvable == {"cpu": "node has no GPUs (no allocatable nvidia.com/gpu)"}


def test_labelled_node_without_allocatable_may_fit_later():
    node = make_node("g", 8, **H100)
    del node["status"]["allocatable"][contract.RESOURCE_GPU]
    out = run_filter(make_pod(gpus=1), facts(node))
    assert "advertises no allocatable" in out.failed["g"]


def test_busy_gpus_fail_resolvably_and_too_small_nodes_unresolvably():
    nodes = facts(make_node("a", 8, **H100), make_node("b", 4, **H100))
    out = run_filter(make_pod(gpus=6), nodes, View(used={"a": 4}))
    assert out.failed == {"a": "4 of 8 GPUs free; pod requests 6"}
    assert out.unresolvable == {"b": "node has 4 GPUs in all; pod requests 6"}
    assert out.passed == []


def test_min_gpu_memory():
    nodes = facts(make_node("h", 8, **H100), make_node("a", 8, **A100), make_node("x", 8))
    pod = make_pod(gpus=1, annotations={contract.ANN_MIN_GPU_MEMORY: "80Gi"})
    out = run_filter(pod, nodes)
    # 80Gi = 81920 MiB: an H100's 81559 MiB is below it; be honest about units
    assert out.passed == []
    pod = make_pod(gpus=1, annotations={contract.ANN_MIN_GPU_MEMORY: "79Gi"})
    out = run_filter(pod, nodes)
    assert out.passed == ["h"]
    assert "below gpu-scheduler.io/min-gpu-memory=80896 MiB" in out.unresolvable["a"]
    assert "publishes no GPU memory label" in out.unresolvable["x"]


def test_gpu_products():
    nodes = facts(make_node("h", 8, **H100), make_node("a", 8, **A100))
    pod = make_pod(gpus=1, annotations={contract.ANN_GPU_PRODUCTS: "NVIDIA-A100-SXM4-40GB, L4"})
    out = run_filter(pod, nodes)
    assert out.passed == ["a"]
    assert out.unresolvable["h"].startswith("GPU product NVIDIA-H100-80GB-HBM3 is not one of")


def test_legacy_memory_label_is_read():
    node = make_node("old", 4)
    node["metadata"]["labels"][contract.LABEL_GPU_MEMORY_LEGACY] = "32768"
    pod = make_pod(gpus=1, annotations={contract.ANN_MIN_GPU_MEMORY: "32768"})
    assert run_filter(pod, facts(node)).passed == ["old"]


def test_unknown_node_is_unresolvable_not_dropped():
    out = filter_nodes(pod_facts(make_pod()), ["ghost"], [None], View(), POLICIES)
    assert out.unresolvable == {"ghost": UNKNOWN_NODE}


def test_bad_annotation_fails_every_node_with_its_reason():
    pod = make_pod(annotations={contract.ANN_MIN_GPU_MEMORY: "lots", contract.ANN_SPOT: "maybe"})
    nodes = facts(make_node("a", 8, **H100), make_node("b"))
    out = run_filter(pod, nodes)
    assert set(out.unresolvable) == {"a", "b"}
    assert "min-gpu-memory='lots'" in out.unresolvable["a"]
    assert "spot='maybe'" in out.unresolvable["a"]
    assert run_score(pod, nodes) == [0, 0]


# --- gpu: score --------------------------------------------------------------------
def test_binpack_prefers_fewest_free_that_fit():
    nodes = facts(*(make_node(n, 8, **H100) for n in "abcd"))
    view = View(used={"a": 0, "b": 4, "c": 7, "d": 6})
    scores = run_score(make_pod(gpus=1, annotations={contract.ANN_SPOT: "prefer"}), nodes, view)
    assert scores.index(max(scores)) == 2  # c: 1 free, perfect fit
    assert scores[2] > scores[3] > scores[1] > scores[0]


def test_spread_prefers_most_free():
    nodes = facts(*(make_node(n, 8, **H100) for n in "abc"))
    view = View(used={"a": 6, "b": 2, "c": 4})
    pod = make_pod(gpus=1, annotations={contract.ANN_PLACEMENT: "spread"})
    scores = run_score(pod, nodes, view)
    assert scores[1] > scores[2] > scores[0]


def test_default_placement_from_config():
    cfg = config_from_mapping({"defaultPlacement": "spread"})
    pod = pod_facts(make_pod(gpus=1), cfg.default_placement)
    assert pod.placement == "spread"


def test_cpu_pod_passes_everything_and_prefers_cpu_nodes():
    nodes = facts(make_node("gpu", 8, **H100), make_node("cpu"))
    out = run_filter(make_pod(gpus=0), nodes)
    assert out.passed == ["gpu", "cpu"]
    scores = run_score(make_pod(gpus=0), nodes)
    assert scores == [0, 10]


# --- spot --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pref", "better"),
    [("prefer", "spot"), ("avoid", "ondemand"), (None, "ondemand")],
)
def test_preferred_capacity_scores_strictly_higher(pref, better):
    ann = {contract.ANN_SPOT: pref} if pref else {}
    nodes = facts(
        make_node("spot", 8, capacity_type="SPOT", **H100),
        make_node("ondemand", 8, capacity_type="ON_DEMAND", **H100),
    )
    scores = dict(
        zip(["spot", "ondemand"], run_score(make_pod(annotations=ann), nodes), strict=True)
    )
    worse = "spot" if better == "ondemand" else "ondemand"
    assert scores[better] > scores[worse]


def test_spot_difference_survives_any_binpack_state():
    # Both nodes share a gpu score that varies with load; capacity type must still win.
    for used in range(8):
        nodes = facts(
            make_node("s", 8, karpenter="spot", **H100),
            make_node("o", 8, karpenter="on-demand", **H100),
            make_node("other", 8, **H100),
        )
        view = View(used={"s": used, "o": used, "other": 7 - used})
        prefer = run_score(make_pod(annotations={contract.ANN_SPOT: "prefer"}), nodes, view)
        assert prefer[0] > prefer[1], used
        avoid = run_score(make_pod(annotations={contract.ANN_SPOT: "avoid"}), nodes, view)
        assert avoid[1] > avoid[0], used


def test_spot_require_and_forbid_filter():
    nodes = facts(
        make_node("s", 8, capacity_type="SPOT", **H100),
        make_node("o", 8, capacity_type="ON_DEMAND", **H100),
        make_node("u", 8, **H100),
    )
    out = run_filter(make_pod(annotations={contract.ANN_SPOT: "require"}), nodes)
    assert out.passed == ["s"] and set(out.unresolvable) == {"o", "u"}
    out = run_filter(make_pod(annotations={contract.ANN_SPOT: "forbid"}), nodes)
    assert out.passed == ["o", "u"] and "spot capacity" in out.unresolvable["s"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("eks.amazonaws.com/capacityType", "SPOT"),
        ("karpenter.sh/capacity-type", "spot"),
        ("cloud.google.com/gke-spot", "true"),
        ("cloud.google.com/gke-preemptible", "true"),
        ("kubernetes.azure.com/scalesetpriority", "spot"),
    ],
)
def test_spot_on_every_cloud(key, value):
    nodes = facts(make_node("s", 8, extra_labels={key: value}, **H100), make_node("o", 8, **H100))
    out = run_filter(make_pod(annotations={contract.ANN_SPOT: "forbid"}), nodes)
    assert out.passed == ["o"] and "spot capacity" in out.unresolvable["s"]
    out = run_filter(make_pod(annotations={contract.ANN_SPOT: "require"}), nodes)
    assert out.passed == ["s"] and set(out.unresolvable) == {"o"}
    scores = run_score(make_pod(annotations={contract.ANN_SPOT: "prefer"}), nodes)
    assert scores[0] > scores[1]


# --- group -------------------------------------------------------------------------
def test_group_is_drawn_to_its_zone():
    nodes = facts(
        make_node("a1", 8, zone="a", **H100),
        make_node("b1", 8, zone="b", **H100),
        make_node("nz", 8, **H100),
    )
    view = View(groups={("default", "job"): {"b1": 3}}, nodes={n.name: n for n in nodes})
    pod = make_pod(annotations={contract.ANN_GROUP: "job"})
    scores = run_score(pod, nodes, view)
    assert scores[1] > scores[0] and scores[1] > scores[2]
    # another namespace's group of the same name does not pull
    other = make_pod(namespace="other", annotations={contract.ANN_GROUP: "job"})
    assert len(set(run_score(other, nodes, view))) == 1


CLIQUE, SUBBLOCK, BLOCK = contract.TOPOLOGY_LEVELS[:3]


def topo(name, zone="z1", **levels):
    return make_node(name, 8, zone=zone, extra_labels=levels, **H100)


def test_group_packs_into_the_tightest_shared_domain():
    """The group runs in clique c1 (GKE sub-block s1, block b1): a node of that
    clique beats a node of the same sub-block, which beats one of the same block, which
    beats one of the same zone only; a node in another zone scores least."""
    nodes = facts(
        topo("member", **{CLIQUE: "c1", SUBBLOCK: "s1", BLOCK: "b1"}),
        topo("clique", **{CLIQUE: "c1", SUBBLOCK: "s1", BLOCK: "b1"}),
        topo("subblock", **{CLIQUE: "c2", SUBBLOCK: "s1", BLOCK: "b1"}),
        topo("block", **{CLIQUE: "c3", SUBBLOCK: "s2", BLOCK: "b1"}),
        topo("zone", **{CLIQUE: "c4", SUBBLOCK: "s3", BLOCK: "b2"}),
        topo("away", zone="z2"),
    )
    view = View(groups={("default", "job"): {"member": 2}}, nodes={n.name: n for n in nodes})
    pod = make_pod(annotations={contract.ANN_GROUP: "job"})
    policy = next(p for p in build_policies(CFG) if p.name == "group")
    state = policy.pre_score(pod_facts(pod), view)
    raw = policy.score_all(
        state,
        ClusterView(nodes={n.name: n for n in nodes}).candidates([n.name for n in nodes]),
        view,
    )
    assert list(raw[1:]) == sorted(raw[1:], reverse=True) and len(set(raw[1:])) == 5
    assert state.describe(nodes[1]) == f"2 of its group's 2 placed pods in {CLIQUE}=c1"
    assert state.describe(nodes[3]) == f"2 of its group's 2 placed pods in {BLOCK}=b1"
    assert state.describe(nodes[5]) is None


def test_more_of_the_group_in_a_domain_draws_harder():
    nodes = facts(
        topo("x1", **{CLIQUE: "x"}),
        topo("y1", **{CLIQUE: "y"}),
        topo("x2", **{CLIQUE: "x"}),
        topo("y2", **{CLIQUE: "y"}),
    )
    view = View(groups={("default", "job"): {"x1": 1, "y1": 3}}, nodes={n.name: n for n in nodes})
    scores = run_score(make_pod(annotations={contract.ANN_GROUP: "job"}), nodes, view)
    assert scores[3] > scores[2]


def test_group_levels_are_configured():
    """Custom levels (a lab's block and rack labels) replace the defaults; the node
    facts keep the configured labels only."""
    cfg = config_from_mapping({"groupLevels": ["example.com/rack", "example.com/block"]})
    assert cfg.group_levels == ("example.com/rack", "example.com/block")
    rack = make_node("r", 8, extra_labels={"example.com/rack": "r1", CLIQUE: "c"}, **H100)
    assert node_facts(rack, cfg.group_levels).domains == (("example.com/rack", "r1"),)
    for bad in ([], ["not a key!"], ["a/b", "a/b"], "example.com/rack", [7]):
        with pytest.raises(ConfigError, match="groupLevels"):
            config_from_mapping({"groupLevels": bad})


def test_the_old_zone_policy_name_is_read_as_group():
    cfg = config_from_mapping({"weights": {"zone": 0}, "disabled": ["zone"]})
    assert cfg.weight("group") == 0 and "group" in cfg.disabled


# --- heartbeat ---------------------------------------------------------------------
def beating(facts: NodeFacts, renewed: str) -> NodeFacts:
    """The facts as the cluster cache gives them with the node's heartbeat Lease."""
    (name, beat) = lease_heartbeat(make_lease(facts.name, renewed))  # type: ignore[misc]
    assert name == facts.name
    facts.heartbeat = beat
    return facts


def test_silent_agent_gets_no_gpu_pods_but_unmanaged_nodes_are_trusted():
    fresh = "2027-01-15T07:55:00.000000Z"  # NOW - 5 minutes
    stale = "2027-01-15T07:00:00.000000Z"  # NOW - 1 hour
    fresh_node, stale_node, gfd_node = facts(
        make_node("fresh", 8, **H100), make_node("stale", 8, **H100), make_node("gfd", 8, **H100)
    )
    nodes = [beating(fresh_node, fresh), beating(stale_node, stale), gfd_node]
    assert nodes[0].heartbeat == NOW - 300
    out = run_filter(make_pod(), nodes)
    assert out.passed == ["fresh", "gfd"]  # no Lease: not agent-managed, never refused
    # unresolvable: preemption must not evict pods for a node that keeps being refused
    assert "agent on this node is silent" in out.unresolvable["stale"]
    assert "3600s ago (window 900s)" in out.unresolvable["stale"]
    assert run_filter(make_pod(gpus=0), nodes).passed == ["fresh", "stale", "gfd"]


def test_the_old_heartbeat_annotation_is_not_read():
    """Left on a node by an agent that is gone (or not yet upgraded), it never refuses."""
    node = make_node("old", 8, **H100)
    node["metadata"]["annotations"][contract.ANN_LEGACY_HEARTBEAT] = "2020-01-01T00:00:00Z"
    assert node_facts(node).heartbeat is None
    assert run_filter(make_pod(), facts(node)).passed == ["old"]


def test_heartbeat_can_be_disabled():
    cfg = config_from_mapping({"disabled": ["heartbeat"]})
    nodes = [beating(facts(make_node("stale", 8, **H100))[0], "2020-01-01T00:00:00Z")]
    out = filter_nodes(pod_facts(make_pod()), ["stale"], nodes, View(), build_policies(cfg))
    assert out.passed == ["stale"]


# --- normalisation and config ------------------------------------------------------
def test_scores_are_ints_in_range_and_unknown_nodes_score_zero():
    nodes = [*facts(make_node("a", 8, **H100), make_node("b", 2, **H100)), None]
    scores = run_score(make_pod(), nodes, View(used={"a": 3}))
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in scores)
    assert scores[2] == 0


def test_each_policys_parts_are_its_normalised_scores_by_candidate():
    # a: 3 of 8 used, b: 2 of 2 free, c: unknown, d: 8 free. Binpack (raw = GPUs left
    # after placing, negated) min-max over a, b, d: b 1 left -> 10, a 4 -> 5, d 7 -> 0.
    nodes = [
        *facts(make_node("a", 8, **H100), make_node("b", 2, **H100)),
        None,
        *facts(make_node("d", 8, **H100)),
    ]
    parts: dict = {}
    pod = pod_facts(make_pod(gpus=1))
    scores = score_nodes(pod, nodes, View(used={"a": 3}), build_policies(CFG), CFG, parts)
    gpu = parts["gpu"]
    assert len(gpu) == 4 and list(gpu) == [5.0, 10.0, 0.0, 0.0]
    assert gpu[-4] == 5.0 and gpu[1:3] == [10.0, 0.0]
    with pytest.raises(IndexError):
        gpu[4]
    assert list(parts["spot"]) == [10.0, 10.0, 0.0, 10.0]  # all alike: MAX_SCORE
    # The total is the weighted mean of the parts, rounded half up.
    weights = {name: CFG.weight(name) for name in parts}
    for i in (0, 1, 3):
        mean = sum(weights[p] * parts[p][i] for p in parts) / sum(weights.values())
        assert scores[i] == int(mean + 0.5)
    assert scores[2] == 0


def test_weights_too_small_to_matter_are_rejected():
    with pytest.raises(ConfigError, match="under a tenth"):
        config_from_mapping({"weights": {"gpu": 20, "spot": 1, "group": 1}})
    with pytest.raises(ConfigError, match="unknown config keys"):
        config_from_mapping({"wieghts": {}})
    with pytest.raises(ConfigError, match="unknown policies"):
        config_from_mapping({"weights": {"gpux": 1}})
    cfg = config_from_mapping({"weights": {"group": 0}, "heartbeatWindow": "10m"})
    assert cfg.weight("group") == 0 and cfg.heartbeat_window_seconds == 600


def test_node_facts_without_a_name_raise():
    for bad in ({"metadata": {}}, {"metadata": {"name": 5}}, {"metadata": "x"}, [], None):
        with pytest.raises(FieldError, match=r"metadata\.name|must be an object"):
            node_facts(bad)
    with pytest.raises(FieldError):
        node_facts({"metadata": {"name": "x" * 254}})
    assert node_facts(make_node("x")) == NodeFacts("x", 0, cpu_milli=32000, ram_mib=262144)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda n: n["metadata"].update(labels=["a"]), "metadata.labels: must be an object"),
        (lambda n: n.update(status=[]), "status: must be an object, not an array"),
        (lambda n: n["status"].update(allocatable=[1]), "status.allocatable: must be an object"),
        (
            lambda n: n["status"]["allocatable"].update({contract.RESOURCE_GPU: "1e999999"}),
            'status.allocatable["nvidia.com/gpu"]: quantity',
        ),
        (
            lambda n: n["status"]["allocatable"].update({contract.RESOURCE_GPU: "-2"}),
            "must not be negative",
        ),
        (
            lambda n: n["metadata"]["labels"].update({contract.LABEL_GPU_PRODUCT: 5}),
            'metadata.labels["nvidia.com/gpu.product"]: must be a string, not a number',
        ),
        (
            lambda n: n["metadata"]["labels"].update({contract.LABEL_ZONE: ["z"]}),
            'metadata.labels["topology.kubernetes.io/zone"]',
        ),
    ],
)
def test_a_malformed_node_fails_naming_the_field(change, field):
    node = make_node("n", 8, product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)
    change(node)
    facts = node_facts(node)
    assert facts.name == "n"
    assert facts.error is not None
    assert field in facts.error, facts.error
    out = run_filter(make_pod(gpus=1), [facts])
    assert out.unresolvable == {"n": facts.error} and out.passed == []
    assert run_score(make_pod(gpus=1), [facts]) == [0]


def test_label_values_we_do_not_read_may_have_any_type():
    node = make_node("n", 2)
    node["metadata"]["labels"]["example.com/odd"] = 12
    assert node_facts(node).error is None


# --- scarcity ----------------------------------------------------------------------
def PressureView(pressure, used=None):
    return View(used=used, pressure=pressure)


def test_unrestricted_pods_leave_the_model_restricted_pods_need():
    t4 = make_node("t4", 1, product="T4", memory_mib=15360)
    g2 = make_node("g2", 8, product="G2", memory_mib=16384)
    nodes = facts(t4, g2)
    view = PressureView({"T4": 0.9, "G2": 0.05}, used={"g2": 0})
    # binpack alone prefers the T4 node (a perfect fit for one GPU)
    assert run_score(make_pod(gpus=1), nodes, View())[0] == 10
    scores = run_score(make_pod(gpus=1), nodes, view)
    assert scores[1] > scores[0]
    # a pod restricted to T4 is not steered: scarcity skips it
    restricted = make_pod(gpus=1, annotations={contract.ANN_GPU_PRODUCTS: "T4,G2"})
    assert run_score(restricted, nodes, view)[0] == 10


def test_scarcity_does_not_override_binpack_between_unwanted_models():
    a = make_node("a", 8, product="G2", memory_mib=16384)
    b = make_node("b", 8, product="G3", memory_mib=16384)
    view = PressureView({"G2": 0.05, "G3": 0.15}, used={"a": 0, "b": 7})
    scores = run_score(make_pod(gpus=1), facts(a, b), view)
    assert scores[1] > scores[0]  # b is a perfect fit; G3's slight pressure does not matter


def test_cache_pressure_from_bound_pods_and_node_capacity():
    from extender.cache import ClusterCache

    cache = ClusterCache()
    cache.replace_nodes(
        [
            make_node("t4", 2, product="T4"),
            make_node("g2a", 8, product="G2"),
            make_node("g2b", 8, product="G2"),
        ]
    )
    assert dict(cache.view().pressure) == {}
    cache.pod_event(
        "ADDED",
        make_pod("r", 2, node="t4", phase="Running", annotations={contract.ANN_GPU_PRODUCTS: "T4"}),
    )
    cache.pod_event("ADDED", make_pod("u", 2, node="g2a", phase="Running"))
    pressure = cache.view().pressure
    # half the demand is restricted to T4, which holds 2 of 18 GPUs
    assert pressure["T4"] == pytest.approx(0.5 / (2 / 18))
    assert pressure["G2"] == 0
    cache.node_event("DELETED", {"metadata": {"name": "g2b"}})
    assert cache.view().pressure["T4"] == pytest.approx(0.5 / (2 / 10))
    cache.pod_event("DELETED", make_pod("r", 2, node="t4"))
    assert cache.view().pressure["T4"] == 0


# --- shared GPUs (time-slicing, MPS) and MIG single, as GFD labels them ------------------
def shared_node(name, gpus=8, replicas=4):
    node = make_node(
        name, gpus * replicas, product="NVIDIA-H100-80GB-HBM3-SHARED", memory_mib=81559
    )
    node["metadata"]["labels"][contract.LABEL_GPU_REPLICAS] = str(replicas)
    node["metadata"]["labels"][contract.LABEL_GPU_SHARING_STRATEGY] = "time-slicing"
    node["metadata"]["labels"][contract.LABEL_GPU_COUNT] = str(gpus)
    return node


def test_time_sliced_nodes_count_replicas_and_match_the_model_with_or_without_shared():
    (node,) = facts(shared_node("ts"))
    assert (node.allocatable, node.replicas, node.model) == (32, 4, "NVIDIA-H100-80GB-HBM3")
    # allocatable is 8 GPUs x 4 replicas; 30 replicas are in use, 2 are free
    view = View(used={"ts": 30})
    assert run_filter(make_pod(gpus=2), [node], view).passed == ["ts"]
    assert run_filter(make_pod(gpus=3), [node], view).failed == {
        "ts": "2 of 32 GPUs free; pod requests 3"
    }
    for products in ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3-SHARED"):
        pod = make_pod(gpus=1, annotations={contract.ANN_GPU_PRODUCTS: products})
        assert run_filter(pod, [node]).passed == ["ts"], products


def test_gke_time_sharing_pools_count_their_clients_as_replicas():
    """GKE's time-sharing (and MPS) pools: Google's device plugin advertises
    max-shared-clients-per-gpu units a GPU, and no GFD writes gpu.replicas (our agent
    writes 1). The extender reads GKE's labels: four L4 shared by 2 are 8 units of
    half an L4's memory each."""
    node = make_node("gke", 8, product="NVIDIA-L4", memory_mib=23034)
    labels = node["metadata"]["labels"]
    labels[contract.LABEL_GPU_REPLICAS] = "1"  # what the agent writes there
    labels[contract.LABEL_GKE_GPU_SHARING_STRATEGY] = "time-sharing"
    labels[contract.LABEL_GKE_MAX_SHARED_CLIENTS] = "2"
    (facts_,) = facts(node)
    assert (facts_.allocatable, facts_.replicas, facts_.memory_mib) == (8, 2, 23034 // 2)
    big = make_pod(gpus=1, annotations={contract.ANN_MIN_GPU_MEMORY: "16Gi"})
    assert run_filter(big, [facts_]).unresolvable  # a client's half never holds 16 GiB
    del labels[contract.LABEL_GKE_GPU_SHARING_STRATEGY]  # the count alone says nothing
    assert facts(node)[0].replicas == 1


def test_min_gpu_memory_on_a_shared_gpu_is_its_share():
    """Time-slicing guarantees no memory at all, MPS caps each client at memory /
    replicas: a pod on a shared GPU can count on its share, 81559 / 4 = 20389 MiB."""
    (node,) = facts(shared_node("ts"))
    assert node.memory_mib == 20389
    fits = make_pod(gpus=1, annotations={contract.ANN_MIN_GPU_MEMORY: "19Gi"})
    assert run_filter(fits, [node]).passed == ["ts"]
    too_big = make_pod(gpus=1, annotations={contract.ANN_MIN_GPU_MEMORY: "20Gi"})
    assert "20389 MiB per GPU is below" in run_filter(too_big, [node]).unresolvable["ts"]


def test_mig_single_strategy_nodes_are_matched_by_their_mig_product():
    node = make_node("mig", 56, product="NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", memory_mib=4864)
    (mig,) = facts(node)
    pod = make_pod(gpus=1, annotations={contract.ANN_GPU_PRODUCTS: mig.product})
    assert run_filter(pod, [mig]).passed == ["mig"]
    whole = make_pod(gpus=1, annotations={contract.ANN_GPU_PRODUCTS: "NVIDIA-A100-SXM4-40GB"})
    assert "is not one of" in run_filter(whole, [mig]).unresolvable["mig"]
    small = make_pod(gpus=1, annotations={contract.ANN_MIN_GPU_MEMORY: "10Gi"})
    assert "4864 MiB per GPU" in run_filter(small, [mig]).unresolvable["mig"]
