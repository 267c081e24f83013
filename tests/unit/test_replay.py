"""Replay mode's schedule and bookkeeping (pure parts of the trace benchmark)."""

from __future__ import annotations

import math

import pytest

from tests.bench.replay import ReplayResult, percentile, replay_schedule, window_start
from tests.bench.trace import Task, load_tasks


def task(name, created, deleted, gpus=1, models=()):
    return Task(name, 1000, 1024, gpus, tuple(models), created, deleted)


def test_window_opens_at_the_quantile_and_earlier_tasks_arrive_at_once():
    tasks = [task(f"t{i}", i * 100, i * 100 + 50) for i in range(100)]
    assert window_start(tasks, 0.05) == 500
    arrivals = replay_schedule(tasks, compress=10, speedup=2, quantile=0.05)
    assert [a.at for a in arrivals[:6]] == [0, 0, 0, 0, 0, 0]
    # gaps shrink by compress x speedup, lifetimes by speedup only
    assert arrivals[6].at == pytest.approx(100 / 20)
    assert arrivals[6].runtime == pytest.approx(50 / 2)


def test_schedule_keeps_trace_order_and_an_open_ended_task_never_leaves():
    tasks = [task("b", 10, 20), task("a", 10, 30), task("c", 5, None)]
    arrivals = replay_schedule(tasks, compress=1, speedup=1, quantile=0)
    assert [a.task.name for a in arrivals] == ["c", "a", "b"]
    assert math.isinf(arrivals[0].runtime)
    with pytest.raises(ValueError):
        replay_schedule(tasks, compress=0, speedup=1)


def test_replay_bookkeeping_waits_failures_and_violations():
    r = ReplayResult("ours", total_gpus=16)
    eight, one, cpu, picky = (
        task("eight", 0, 9, gpus=8),
        task("one", 0, 9),
        task("cpu", 0, 9, gpus=0),
        task("picky", 0, 9, models=("T4",)),
    )
    for t in (eight, one, cpu, picky):
        r.arrive(t, 1.0)
    r.sample(1.0)
    assert r.demand == 10 and r.allocated == 0
    assert r.bound("eight", "G2", 3.0)
    assert not r.bound("eight", "G2", 3.5)  # a repeat starts no second runtime
    assert r.bound("picky", "P100", 2.0)  # placed off its models: a violation
    assert r.bound("cpu", None, 1.1)
    assert r.withdraw("one")
    assert not r.bound("one", "G2", 9.0)  # bound after it was given up: ignored
    r.sample(5.0)
    assert r.allocated == 9 and r.demand == 9
    assert r.failed_by_size == {1: 1} and r.gpu_failed == 1
    assert (r.gpu_pods, r.gpu_placed) == (3, 2)
    assert r.constraint_violations == 1
    assert r.waits == {8: [2.0], 1: [1.0]}
    assert r.depart("eight") and not r.depart("eight")
    assert r.departed == 1
    r.sample(9.0)
    assert r.allocated == 1
    # time-weighted: 0% for 4 s, 9/16 for 4 s
    assert r.mean_allocation() == pytest.approx((0 * 4 + 9 / 16 * 4) / 8)
    assert r.mean_allocation(until=5.0) == pytest.approx(0.0)
    assert r.peak_allocation == pytest.approx(9 / 16)
    assert r.wait_percentiles((2, 4, 8), 0.99) == 2.0
    assert r.wait_percentiles((2, 4), 0.5) is None


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 0.5) in (50, 51)
    assert percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100
    assert percentile([], 0.5) is None


def test_the_trace_alone_asks_for_about_one_percent_of_the_cluster(openb_trace):
    """Why replay compresses arrivals: at the trace's own times the tasks never hold more
    than ~71 of the 6,212 GPUs at once."""
    tasks = load_tasks(openb_trace / "openb_pod_list_default.csv")
    events = sorted(
        (t, g) for x in tasks if x.gpus for t, g in ((x.created, x.gpus), (x.deleted, -x.gpus))
    )
    held = peak = 0
    for _, g in events:
        held += g
        peak = max(peak, held)
    assert peak < 0.02 * 6212
