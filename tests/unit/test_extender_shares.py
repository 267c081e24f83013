"""The extender places a share on one GPU: per-GPU accounting from the node's report and
the bound pods, a refusal naming the largest free piece, best fit and FGD on partial
GPUs, and the vector placement equal to the one fit rule."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.app import create_app
from extender.cache_shares import ShareClass
from extender.share_columns import place, share_fragments
from gpu_scheduler import contract, sharing
from tests.factories import make_node, make_pod
from tests.fakeapi import synced_cache

MEM = contract.RESOURCE_GPU_MEMORY


def shared_node(name, gpus=2, gib=80, report=None, mode="mps"):
    node = make_node(
        name, gpus, product="NVIDIA-H100", memory_mib=gib * 1024,
        extra_labels={contract.LABEL_GPU_SHARING: mode},
    )  # fmt: skip
    node["status"]["allocatable"][MEM] = str(gpus * gib)
    node["status"]["capacity"][MEM] = str(gpus * gib)
    entries = [
        {"uuid": f"GPU-{name}-{i}", contract.GPU_MEMORY_MIB: gib * 1024, "healthy": True}
        for i in range(gpus)
    ]
    annotations = node["metadata"]["annotations"]
    annotations[contract.ANN_GPUS] = json.dumps(entries)
    if report is not None:
        annotations[contract.ANN_GPU_SHARES] = json.dumps(report)
    return node


def share_pod(name, *units, node=None, gpus=0, namespace="default"):
    pod = make_pod(
        name, gpus, node=node, namespace=namespace, phase="Running" if node else "Pending"
    )
    container = pod["spec"]["containers"][0]
    for i, amount in enumerate(units):
        if i == 0:
            target = container
        else:
            target = {"name": f"c{i}", "image": "busybox", "resources": {}}
            pod["spec"]["containers"].append(target)
        target["resources"].setdefault("limits", {})[MEM] = str(amount)
    return pod


def body(pod, names):
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


@pytest.fixture
def make_world():
    """The cluster (as the API server holds it: filter's recheck reads it again)."""
    caches = []

    def make(*extra, s1_report=None):
        nodes = [
            shared_node("s1", report=s1_report),
            shared_node("s2"),
            make_node("w", 8, product="NVIDIA-H100", memory_mib=81920),
        ]
        pods = [share_pod("p1", 40, node="s1"), make_pod("p2", 1, node="s2", phase="Running")]
        cache = synced_cache(nodes, [*pods, *extra], clock=lambda: 1_800_000_000.0)
        caches.append(cache)
        return create_app(cache=cache).test_client(), cache

    yield make
    for cache in caches:
        cache.stop()


@pytest.fixture
def world(make_world):
    return make_world()


def test_the_cache_keeps_each_gpu_of_a_sharing_node(world):
    _, cache = world
    view = cache.view()
    assert [(g.uuid, g.free, g.whole_free) for g in view.gpus["s1"]] == [
        ("GPU-s1-0", 40, False),
        ("GPU-s1-1", 80, True),
    ]
    # s2's whole-GPU pod takes GPU 0 whole: no share lands there, and one whole is free.
    assert [(g.free, g.whole_free) for g in view.gpus["s2"]] == [(0, False), (80, True)]
    assert view.free["s1"][0] == 1 and view.free["s2"][0] == 1
    assert "w" not in view.gpus
    assert {(c.kind, c.size) for c in view.share_mix} == {("share", 40), ("whole", 1)}
    assert {c.cpu_milli for c in view.share_mix} == {1000}  # the pods' CPU, on the grid


def test_a_share_goes_to_the_best_fitting_gpu_and_whole_nodes_are_refused(world):
    client, _ = world
    r = client.post("/filter", json=body(share_pod("q", 30), ["s1", "s2", "w"])).get_json()
    # s1's 40 GiB GPU leaves 10 after 30; s2's free GPU would leave 50.
    assert r["NodeNames"] == ["s1"]
    assert "does not share its GPUs" in r["FailedAndUnresolvableNodes"]["w"]


def test_a_pod_that_fits_the_total_but_no_single_gpu_waits_with_the_largest_piece(make_world):
    # Best fit puts p3's 20 on GPU 0 (40 free): 20 and 80 free. 90 fits neither.
    client, _ = make_world(share_pod("p3", 20, node="s1"))
    r = client.post("/filter", json=body(share_pod("big", 90), ["s1"])).get_json()
    assert r["NodeNames"] == []
    reason = r["FailedAndUnresolvableNodes"]["s1"]
    assert "no GPU here has 90 GiB (the largest has 80 GiB)" in reason
    r = client.post("/filter", json=body(share_pod("q", 85 - 5), ["s1"])).get_json()
    assert r["NodeNames"] == ["s1"]
    r = client.post("/filter", json=body(share_pod("q", 81 - 1, 30), ["s1"])).get_json()
    reason = r["FailedNodes"]["s1"]
    assert "the shares 80+30 GiB fit no set of its GPUs, one GPU each" in reason
    assert "free: 20, 80 GiB" in reason
    r = client.post("/filter", json=body(share_pod("q", 50, 50), ["s1"])).get_json()
    assert "free: 20, 80 GiB" in r["FailedNodes"]["s1"]


def test_the_node_report_says_where_a_pod_went(make_world):
    # The kubelet put p1 on GPU 1, not where the fit replay would have put it.
    report = {"GPU-s1-1": {"uid-default-p1": 40}, "GPU-s1-0": {"uid-default-gone": 80}}
    _, cache = make_world(s1_report=report)
    gpus = cache.view().gpus["s1"]
    # default/gone is not bound: ignored; p1 is on GPU 1.
    assert [(g.free, g.whole_free) for g in gpus] == [(80, True), (40, False)]


def test_an_older_agents_report_by_name_is_not_read_but_recomputed(make_world):
    """Upgrade: an agent not yet upgraded names pods namespace/name. Matched by name,
    a recreated pod would inherit the old one's GPU: the report is refused whole and
    every bound pod fitted by the rule."""
    report = {"GPU-s1-1": {"default/p1": 40}}
    assert sharing.read_report(json.dumps(report)) is None
    _, cache = make_world(s1_report=report)
    assert [(g.free, g.whole_free) for g in cache.view().gpus["s1"]] == [(40, False), (80, True)]


def test_a_whole_gpu_pod_never_takes_a_partly_used_gpu(make_world):
    # p4 fills GPU 0's 40 free to 30; p5's 50 then goes to GPU 1: both partly used.
    client, _ = make_world(share_pod("p4", 10, node="s1"), share_pod("p5", 50, node="s1"))
    r = client.post("/filter", json=body(make_pod("whole", 1), ["s1", "s2"])).get_json()
    assert r["NodeNames"] == ["s2"]
    assert r["FailedNodes"]["s1"].startswith("0 of 2 GPUs free")


def test_multi_container_pods_place_each_container_on_one_gpu(world):
    client, _ = world
    # 40+70: s1 has 40 and 80 -> fits (70 on GPU 1, 40 on GPU 0); s2 has 0 and 80 -> no.
    r = client.post("/filter", json=body(share_pod("mc", 40, 70), ["s1", "s2"])).get_json()
    assert r["NodeNames"] == ["s1"]
    assert "s2" in r["FailedNodes"]


def test_a_refused_share_fails_every_node_with_its_reason(world):
    client, _ = world
    r = client.post("/filter", json=body(share_pod("bad", "16Gi"), ["s1"])).get_json()
    assert "write 16, not 16Gi" in r["FailedAndUnresolvableNodes"]["s1"]


# --- the vector placement and the measure --------------------------------------------

_gpu = st.tuples(st.integers(1, 80), st.integers(0, 80), st.booleans())


def _rows(draw_nodes):
    gpus = []
    for node in draw_nodes:
        row = []
        for i, (cap, used, whole) in enumerate(node):
            used = min(used, cap)
            free = 0 if whole and used else cap - used
            row.append(sharing.Gpu(f"g{i}", cap, free, free == cap))
        gpus.append(row)
    width = max(len(r) for r in gpus)
    free = np.full((len(gpus), width), -1)
    cap = np.zeros((len(gpus), width), dtype=np.int64)
    for i, row in enumerate(gpus):
        for j, g in enumerate(row):
            free[i, j], cap[i, j] = g.free, g.capacity
    return gpus, free, cap


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(_gpu, min_size=1, max_size=8), min_size=1, max_size=6),
    st.lists(st.integers(1, 80), min_size=1, max_size=3),
    st.integers(0, 2),
)
def test_the_vector_placement_is_the_fit_rule(nodes, shares, whole):
    gpus, free, cap = _rows(nodes)
    after, ok, _ = place(free, cap, shares, whole)
    for i, row in enumerate(gpus):
        placement = sharing.fit(row, shares, whole)
        assert ok[i] == (placement is not None)
        if placement is not None:
            expect = sharing.after(row, placement, shares)
            assert [g.free for g in expect] == list(after[i, : len(row)])


