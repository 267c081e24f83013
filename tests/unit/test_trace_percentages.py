"""Sample mode's percentageOfNodesToScore variants (tests/bench/trace_replay.py): the
config builder sets the field where kube-scheduler reads it, the sample size follows
kube-scheduler's numFeasibleNodesToFind, and the extender's calls are read from its
log."""

from __future__ import annotations

import json

import pytest

from tests.bench.trace_replay import parse_percentages, variant_label
from tests.bench.trace_reports import _quantile, extender_call_stats, extender_calls
from tests.bench.trace_runners import (
    _LogTail,
    nodes_to_find,
    scheduler_configs,
    with_percentage,
)


def test_with_percentage_sets_it_on_every_profile_only():
    ours = scheduler_configs("http://127.0.0.1:1")["gpu-scheduler"]
    ours["profiles"].append({"schedulerName": "second"})
    out = with_percentage(ours, 100)
    # kubescheduler.config.k8s.io/v1 KubeSchedulerProfile.PercentageOfNodesToScore,
    # json "percentageOfNodesToScore": the profile's value overrides the top level
    assert [p["percentageOfNodesToScore"] for p in out["profiles"]] == [100, 100]
    # the top level untouched (deploy/ sets 0 there: the adaptive choice, written out)
    assert out["percentageOfNodesToScore"] == ours["percentageOfNodesToScore"] == 0
    assert out["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert out["extenders"] == ours["extenders"]
    assert out["profiles"][0]["pluginConfig"] == ours["profiles"][0]["pluginConfig"]
    assert out["profiles"][0]["schedulerName"] == "trace-gpu-scheduler"
    assert all("percentageOfNodesToScore" not in p for p in ours["profiles"])  # a copy


def test_with_percentage_none_is_the_adaptive_default():
    ours = scheduler_configs("http://127.0.0.1:1")["gpu-scheduler"]
    out = with_percentage(ours, None)
    assert out == ours and out is not ours
    assert all("percentageOfNodesToScore" not in p for p in out["profiles"])
    assert out["percentageOfNodesToScore"] == 0  # adaptive, as deploy/ says


@pytest.mark.parametrize("bad", [-1, 101])
def test_with_percentage_refuses_what_kube_scheduler_would(bad):
    with pytest.raises(ValueError):
        with_percentage(scheduler_configs("http://127.0.0.1:1")["gpu-scheduler"], bad)


@pytest.mark.parametrize(
    ("nodes", "percentage", "expected"),
    [
        (1523, None, 578),  # openb: 50 - 1523/125 = 38% -> 578
        (1523, 0, 578),  # 0 is the adaptive default too
        (1523, 50, 761),
        (1523, 100, 1523),
        (5000, None, 500),  # 10%
        (100_000, None, 5000),  # the 5% floor
        (150, None, 100),  # the 100-node floor
        (200, 10, 100),
        (99, 10, 99),  # below 100 nodes: all of them
    ],
)
def test_nodes_to_find_follows_kube_scheduler(nodes, percentage, expected):
    assert nodes_to_find(nodes, percentage) == expected


def test_parse_percentages():
    assert parse_percentages("default,50,100") == [None, 50, 100]
    assert parse_percentages(" 100 , default ") == [100, None]
    assert parse_percentages("") == [None]
    for bad in ("101", "-5", "half"):
        with pytest.raises(ValueError):
            parse_percentages(bad)


def test_variant_label():
    assert variant_label(None, None, 1) == "gpu-scheduler"
    assert variant_label(None, 50, 1) == "gpu-scheduler[pct=50]"  # set: named
    assert variant_label(None, None, 3) == "gpu-scheduler[pct=default]"
    assert variant_label(None, 50, 3) == "gpu-scheduler[pct=50]"
    assert variant_label("fgd", 100, 2) == "gpu-scheduler[fgd,pct=100]"
    assert variant_label("fgd", None, 1) == "gpu-scheduler[fgd]"


def access_line(verb: str, ms: float, nodes: int) -> str:
    return json.dumps({"level": "info", "msg": verb, "pod": "default/p", "nodes": nodes, "ms": ms})


def test_extender_calls_and_stats():
    lines = [
        "not json",
        "{broken",
        json.dumps({"msg": "bad extender call", "verb": "filter"}),
        *(access_line("filter", float(i), 500 + i) for i in range(1, 101)),
        access_line("prioritize", 2.0, 400),
        access_line("prioritize", 4.0, 600),
    ]
    calls = extender_calls(lines)
    assert len(calls) == 102
    stats = extender_call_stats(calls)
    assert stats["filter"]["calls"] == 100
    assert stats["filter"]["p50_ms"] == 50.5
    assert stats["filter"]["p99_ms"] == 99.0  # nearest rank
    assert (stats["filter"]["nodes_min"], stats["filter"]["nodes_max"]) == (501, 600)
    assert stats["prioritize"]["nodes_p50"] == 500
    assert extender_call_stats([]) == {}


def test_a_filter_told_on_its_prioritize_line_is_counted_as_a_filter_call():
    carried = json.dumps({"msg": "prioritize", "nodes": 230, "ms": 0.3, "filter_ms": 0.9})
    lines = [carried, access_line("filter", 1.5, 500)]
    assert extender_calls(lines) == [
        ("filter", 0.9, 230),
        ("prioritize", 0.3, 230),
        ("filter", 1.5, 500),
    ]


def test_quantile_nearest_rank():
    assert _quantile([3.0], 0.99) == 3.0
    assert _quantile([1.0, 2.0], 0.5) == 1.0
    assert _quantile([float(i) for i in range(1, 1001)], 0.99) == 990.0


def test_log_tail_reads_what_was_appended(tmp_path):
    log = tmp_path / "extender.log"
    log.write_text("before\n")
    tail = _LogTail(log)
    assert tail.read() == []
    with open(log, "a") as handle:
        handle.write("one\ntwo\n")
    assert tail.read() == ["one", "two"]
    assert tail.read() == []
    log.write_text("new\n")  # truncated and started again
    assert tail.read() == ["new"]
    assert _LogTail(tmp_path / "absent.log").read() == []


def test_view_lag_counts_prioritize_calls_whose_view_missed_bindings():
    import json

    from tests.bench.trace_reports import view_lag

    def line(msg, pod, view_pods):
        return json.dumps({"msg": msg, "pod": f"default/{pod}", "view_pods": view_pods})

    lines = [
        line("filter", "a", 0),
        line("prioritize", "a", 0),  # nothing bound yet: not behind
        line("prioritize", "b", 0),  # a was bound: one behind
        line("prioritize", "c", 2),
        line("prioritize", "x", 0),  # not this run's pod
        "not json",
    ]
    lag = view_lag(lines, {"a": 0, "b": 1, "c": 2})
    assert lag == {"calls": 3, "lagging": 1, "share": 1 / 3, "pods_behind_mean": 1.0}
    # a filter that picked the node scored the pod itself (no prioritize follows)
    picked = json.dumps({"msg": "filter", "pod": "default/d", "view_pods": 1, "chose": "n"})
    lag = view_lag([*lines, picked], {"a": 0, "b": 1, "c": 2, "d": 3})
    assert lag["calls"] == 4 and lag["lagging"] == 2


def test_a_variant_may_set_filter_chooses():
    from tests.bench.trace_replay import parse_variants

    assert parse_variants("picks:;both:filterChooses=false,gpu=3") == [
        ("gpu-scheduler[picks]", {"weights": {}}),
        ("gpu-scheduler[both]", {"weights": {"gpu": 3}, "filterChooses": False}),
    ]
