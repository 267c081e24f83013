"""tests/bench/trace_variants.py: held-out variants of the default pod list, built as the
published ones were, the same for the same seed."""

from __future__ import annotations

from tests.bench import trace_variants as tv


def row(i: int, gpus: int, milli: int = 1000, spec: str = "") -> dict[str, str]:
    return {
        "name": f"openb-pod-{i:04d}",
        "cpu_milli": "4000",
        "memory_mib": "8192",
        "num_gpu": str(gpus),
        "gpu_milli": str(milli if gpus else 0),
        "gpu_spec": spec,
        "qos": "LS",
        "creation_time": str(i),
    }


DEFAULT = (
    [row(i, 1) for i in range(60)]
    + [row(60 + i, 1, 500) for i in range(30)]
    + [row(90 + i, 0) for i in range(10)]
    + [row(100, 8), row(101, 4), row(102, 2)]
)


def test_multigpu_keeps_the_default_rows_and_adds_multi_gpu_tasks_to_the_share():
    out = tv.multigpu_variant(DEFAULT, 50, seed=1)
    assert out[: len(DEFAULT)] == [{c: r[c] for c in tv.RESOURCE_COLUMNS} for r in DEFAULT]
    added = out[len(DEFAULT) :]
    assert added and all(int(r["num_gpu"]) > 1 for r in added)
    assert tv.multi_gpu_share(out) >= 0.5 > tv.multi_gpu_share(out[:-1])  # stops at the target
    assert [r["name"] for r in added][:2] == ["openb-pod-0103", "openb-pod-0104"]
    assert list(out[0]) == list(tv.RESOURCE_COLUMNS)  # as the published multigpu files
    assert tv.multigpu_variant(DEFAULT, 50, seed=1) == out
    assert tv.multigpu_variant(DEFAULT, 50, seed=2) != out


def test_gpuspec_sets_specs_on_the_share_of_gpu_tasks_from_their_class_pool():
    pools = {True: ["T4", "P100"], False: ["V100M16|V100M32", "G2"]}
    out = tv.gpuspec_variant(DEFAULT, 33, seed=1, pools=pools)
    gpu = [r for r in out if int(r["num_gpu"]) > 0]
    specced = [r for r in gpu if r["gpu_spec"]]
    assert len(specced) == round(len(gpu) * 0.33)
    assert all(not r["gpu_spec"] for r in out if int(r["num_gpu"]) == 0)
    for r in specced:
        assert r["gpu_spec"] in pools[int(r["gpu_milli"]) < 1000]
    unchanged = [{k: v for k, v in r.items() if k != "gpu_spec"} for r in out]
    assert unchanged == [{k: v for k, v in r.items() if k != "gpu_spec"} for r in DEFAULT]
    assert tv.gpuspec_variant(DEFAULT, 33, seed=1, pools=pools) == out


def test_sharing_tasks_are_chosen_less_often():
    rows = [row(i, 1, 500 if i % 2 else 1000) for i in range(4000)]
    out = tv.gpuspec_variant(rows, 25, seed=3, pools={True: ["T4"], False: ["G2"]})
    sharing = sum(1 for r in out if r["gpu_spec"] == "T4")
    whole = sum(1 for r in out if r["gpu_spec"] == "G2")
    assert 0.6 < sharing / whole < 0.95


def test_spec_pools_split_by_class():
    source = [row(0, 1, 500, "T4"), row(1, 2, 1000, "G2|T4"), row(2, 0, 0, ""), row(3, 1)]
    assert tv.spec_pools(source) == {True: ["T4"], False: ["G2|T4"]}