ROOMY = np.array([1 << 40, 1 << 40])  # CPU or memory no class runs short of


def fgd_gain(free, cap, mix, shares, cpu=ROOMY, ram=ROOMY, ask=(0, 0)):
    free, cap = np.array(free), np.array(cap)
    after = place(free, cap, shares)[0]
    unit = float(np.median(cap[cap > 0]))
    before = share_fragments(free, cap, mix, cpu, ram, unit)
    return before - share_fragments(after, cap, mix, cpu - ask[0], ram - ask[1], unit)


def test_fgd_prefers_the_placement_that_leaves_usable_pieces():
    # Mix: half the pods ask 40 GiB, half a whole GPU. Node A: GPUs with 40 and 80
    # free; node B: 80 and 80. A 40 GiB pod on A fills the 40 (nothing left to
    # fragment); on B it breaks a whole GPU, which the whole-GPU class then cannot use.
    mix = (ShareClass("share", 40, 0, 0, 0.5), ShareClass("whole", 1, 0, 0, 0.5))
    gain = fgd_gain([[40, 80], [80, 80]], [[80, 80], [80, 80]], mix, [40])
    assert gain[0] > gain[1]


def test_fgd_breaks_the_largest_gpu_when_a_share_must_break_one():
    # 13 GiB on a free 16 GiB GPU leaves 3 that no common share fits; on a free 32 GiB
    # GPU it leaves 19, where the next 13 still fits. The whole-GPU class loses one
    # GPU either way (counted by what was left on it, the 32 looked worse), and still
    # has the other GPU of each node.
    mix = (
        ShareClass("share", 13, 0, 0, 0.3),
        ShareClass("share", 8, 0, 0, 0.3),
        ShareClass("whole", 1, 0, 0, 0.4),
    )
    gain = fgd_gain([[16, 16], [32, 32]], [[16, 16], [32, 32]], mix, [13])
    assert gain[1] > gain[0]


