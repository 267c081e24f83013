"""The fragmentation policy (FGD adapted to whole GPUs, CPU and memory) and the
workload mix it plans for."""

from __future__ import annotations

import random

import pytest

from extender.cache import ClusterCache
from extender.columns import free_state
from extender.engine import candidates_of
from extender.model import NodeFacts, PodFacts
from extender.policies.fragmentation import FragmentationPolicy
from extender.view import View
from extender.workload import (
    MAX_SHAPES,
    MixEntry,
    ShapeCounts,
    TaskShape,
    task_shape,
    workload_mix,
)
from gpu_scheduler import contract
from tests.factories import make_node, make_pod

ANY_1 = TaskShape(1, 4000, 8192, None)
ANY_8 = TaskShape(8, 32000, 65536, None)


def view(nodes, used=None, cpu=None, ram=None, mix=()):
    used, cpu, ram = used or {}, cpu or {}, ram or {}
    return View(
        nodes={n.name: n for n in nodes},
        used=used,
        free={
            n.name: free_state(n, used.get(n.name, 0), cpu.get(n.name, 0), ram.get(n.name, 0))
            for n in nodes
        },
        mix=tuple(mix),
    )


def node(name, gpus=8, model="G2", cpu=96000, ram=393216):
    return NodeFacts(name, gpus, labelled_gpu=True, product=model, cpu_milli=cpu, ram_mib=ram)


def pod(gpus=1, cpu=4000, ram=8192):
    return PodFacts("default", "p", gpus, cpu_milli=cpu, ram_mib=ram)


def scores(nodes, v, p=None):
    policy = FragmentationPolicy()
    state = policy.pre_score(p or pod(), v)
    assert state is not None
    return policy.score_all(state, candidates_of([n.name for n in nodes], nodes, v), v).tolist()


def test_shapes_round_up_to_a_coarse_grid():
    assert task_shape(1, 3152, 810, None) == TaskShape(1, 4000, 4096, None)
    assert task_shape(8, 120000, 737280, ("G2",)) == TaskShape(8, 120000, 737280, ("G2",))
    assert task_shape(2, 16001, 65537, None) == TaskShape(2, 20000, 81920, None)
    assert task_shape(1, 0, 0, None) == TaskShape(1, 0, 0, None)


def test_the_mix_weighs_unrestricted_shapes_by_the_gpus_they_ask_for():
    # 60 one-GPU pods ask for 60 GPUs, 38 eight-GPU pods for 304: multi-GPU pods ask
    # for over half the GPUs, so shapes weigh their GPUs: the 8-GPU shape weighs most;
    # the 2-GPU shape (4 of 368 GPUs asked) falls outside 95%.
    counts = {ANY_1: 60, ANY_8: 38, TaskShape(2, 1000, 4096, None): 2}
    mix = workload_mix(counts)
    assert [e.shape for e in mix] == [ANY_8, ANY_1]
    assert sum(e.share for e in mix) == pytest.approx(1.0)
    assert mix[0].share == pytest.approx(304 / 364)
    many = {TaskShape(1, 1000 * i, 4096, None): 1 for i in range(1, 200)}
    assert len(workload_mix(many)) == MAX_SHAPES
    assert workload_mix({}) == ()


def test_where_multi_gpu_pods_ask_for_little_the_mix_is_nearly_by_pods():
    # 8 of 101 GPUs asked by multi-GPU pods: GPUs count to the power 2 x 8/101 (the
    # weights before the mix keeps 95% of them: the 8-GPU shape is not kept)
    from extender.workload import _weights

    weights = _weights({ANY_1: 93, ANY_8: 1})
    grown = 8 ** (2 * 8 / 101)
    assert weights[ANY_8] == pytest.approx(grown / (93 + grown))
    assert weights[ANY_8] < 0.02  # by GPUs it would be 8/101
    assert [e.shape for e in workload_mix({ANY_1: 93, ANY_8: 1})] == [ANY_1]


