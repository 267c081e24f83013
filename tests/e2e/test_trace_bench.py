"""The trace benchmark's guards in CI, on small samples of the openb trace (full-scale
figures: docs/BENCHMARKS.md): in fill mode our profile is never worse than
kube-scheduler's default profile; replay mode runs end to end and accounts for every
GPU pod; sample mode (the FGD paper's protocol) runs end to end for all three
schedulers and accounts for every drawn GPU task."""

from __future__ import annotations

import pytest

from lab.controlplane import find_binary


@pytest.fixture
def trace_run(openb_trace):
    if find_binary() is None:
        pytest.skip("needs the control plane")  # the stack fixture says how; CI fails there
    from tests.bench.trace_replay import parse_args, run

    return lambda *argv: run(parse_args(list(argv)))


def test_gpu_scheduler_fills_at_least_as_far_as_the_default_profile(trace_run):
    default, ours = trace_run(
        "--pods=openb_pod_list_multigpu20.csv",
        "--scale=0.04",
        "--schedulers=default,gpu-scheduler",
    )

    def at_first_failure(result):
        share = result.first_failure_share
        return result.final_share if share is None else share

    assert at_first_failure(ours) >= at_first_failure(default), (default, ours)
    assert ours.constraint_violations == 0
    assert ours.gpu_pods > 0


def test_replay_places_or_withdraws_every_gpu_pod(trace_run):
    (ours,) = trace_run(
        "--pods=openb_pod_list_gpuspec20.csv",
        "--mode=replay",
        "--scale=0.02",
        "--speedup=25",
        "--schedulers=gpu-scheduler",
    )
    assert ours.gpu_pods > 100
    assert ours.gpu_placed + ours.gpu_failed == ours.gpu_pods
    assert not ours.pending
    assert ours.constraint_violations == 0
    assert ours.peak_allocation > 0.2  # the load scaling does load the cluster
    assert sum(len(w) for w in ours.waits.values()) == ours.gpu_placed
    assert ours.departed > 0  # pods ran their lifetimes and left


def test_sample_mode_accounts_for_every_drawn_gpu_task(trace_run):
    results = trace_run(
        "--pods=openb_pod_list_gpuspec20.csv",
        "--mode=sample",
        "--scale=0.03",
        "--seeds=42",
    )
    assert [r.scheduler for r in results] == ["default", "mostallocated", "gpu-scheduler"]
    for r in results:
        assert r.curve[-1][0] >= 1.3  # the draw reached 130% of the GPUs
        assert r.gpu_pods == len(r.curve) and r.gpu_failed == sum(r.failed_by_size.values())
        assert r.allocated <= r.total_gpus and r.constraint_violations == 0
        assert r.fragmentation is not None and r.at_level(1.0) is not None
    # Every scheduler saw the same draw.
    assert len({r.gpu_pods for r in results}) == 1