def test_fgd_sees_a_class_the_cpu_left_beside_the_gpus_cannot_run():
    # Two nodes alike but for their free CPU: on A the pod leaves 2 cores, and the
    # common class asks 4: A's free GPU memory is then a fragment for it.
    mix = (ShareClass("share", 4, 4000, 0, 0.8), ShareClass("share", 8, 1000, 0, 0.2))
    gain = fgd_gain(
        [[16, 16], [16, 16]], [[16, 16], [16, 16]], mix, [4],
        cpu=np.array([6000, 64000]), ask=(4000, 0),
    )  # fmt: skip
    assert gain[1] > gain[0]
    alike = fgd_gain([[16, 16], [16, 16]], [[16, 16], [16, 16]], mix, [4])
    assert alike[0] == alike[1]


def test_the_explanation_names_the_gpu(world):
    from extender.explain import decision, explain
    from extender.model import pod_facts
    from extender.policies.gpu import share_gpu

    _, cache = world
    view = cache.view()
    pod = pod_facts(share_pod("q", 30))
    assert share_gpu(pod, view.nodes["s1"], view) == "GPU-s1-0"  # the 40 GiB one
    assert share_gpu(pod, view.nodes["w"], view) is None

    d = decision(
        "default", "q", "u", 0, ["s1", "s2"], [9, 3], {"gpu": [10.0, 2.0]}, {"gpu": 5},
        shares=(30,), gpu=lambda i: share_gpu(pod, view.nodes[["s1", "s2"][i]], view),
    )  # fmt: skip
    assert explain(d, "s1").startswith("a 30 GiB share of GPU-s1-0 on s1: extender score 9/10")