def test_restricted_shapes_keep_their_share_of_the_pods():
    # 20 of 100 pods can run only on T4: their shape keeps 20% of the weight however
    # many GPUs the unrestricted pods ask for; the unrestricted 80% split by GPUs
    # (multi-GPU pods ask for 160 of 240 GPUs: 60 one-GPU pods, 20 eight-GPU pods).
    t4 = TaskShape(1, 4000, 8192, ("T4",))
    mix = dict(workload_mix({ANY_1: 60, ANY_8: 20, t4: 20}))
    assert mix[t4] == pytest.approx(0.2)
    assert mix[ANY_8] == pytest.approx(0.8 * 160 / 220)
    assert mix[ANY_1] == pytest.approx(0.8 * 60 / 220)
    # Only restricted pods: their counts alone.
    only = dict(workload_mix({t4: 3, TaskShape(2, 4000, 8192, ("A100",)): 1}))
    assert only[t4] == pytest.approx(0.75)


def test_ties_are_ordered_the_same_way_every_time():
    a, b = TaskShape(1, 4000, 8192, ("T4",)), TaskShape(1, 4000, 8192, ("L4",))
    assert [e.shape for e in workload_mix({a: 5, b: 5})] == [b, a]
    assert [e.shape for e in workload_mix({b: 5, a: 5})] == [b, a]


#: Ten shapes whose weights (0.2, 0.2, 0.1 x 4, 0.05 x 4) reach COVERAGE exactly at
#: the ninth: whether a sum of them reaches 0.95 depends on its last bits.
AT_THE_EDGE = {
    TaskShape(4, 2000, 4096, None): 1, TaskShape(4, 12000, 114688, None): 1,
    TaskShape(2, 1000, 65536, None): 1, TaskShape(2, 20000, 114688, None): 1,
    TaskShape(4, 1000, 4096, ("NVIDIA-L40S",)): 1,
    TaskShape(4, 1000, 65536, ("NVIDIA-A100-SXM4-40GB",)): 1,
    TaskShape(1, 2000, 4096, None): 1, TaskShape(1, 2000, 16384, None): 1,
    TaskShape(1, 8000, 65536, None): 1, TaskShape(1, 12000, 16384, None): 1,
}  # fmt: skip


def test_the_mix_is_the_same_in_whatever_order_the_shapes_were_counted():
    """The plugins count shapes in a Go map, whose order is random: the mix must not
    depend on the order its float sums are taken in (plugins/pkg/workload,
    TestTheMixIsTheSameWhateverTheMapsOrder)."""
    first = workload_mix(AT_THE_EDGE)
    assert len(first) == 9
    shapes = list(AT_THE_EDGE)
    for seed in range(200):
        random.Random(seed).shuffle(shapes)
        again = workload_mix({shape: AT_THE_EDGE[shape] for shape in shapes})
        assert [e.shape for e in again] == [e.shape for e in first], seed


def test_the_mix_is_worked_out_again_after_one_percent_of_the_pods_or_a_new_shape():
    counts = ShapeCounts()
    for _ in range(150):
        counts.add(ANY_1, 1)
    for _ in range(50):
        counts.add(ANY_8, 1)
    first = counts.mix()
    assert first == workload_mix({ANY_1: 150, ANY_8: 50})
    counts.add(ANY_1, 1)  # one pod of 200 bound: the same mix, the same object
    assert counts.mix() is first
    counts.add(ANY_8, -1)  # two moved, of 200: 1%, worked out again
    assert counts.mix() is not first
    assert counts.mix() == workload_mix({ANY_1: 151, ANY_8: 49})
    again = counts.mix()
    t4 = TaskShape(1, 4000, 8192, ("T4",))
    counts.add(t4, 1)  # a shape never seen: at once
    assert counts.mix() is not again
    assert counts.mix() == workload_mix({ANY_1: 151, ANY_8: 49, t4: 1})
    latest = counts.mix()
    counts.add(t4, -1)  # and gone: at once
    assert counts.mix() is not latest
    assert counts.mix() == workload_mix({ANY_1: 151, ANY_8: 49})
    empty = ShapeCounts()
    assert empty.mix() == ()
    empty.add(ANY_1, 1)
    assert empty.mix() == workload_mix({ANY_1: 1})


