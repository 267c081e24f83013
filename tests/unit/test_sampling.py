"""Sample mode's protocol (tests/bench/sampling.py): infeasible tasks set apart, draws
with replacement up to a share of the GPUs, allocation at arrival levels, and the
whole-GPU fragmentation measure; on the real openb files where it matters."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.bench.sampling import (
    NodeState,
    SampleResult,
    draw,
    feasible,
    fragmentation,
    node_types,
    split_feasible,
    task_classes,
)
from tests.bench.trace import Task, TraceNode, load_nodes, load_tasks


def task(name="t", gpus=1, cpu=1000, mem=1024, models=()):
    return Task(name, cpu, mem, gpus, tuple(models), 0, None)


@pytest.fixture
def openb(openb_trace):
    nodes = load_nodes(openb_trace / "openb_node_list_all_node.csv")
    return nodes, {t.name: t for t in load_tasks(openb_trace / "openb_pod_list_gpuspec20.csv")}


def test_the_120_core_8_gpu_task_fits_g3_but_not_g2(openb):
    nodes, tasks = openb
    types = node_types(nodes)
    big = tasks["openb-pod-1639"]
    assert (big.gpus, big.cpu_milli, big.memory_mib, big.models) == (8, 120000, 737280, ())
    assert feasible(big, types)  # a G3 node: 128 cores, 768 GiB, 8 GPUs
    assert not feasible(replace(big, models=("G2",)), types)  # every G2 node has 96 cores
    assert feasible(replace(big, models=("G3",)), types)


def test_every_task_of_the_shipped_files_is_feasible(openb_trace):
    nodes = load_nodes(openb_trace / "openb_node_list_all_node.csv")
    for name in ("default", "gpuspec20", "multigpu20"):
        tasks = load_tasks(openb_trace / f"openb_pod_list_{name}.csv")
        ok, apart = split_feasible(tasks, nodes)
        assert apart == [] and len(ok) == len(tasks), name


def test_cpu_only_tasks_need_a_node_without_gpus():
    gpu_node = TraceNode("g", 96000, 393216, 8, "G2")
    cpu_node = TraceNode("c", 8000, 32768, 0, "")
    ok, apart = split_feasible(
        [task("small-cpu", 0, 4000), task("big-cpu", 0, 64000), task("gpu", 1, 64000)],
        [gpu_node, cpu_node],
    )
    assert [t.name for t in ok] == ["small-cpu", "gpu"]
    assert [t.name for t in apart] == ["big-cpu"]  # fits the GPU node, which is tainted


def test_draws_are_with_replacement_reproducible_and_stop_at_the_share():
    pool = [task("one", 1), task("eight", 8), task("cpu", 0)]
    first = draw(pool, capacity=100, share=1.3, seed=42)
    assert first == draw(pool, capacity=100, share=1.3, seed=42)
    assert first != draw(pool, capacity=100, share=1.3, seed=43)
    asked = [t.gpus for t in first]
    assert sum(asked) >= 130 and sum(asked[:-1]) < 130  # stops at the first draw over
    assert len({t.name for t in first}) == len(first)  # each draw its own pod
    assert {t.name.rsplit("-s", 1)[0] for t in first} == {"one", "eight", "cpu"}
    with pytest.raises(ValueError):
        draw([task("cpu", 0)], 10, 1.3, 1)


def test_allocation_at_arrival_levels_and_first_failure():
    result = SampleResult("x", 42, total_gpus=10)
    for gpus, model in ((4, "G2"), (4, "G2"), (4, None), (2, "T4")):
        result.record(task(gpus=gpus, models=("G2",) if gpus == 2 else ()), model)
    result.record(task(gpus=0), "cpu")  # a CPU task changes nothing
    assert result.curve == [(0.4, 0.4), (0.8, 0.8), (1.2, 0.8), (1.4, 1.0)]
    assert result.at_level(0.5) == 0.8 and result.at_level(1.0) == 0.8
    assert result.at_level(1.3) == 1.0 and result.at_level(1.5) is None
    assert result.first_failure == 0.8 and result.failed_by_size == {4: 1}
    assert result.constraint_violations == 1  # the 2-GPU task allowed G2 only landed on T4


def test_fragmentation_counts_free_gpus_each_class_cannot_use():
    classes = task_classes(
        [task(gpus=1, cpu=4000)] * 3 + [task(gpus=8, cpu=4000)] + [task(gpus=0)] * 5
    )
    assert classes == [((1, 4000, 1024, ()), 0.75), ((8, 4000, 1024, ()), 0.25)]
    whole = NodeState("G2", 8, 96000, 393216)  # every class fits: 0
    three = NodeState("G2", 3, 96000, 393216)  # the 8-GPU class cannot: 3 x 0.25
    starved = NodeState("G2", 2, 2000, 393216)  # no CPU for either class: 2 x 1
    full = NodeState("G2", 0, 0, 0)  # nothing free: nothing fragmented
    amount, share = fragmentation([whole, three, starved, full], classes)
    assert amount == pytest.approx(0.75 + 2.0)
    assert share == pytest.approx(2.75 / 13)
    restricted = task_classes([task(gpus=1, models=("T4",))])
    assert fragmentation([NodeState("G2", 4, 96000, 393216)], restricted) == (4.0, 1.0)