def test_an_update_keeps_a_pods_place_in_the_fit_order():
    # Fitted in the order counted: a(20), b(20) on GPU 0, then c(50) on GPU 1. A status
    # update of b (the watch's MODIFIED) must not move it behind c: fitted a, c, b,
    # c would take GPU 0 and b GPU 1, which is not where the kubelet put them.
    pods = [share_pod(n, u, node="s3") for n, u in (("a", 20), ("b", 20), ("c", 50))]
    cache = synced_cache([shared_node("s3")], pods, clock=lambda: 1_800_000_000.0)
    try:
        assert [g.free for g in cache.view().gpus["s3"]] == [40, 30]
        updated = share_pod("b", 20, node="s3")
        updated["metadata"]["resourceVersion"] = "7"
        cache.pod_event("MODIFIED", updated)
        assert [g.free for g in cache.view().gpus["s3"]] == [40, 30]
    finally:
        cache.stop()


def test_shares_count_in_product_demand_as_their_part_of_a_gpu():
    """A pod restricted to a product asks of it what it asks, whole GPUs or a share
    (its units over the units of one GPU of its node), and takes back what it added
    when it goes, however the node changed meanwhile."""
    from extender.cache import ClusterCache

    t4 = shared_node("t4", gpus=2, gib=16)
    t4["metadata"]["labels"][contract.LABEL_GPU_PRODUCT] = "T4"
    g2 = shared_node("g2", gpus=8, gib=16)
    g2["metadata"]["labels"][contract.LABEL_GPU_PRODUCT] = "G2"
    cache = ClusterCache()
    cache.replace_nodes([t4, g2])
    restricted = share_pod("r", 12, node="t4")
    restricted["metadata"]["annotations"] = {contract.ANN_GPU_PRODUCTS: "T4"}
    cache.pod_event("ADDED", restricted)
    cache.pod_event("ADDED", share_pod("u", 4, node="g2"))
    pressure = cache.view().pressure
    # 0.75 of a GPU restricted to T4 out of 1.0 GPU asked; T4 holds 2 of 10 GPUs
    assert pressure["T4"] == pytest.approx(0.75 / (2 / 10))
    assert pressure["G2"] == 0
    t4["metadata"]["labels"][contract.LABEL_GPU_MEMORY] = str(32 * 1024)  # relabelled
    cache.node_event("MODIFIED", t4)
    cache.pod_event("DELETED", restricted)
    assert cache.view().pressure["T4"] == 0
    cache.pod_event("DELETED", share_pod("u", 4, node="g2"))
    assert dict(cache.view().pressure) == {}


def test_an_unrestricted_share_is_steered_off_the_product_restricted_pods_need(world):
    from extender.config import ExtenderConfig
    from extender.engine import score_array
    from extender.model import node_facts, pod_facts
    from extender.policies import build_policies

    _, cache = world
    view = cache.view()
    other = shared_node("s3")
    other["metadata"]["labels"][contract.LABEL_GPU_PRODUCT] = "OTHER"
    nodes = [view.nodes["s2"], node_facts(other)]
    cfg = ExtenderConfig(weights={"scarcity": 10, "gpu": 0, "fragmentation": 0, "spot": 0})
    pod = pod_facts(share_pod("x", 10))
    view.pressure = {"NVIDIA-H100": 0.9, "OTHER": 0.0}
    scores = score_array(pod, nodes, view, build_policies(cfg), cfg, names=["s2", "s3"])
    assert scores[1] > scores[0]