def test_a_one_gpu_pod_goes_where_it_strands_nothing():
    # Half the pods take 1 GPU, half take 8: an empty node must stay whole.
    mix = [MixEntry(ANY_1, 0.5), MixEntry(ANY_8, 0.5)]
    empty, partial = node("empty"), node("partial")
    v = view([empty, partial], used={"partial": 6}, mix=mix)
    s_empty, s_partial = scores([empty, partial], v)
    # empty: 0 fragmented before, 7 free GPUs no 8-GPU pod can use after: -3.5
    assert s_empty == pytest.approx(-3.5)
    # partial: 2 free (fragmented for the 8-GPU half: 1.0) -> 1 free (0.5): +0.5
    assert s_partial == pytest.approx(0.5)


def test_cpu_beside_the_gpus_counts():
    # Two nodes with 2 free GPUs; on one, the pod would take the CPU that the common
    # 1-GPU pods need beside the last free GPU.
    mix = [MixEntry(TaskShape(1, 8000, 8192, None), 1.0)]
    roomy, tight = node("roomy"), node("tight")
    v = view(
        [roomy, tight],
        used={"roomy": 6, "tight": 6},
        cpu={"roomy": 0, "tight": 96000 - 16000},  # 16 cores left on tight
        mix=mix,
    )
    s_roomy, s_tight = scores([roomy, tight], v, pod(1, cpu=12000))
    assert s_roomy == pytest.approx(0.0)  # 1 GPU and plenty of CPU left: still usable
    assert s_tight == pytest.approx(-1.0)  # 1 GPU left with 4 cores: fragmented
    assert s_roomy > s_tight


def test_products_restricted_demand_keeps_a_scarce_model_free():
    # 60% of the pods can only run on T4: an unrestricted pod should use the V100.
    mix = [MixEntry(TaskShape(1, 1000, 4096, ("T4",)), 0.6), MixEntry(ANY_1, 0.4)]
    t4, v100 = node("t4", 2, "T4"), node("v100", 2, "V100M16")
    s_t4, s_v100 = scores([t4, v100], view([t4, v100], mix=mix), pod(1, 1000, 4096))
    assert s_t4 == pytest.approx(0.0)
    assert s_v100 == pytest.approx(0.6)  # 2 x 0.6 fragmented before, 1 x 0.6 after


def test_unknown_cpu_and_memory_do_not_limit():
    mix = [MixEntry(TaskShape(1, 8000, 8192, None), 1.0)]
    unknown = NodeFacts("u", 8, labelled_gpu=True, product="G2")
    (score,) = scores([unknown], view([unknown], mix=mix), pod(1, cpu=10**9, ram=10**9))
    assert score == pytest.approx(0.0)


def test_it_abstains_without_gpus_or_mix():
    policy = FragmentationPolicy()
    mix = (MixEntry(ANY_1, 1.0),)
    assert policy.pre_score(pod(0), view([], mix=mix)) is None
    assert policy.pre_score(pod(), view([])) is None  # nothing bound yet: no mix


