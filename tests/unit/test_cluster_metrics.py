"""The cluster's GPUs, fragmentation and shares on the extender's /metrics
(extender/cluster_metrics.py): a cache of a few nodes and pods gives the numbers
worked out by hand, once, also where the metrics are gunicorn's multiprocess files."""

from __future__ import annotations

import json

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from extender import cluster_metrics
from extender.app import create_app
from gpu_scheduler import contract
from gpu_scheduler.http import metrics_payload
from tests.factories import make_lease, make_node, make_pod
from tests.fakeapi import synced_cache
from tests.unit.test_extender_shares import share_pod, shared_node

A100 = dict(product="NVIDIA-A100-SXM4-80GB", memory_mib=81920)
H100 = "NVIDIA-H100"


@pytest.fixture
def cache():
    sick = make_node("w2", 8, **A100)
    sick["metadata"]["annotations"][contract.ANN_GPUS] = json.dumps(
        [{"uuid": f"GPU-{i}", "healthy": i != 5} for i in range(8)]
    )
    nodes = [
        make_node("w1", 8, **A100),
        sick,
        make_node("w3", 4, product=H100, memory_mib=81920),
        make_node("w4", 2, cpu="500m", **A100),  # too little CPU for any shape
        make_node("cpu-only"),
        shared_node("s1"),  # 2 H100s of 80 GiB
        shared_node("s2"),
    ]
    pods = [
        make_pod("four", 4, node="w1", phase="Running"),
        make_pod("one", 1, node="w2", phase="Running"),
        make_pod("three", 3, node="w3", phase="Running"),
        make_pod("whole", 1, node="s2", phase="Running"),
        share_pod("half", 40, node="s1"),
        make_pod("waiting", 8),  # not bound: holds nothing
    ]
    made = synced_cache(nodes, pods)
    made.replace_leases([make_lease("w2", "2027-01-15T07:59:00.000000Z")])  # its agent's
    yield made
    made.stop()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("gpu_scheduler_extender_")
        for s in family.samples
    }


def expected() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    a100, h100 = "NVIDIA-A100-SXM4-80GB", H100
    want = {}
    gpus = {a100: (18, 17, 5, 12), h100: (8, 8, 4, 3)}
    for model, values in gpus.items():
        for state, value in zip(cluster_metrics.GPU_STATES, values, strict=True):
            want[("gpu_scheduler_extender_cluster_gpus", (("model", model), ("state", state)))] = (
                value
            )
    # The mix: shapes of 4, 3 and 1 GPUs (two pods of 1), weighed 4/9, 3/9 and 2/9 (the
    # multi-GPU pods ask most of the GPUs: pods x GPUs). w3, s1 and s2 keep one free
    # H100 each, where only the 1-GPU shape fits: 3 x 7/9. w4's 2 A100s fit nothing.
    for model, fragmented, stranded in ((a100, 2.0, 2.0), (h100, round(21 / 9, 6), 0.0)):
        want[("gpu_scheduler_extender_fragmented_gpus", (("model", model),))] = fragmented
        want[("gpu_scheduler_extender_stranded_gpus", (("model", model),))] = stranded
    # s1: 40 of one GPU's 80 units to a share; s2: one GPU given whole
    for state, value in (("allocatable", 320), ("usable", 320), ("free", 200)):
        want[("gpu_scheduler_extender_share_units", (("model", h100), ("state", state)))] = value
    fill = "gpu_scheduler_extender_shared_gpu_fill_ratio"
    for bound, count in (("0.0", 2), ("0.25", 2), ("0.5", 3), ("0.75", 3), ("0.9", 3),
                         ("1.0", 4), ("+Inf", 4)):  # fmt: skip
        want[(fill + "_bucket", (("le", bound), ("model", h100)))] = count
    want[(fill + "_count", (("model", h100),))] = 4
    want[(fill + "_sum", (("model", h100),))] = 1.5
    return want


def test_a_cache_of_a_few_nodes_gives_the_numbers_worked_out_by_hand(cache):
    app = create_app(cache=cache)
    text = app.test_client().get("/metrics").get_data(as_text=True)
    got = samples(text)
    for key, value in expected().items():
        assert got.get(key) == pytest.approx(value), key
    exported = {key for key in got if key[0].startswith(tuple(cluster_metrics.PREFIX + n for n in (
        "cluster_gpus", "fragmented", "stranded", "share_units", "shared_gpu")))}  # fmt: skip
    assert exported == set(expected())  # no node-less model, no cpu-only series


def test_under_multiprocess_the_answering_worker_serves_one_series(cache, tmp_path, monkeypatch):
    create_app(cache=cache)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    text = metrics_payload().decode()
    assert text.count("# TYPE gpu_scheduler_extender_cluster_gpus gauge") == 1
    assert (
        samples(text)[("gpu_scheduler_extender_cluster_gpus", (("model", H100), ("state", "free")))]
        == 3
    )


def test_without_a_view_the_families_are_served_empty():
    families = cluster_metrics.collect_view(None)
    assert len(families) == 5 and all(not f.samples for f in families)
    collector = cluster_metrics.ClusterCollector()
    collector.source = lambda: 1 / 0  # a failing read: the scrape still answers
    assert [f.samples for f in collector.collect()] == [[]] * 5


def test_no_bound_gpu_pod_no_mix_no_fragmentation():
    made = synced_cache([make_node("w", 8, **A100)], [])
    try:
        got = samples(generate_latest(_Only(made.view())).decode())
    finally:
        made.stop()
    model = (("model", A100["product"]),)
    assert got[("gpu_scheduler_extender_fragmented_gpus", model)] == 0
    assert got[("gpu_scheduler_extender_cluster_gpus", (*model, ("state", "free")))] == 8


class _Only:
    """A registry of one view's families."""

    def __init__(self, view):
        self.view = view

    def collect(self):
        return cluster_metrics.collect_view(self.view)