@pytest.mark.parametrize("with_shares", [True, False])
def test_a_whole_gpu_pod_leaves_the_large_gpus_to_the_shares(with_shares):
    from extender.config import ExtenderConfig
    from extender.engine import score_array
    from extender.model import pod_facts
    from extender.policies import build_policies

    nodes = [shared_node("small", gpus=4, gib=16), shared_node("large", gpus=4, gib=32)]
    pods = [
        make_pod("w", 1, node="small", phase="Running"),
        make_pod("v", 1, node="large", phase="Running"),
    ]
    if with_shares:
        pods += [share_pod("s", 8, node="small"), share_pod("t", 8, node="large")]
    cache = synced_cache(nodes, pods)
    try:
        view = cache.view()
        cfg = ExtenderConfig(weights={"fragmentation": 10, "gpu": 0, "spot": 0, "scarcity": 0})
        facts = [view.nodes["small"], view.nodes["large"]]
        scores = score_array(
            pod_facts(make_pod("x", 1)), facts, view, build_policies(cfg), cfg,
            names=["small", "large"],
        )  # fmt: skip
        # the two nodes are alike for the whole-GPU mix; only the shares tell them apart
        assert (scores[0] > scores[1]) if with_shares else (scores[0] == scores[1]), scores
    finally:
        cache.stop()


def test_a_share_pods_binding_reaches_the_explainer_as_a_whole_gpu_pods_does():
    from extender.cache import ClusterCache

    seen: list[tuple[str, str]] = []
    cache = ClusterCache(on_bound=lambda uid, node: seen.append((uid, node)))
    cache.replace_nodes([shared_node("s3")])
    cache.replace_pods([])
    cache.pod_event("ADDED", share_pod("pending", 20))  # not bound: nothing
    cache.pod_event("MODIFIED", share_pod("pending", 20, node="s3"))
    cache.pod_event("ADDED", make_pod("cpu-only", 0, node="s3"))  # no GPU: nothing
    assert [node for _, node in seen] == ["s3"]


def test_a_share_with_one_node_left_is_explained_with_its_gpu(make_world):
    """kube-scheduler's own filters left one sharing node (a taint only shares
    tolerate, say): the filter does not pick, kube-scheduler binds without scoring,
    and the Event still says which GPU the share went to."""
    from extender.app import create_app
    from extender.explain import explain

    class Decisions:  # an explicit fake of the Explainer: what filter hands it
        def __init__(self) -> None:
            self.seen: list = []

        def remember(self, decision) -> None:
            self.seen.append(decision)

    _, cache = make_world()
    decisions = Decisions()
    remembered = decisions.seen
    client = create_app(cache=cache, explainer=decisions).test_client()
    pod = share_pod("q", 30)
    body = {"Pod": pod, "Nodes": None, "NodeNames": ["s1"]}
    assert client.post("/filter", json=body).get_json()["NodeNames"] == ["s1"]
    (d,) = remembered
    assert explain(d, "s1").startswith("a 30 GiB share of GPU-s1-0 on s1: ")


def test_a_share_counted_before_its_node_is_known_is_recounted_when_the_node_comes():
    """Pods and Nodes arrive in either order: a share counted while its node was unknown
    asks a whole GPU, and asks its units over the node's GPU's once the node is known."""
    from extender.cache import ClusterCache

    t4 = shared_node("t4", gpus=2, gib=16)
    t4["metadata"]["labels"][contract.LABEL_GPU_PRODUCT] = "T4"
    g2 = shared_node("g2", gpus=8, gib=16)
    g2["metadata"]["labels"][contract.LABEL_GPU_PRODUCT] = "G2"
    cache = ClusterCache()
    cache.replace_nodes([g2])
    restricted = share_pod("r", 12, node="t4")
    restricted["metadata"]["annotations"] = {contract.ANN_GPU_PRODUCTS: "T4"}
    cache.pod_event("ADDED", restricted)
    cache.pod_event("ADDED", share_pod("u", 4, node="g2"))
    cache.node_event("ADDED", t4)
    # as in the test above: 0.75 of a GPU restricted to T4 of 1.0 asked, not 1 of 1.25
    assert cache.view().pressure["T4"] == pytest.approx(0.75 / (2 / 10))
    cache.pod_event("DELETED", restricted)
    cache.pod_event("DELETED", share_pod("u", 4, node="g2"))
    assert dict(cache.view().pressure) == {} and cache._demand_total == pytest.approx(0)