def test_the_cache_keeps_cpu_memory_and_the_mix_of_bound_gpu_pods():
    cache = ClusterCache()
    cache.replace_nodes([make_node("a", 8, product="G2"), make_node("b", 8, product="T4")])
    restricted = {contract.ANN_GPU_PRODUCTS: "T4"}
    cache.pod_event("ADDED", make_pod("p1", 1, node="a", phase="Running"))
    cache.pod_event("ADDED", make_pod("p2", 1, node="a", phase="Running"))
    cache.pod_event("ADDED", make_pod("p3", 2, node="b", phase="Running", annotations=restricted))
    cache.pod_event("ADDED", make_pod("cpu", 0, node="b", phase="Running"))
    v = cache.view()
    assert v.nodes["a"].cpu_milli == 32000 and v.nodes["a"].ram_mib == 262144
    # Free: allocatable less what the GPU pods ask (the CPU pod is not a GPU pod).
    assert dict(v.free) == {
        "a": (6, 30000, 262144 - 2048, "G2"),
        "b": (6, 31000, 262144 - 1024, "T4"),
    }
    assert [(e.shape, round(e.share, 3)) for e in v.mix] == [
        (TaskShape(1, 1000, 4096, None), 0.667),
        (TaskShape(2, 1000, 4096, ("T4",)), 0.333),
    ]
    cache.pod_event("DELETED", make_pod("p3", 2, node="b"))
    v = cache.view()
    assert v.free["b"] == (8, 32000, 262144, "T4") and len(v.mix) == 1
    # A relist gives the same totals as the events did.
    cache.replace_pods(
        [make_pod("p1", 1, node="a", phase="Running"), make_pod("p2", 1, node="a", phase="Running")]
    )
    again = cache.view()
    assert dict(again.free) == dict(v.free) and again.mix == v.mix


def test_the_registry_and_the_default_weights_include_it():
    from extender.config import DEFAULT_WEIGHTS
    from extender.policies import REGISTRY

    assert "fragmentation" in REGISTRY
    assert DEFAULT_WEIGHTS.get("fragmentation", 0) > 0


def test_one_policy_scoring_call_after_call_matches_a_fresh_one_as_models_are_added():
    """The evaluator is kept for the view's mix and model codes; a new product in the
    (append-only) codes, or a new mix, must not be scored with the old one."""
    from extender.columns import Codes

    restricted = TaskShape(1, 4000, 8192, ("G3",))
    mix = tuple(workload_mix({ANY_1: 5, restricted: 5}))
    kept = FragmentationPolicy()
    models = Codes()
    models.code("G2")
    g2 = [node("a", model="G2"), node("b", gpus=4, model="G2")]
    with_g3 = [*g2, node("c", model="G3")]
    for nodes in (g2, with_g3, with_g3):
        v = view(nodes, used={"a": 7}, mix=mix)
        batch = candidates_of([n.name for n in nodes], nodes, v)
        for n in nodes:  # one Codes across calls, as a cache's table keeps it
            models.code(n.model)
        batch.models = models
        state = kept.pre_score(pod(), v)
        assert kept.score_all(state, batch, v).tolist() == scores(nodes, v)
    other = tuple(workload_mix({ANY_8: 1}))
    v = view(g2, used={"a": 7}, mix=other)
    batch = candidates_of(["a", "b"], g2, v)
    batch.models = models
    assert kept.score_all(kept.pre_score(pod(), v), batch, v).tolist() == scores(g2, v)


@pytest.mark.parametrize("span", [1, 144, 5000, (1 << 20) + 5])
def test_distinct_states_by_flags_or_by_sort_give_back_every_key(span):
    import numpy as np

    from extender.policies.fragmentation import DENSE_KEYS, _distinct

    key = np.random.default_rng(span).integers(0, span, 10_000)
    first, inverse = _distinct(key)
    assert (key[first][inverse] == key).all()
    assert len(first) == len(np.unique(key)) == len(set(key[first].tolist()))
    assert (span > DENSE_KEYS) == (int(key.max()) + 1 > DENSE_KEYS)


def test_large_calls_evaluate_distinct_states_once_and_score_as_small_ones(monkeypatch):
    """Above DIRECT (state, shape) pairs the states are made distinct first: the
    scores must be those of evaluating every node."""
    from extender.policies import fragmentation

    mix = tuple(workload_mix({ANY_1: 5, ANY_8: 3, TaskShape(2, 8000, 16384, ("G3",)): 2}))
    nodes = [
        node(f"n{i}", gpus=(8, 4, 2)[i % 3], model=("G2", "G3")[i % 2], cpu=16000 * (1 + i % 6))
        for i in range(300)
    ]
    v = view(nodes, used={f"n{i}": i % 5 for i in range(300)}, mix=mix)
    small = scores(nodes, v, pod(gpus=2))
    monkeypatch.setattr(fragmentation, "DIRECT", 0)  # every call takes the distinct path
    assert scores(nodes, v, pod(gpus=2)) == small
    monkeypatch.setattr(fragmentation, "DENSE_KEYS", 0)  # and by sorting
    assert scores(nodes, v, pod(gpus=2)) == small


def test_the_mixs_table_gives_what_evaluating_every_shape_gives(monkeypatch):
    """A call whose shapes x states exceed the table's cells reads a table built once
    for the mix; every later call on the mix reads it too. The shares are added in
    another order, so the values agree to rounding, and the integer scores match."""
    import numpy as np

    from extender.columns import Codes
    from extender.policies import fragmentation

    rng = np.random.default_rng(7)
    codes = Codes()
    for model in ("G1", "G2", "G3", "T4"):
        codes.code(model)
    mix = workload_mix(
        {
            TaskShape(
                int(rng.choice([1, 1, 2, 4, 8])),
                int(rng.integers(1, 30)) * 1000,
                int(rng.integers(1, 40)) * 4096,
                (str(rng.choice(["G1", "G3", "T4"])),) if i % 3 == 0 else None,
            ): int(rng.integers(1, 50))
            for i in range(120)
        }
    )
    n = 3000
    before = (
        rng.integers(-1, 9, n),
        rng.integers(0, 96000, n),
        rng.integers(0, 400000, n),
        rng.integers(0, len(codes.values), n),
    )
    after = (before[0] - 2, before[1] - 8000, before[2] - 16384, before[3])
    direct = fragmentation._Fragmentation(mix, codes)
    monkeypatch.setattr(fragmentation, "TABLE_CELLS", 0)  # never a table
    expected = direct(before, after)
    assert direct._table is None
    monkeypatch.setattr(fragmentation, "TABLE_CELLS", 1 << 20)
    tabled = fragmentation._Fragmentation(mix, codes)
    assert tabled.cells < 2 * n * len(mix) <= 1 << 20
    got = tabled(before, after)
    assert tabled._table is not None  # built by this large call
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)
    # a small call on the same mix reads the table too
    small = tuple(part[:5] for part in before), tuple(part[:5] for part in after)
    np.testing.assert_allclose(tabled(*small), direct(*small), rtol=0, atol=1e-9)


def test_a_small_mixs_table_is_built_by_its_first_call_however_small(monkeypatch):
    """A table of at most SMALL_TABLE cells is built by the first call on the mix (a
    few candidates), and gives what comparing with every shape gives."""
    import numpy as np

    from extender.columns import Codes
    from extender.policies import fragmentation

    codes = Codes()
    for model in ("G1", "G2"):
        codes.code(model)
    mix = workload_mix({ANY_1: 5, ANY_8: 3, TaskShape(2, 8000, 16384, ("G2",)): 2})
    before = (np.array([8, 3, 0, 5]), np.array([64000, 4000, 0, 9000]))
    before += (np.array([262144, 8192, 0, 20000]), np.array([1, 2, 1, 2]))
    after = (before[0] - 2, before[1] - 8000, before[2] - 16384, before[3])
    tabled = fragmentation._Fragmentation(mix, codes)
    assert tabled.cells <= fragmentation.SMALL_TABLE
    got = tabled(before, after)
    assert tabled._table is not None
    monkeypatch.setattr(fragmentation, "TABLE_CELLS", 0)  # never a table
    direct = fragmentation._Fragmentation(mix, codes)
    np.testing.assert_allclose(got, direct(before, after), rtol=0, atol=1e-9)
    assert direct._table is None
