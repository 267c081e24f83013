"""The share request, the one fit rule, the node's report and the usage it gives."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_scheduler import contract, sharing
from gpu_scheduler.fields import FieldError
from gpu_scheduler.sharing import BoundPod, Gpu, Placement, fit, usage

MEM = contract.RESOURCE_GPU_MEMORY


def _spec(*containers, init=()):
    def one(i, req):
        return {"name": f"c{i}", "resources": {"limits": req}}

    spec = {"containers": [one(i, r) for i, r in enumerate(containers)]}
    if init:
        spec["initContainers"] = list(init)
    return spec


def _gpus(*free, cap=80):
    return [Gpu(f"g{i}", cap, f, f == cap) for i, f in enumerate(free)]


def test_units_per_gpu_floor_to_whole_gib():
    assert sharing.gpu_units(143771) == 140  # an H200
    assert sharing.gpu_units(81920) == 80
    assert sharing.gpu_units(1023) == 0
    assert sharing.gpu_units(None) == 0
    assert sharing.gpu_units(-5) == 0


def test_pod_shares_reads_each_container_and_sidecars():
    sidecar = {"name": "side", "restartPolicy": "Always", "resources": {"requests": {MEM: "4"}}}
    request = sharing.pod_shares(_spec({MEM: "20"}, {"cpu": "1"}, {MEM: 8}, init=[sidecar]))
    # The kubelet's order: init containers (the sidecar), then app containers.
    assert request.units == (4, 20, 8)
    assert request.containers == ("side", "c0", "c2")
    assert request.total == 32
    assert not sharing.pod_shares(_spec({"cpu": "1"}))
    assert not sharing.pod_shares(None)


@pytest.mark.parametrize(
    ("containers", "words"),
    [
        ([{MEM: "16Gi"}], "write 16, not 16Gi"),
        ([{MEM: "2000"}], "more than any GPU has"),
        ([{MEM: "1.5"}], "whole number of GiB"),
        ([{MEM: "500m"}], "whole number of GiB"),
        ([{MEM: "4", contract.RESOURCE_GPU: "1"}], "not both"),
    ],
)
def test_pod_shares_refuses_what_no_gpu_meets(containers, words):
    with pytest.raises(sharing.ShareError, match=words):
        sharing.pod_shares(_spec(*containers))


def test_order_refusal_names_a_share_before_whole_gpus_in_the_kubelets_order():
    gpu = contract.RESOURCE_GPU
    assert sharing.order_refusal(_spec({gpu: "1"}, {MEM: "4"}, {MEM: "8"})) is None
    assert sharing.order_refusal(_spec({MEM: "4"}, {"cpu": "1"})) is None
    why = sharing.order_refusal(_spec({MEM: "4"}, {gpu: "2"}))
    assert why is not None and why.startswith("container c0 asks gpu-scheduler.io/gpu-memory")
    # A sidecar comes before every app container; a plain init container's whole GPUs
    # come before the sidecars after it.
    side = {"name": "side", "restartPolicy": "Always", "resources": {"limits": {MEM: "4"}}}
    setup = {"name": "setup", "resources": {"limits": {gpu: "1"}}}
    assert sharing.order_refusal(_spec({gpu: "1"}, init=[side])) is not None
    assert sharing.order_refusal(_spec({MEM: "2"}, init=[setup, side])) is None
    assert sharing.order_refusal(_spec({MEM: "2"}, init=[side, setup])) is not None
    # An app container that only reuses a plain init container's GPUs takes none new.
    assert sharing.order_refusal(_spec({gpu: "1"}, init=[setup, side])) is None
    assert sharing.order_refusal(_spec({gpu: "2"}, init=[setup, side])) is not None


def test_a_share_on_a_plain_init_container_is_refused():
    init = {"name": "setup", "resources": {"limits": {MEM: "4"}}}
    with pytest.raises(sharing.ShareError, match="init container setup"):
        sharing.pod_shares(_spec({"cpu": "1"}, init=[init]))


@pytest.mark.parametrize("value", [[], {"x": 1}, True, "1e999999", "-4", "abc"])
def test_pod_shares_names_the_malformed_field(value):
    with pytest.raises(FieldError) as err:
        sharing.pod_shares(_spec({MEM: value}))
    assert "spec.containers[0]" in str(err.value)


def test_fit_is_best_fit_in_the_kubelets_order():
    # 30 fits g1 (40 free) and g2 (80 free): the tighter one, g1.
    assert fit(_gpus(10, 40, 80), [30]) == Placement((), (1,))
    # In the order given, as the kubelet allocates container by container: 50 takes
    # g2 (only it holds it), leaving 30 there, and the 30 then takes the tightest that
    # holds it: g2 again, not g1's 40.
    assert fit(_gpus(10, 40, 80), [50, 30]) == Placement((), (2, 2))
    # 30 first: g1 (40), then 50 on g2. Largest first would have put both on g2.
    assert fit(_gpus(10, 40, 80), [30, 50]) == Placement((), (1, 2))
    assert fit(_gpus(10, 40, 80), [35, 50]) == Placement((), (1, 2))
    # The case: [4, 4, 5] on 8 and 5 GiB free. The kubelet gives the first 4
    # the 5-GiB GPU, the second the 8-GiB one, and the 5 finds no room: no fit (largest
    # first fitted it, and the pod then failed admission at the kubelet).
    assert fit(_gpus(8, 5), [4, 4, 5]) is None
    assert fit(_gpus(8, 5), [5, 4, 4]) == Placement((), (1, 0, 0))
    assert fit(_gpus(10, 6), [4, 6]) == Placement((), (1, 0))
    # Two shares on one GPU when it holds both.
    assert fit(_gpus(80), [20, 20]) == Placement((), (0, 0))
    assert fit(_gpus(10, 40), [50]) is None


def test_fit_whole_gpus_take_only_wholly_free_ones_and_no_share_lands_there():
    gpus = _gpus(80, 60, 80)
    assert fit(gpus, [], 2) == Placement((0, 2), ())
    assert fit(gpus, [], 3) is None
    # One whole GPU (g0) and a 70 GiB share: g1 has 60, so the share goes to g2.
    assert fit(gpus, [70], 1) == Placement((0,), (2,))
    assert fit(_gpus(80, 60), [70], 1) is None


def test_a_sick_gpu_offers_nothing():
    gpus = [Gpu("a", 80, 0, False), Gpu("b", 80, 80, True)]
    assert fit(gpus, [10]) == Placement((), (1,))
    assert sharing.largest_piece(gpus) == 80


_states = st.lists(st.integers(0, 80), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(_states, st.lists(st.integers(1, 80), max_size=4), st.integers(0, 3))
def test_fit_never_overcommits_a_gpu(free, shares, whole):
    gpus = _gpus(*free)
    placement = fit(gpus, shares, whole)
    if placement is None:
        # None only when no single GPU holds the largest share, the whole GPUs are
        # missing, or packing ran out: never when every share fits a distinct GPU.
        return
    assert len(set(placement.whole)) == whole
    assert all(gpus[i].whole_free for i in placement.whole)
    left = sharing.after(gpus, placement, shares)
    assert all(g.free >= 0 for g in left)
    assert not set(placement.whole) & set(placement.shares)
    assert sum(g.free for g in gpus) - sum(g.free for g in left) == sum(shares) + sum(
        gpus[i].free for i in placement.whole
    )


@settings(max_examples=200, deadline=None)
@given(_states, st.integers(1, 80))
def test_one_share_fits_exactly_when_the_largest_piece_holds_it(free, need):
    gpus = _gpus(*free)
    assert (fit(gpus, [need]) is not None) == (sharing.largest_piece(gpus) >= need)


def test_device_ids_name_their_gpu():
    assert sharing.id_gpu(sharing.device_id("GPU-ab::c", 7)) == "GPU-ab::c"
    for bad in ("GPU-1", "::3", "GPU-1::", "GPU-1::x", "GPU-1::٣"):
        with pytest.raises(ValueError):
            sharing.id_gpu(bad)


def test_read_report_accepts_units_and_whole_and_refuses_the_rest():
    value = json.dumps({"GPU-a": {"uid-p": 20, "uid-q": "whole"}})
    assert sharing.read_report(value) == {"GPU-a": {"uid-p": 20, "uid-q": "whole"}}
    for bad in (
        "", "[]", "{", json.dumps({"g": []}), json.dumps({"g": {"p": 0}}),
        json.dumps({"g": {"ns/p": 20}}), json.dumps({"g": {"": 20}}),  # by name: an old agent
        json.dumps({"g": {"u" * (sharing.MAX_POD_KEY + 1): 20}}),
        json.dumps({"g": {"p": True}}), json.dumps({"g": {"p": 10**9}}),
        json.dumps({"g": {"p": "half"}}), None, 7, "x" * (sharing.MAX_SHARES_ANNOTATION + 1),
    ):  # fmt: skip
        assert sharing.read_report(bad) is None


def test_usage_takes_the_report_then_fits_the_unreported_in_order():
    gpus = (("GPU-a", 80, True), ("GPU-b", 80, True), ("GPU-c", 80, False))
    report = {"GPU-a": {"ns/p": 30, "ns/gone": 40}, "GPU-b": {"ns/w": "whole"}}
    pods = [BoundPod("ns/p", 0, (30,)), BoundPod("ns/w", 1, ()), BoundPod("ns/new", 0, (50,))]
    state, misfits = usage(gpus, report, pods)
    # ns/gone is no longer bound: its 40 GiB are free again. ns/new fits GPU-a's 50.
    assert [(g.uuid, g.free, g.whole_free) for g in state] == [
        ("GPU-a", 0, False),
        ("GPU-b", 0, False),
        ("GPU-c", 0, False),
    ]
    assert misfits == 0
    _, misfits = usage(gpus, report, [*pods, BoundPod("ns/late", 0, (10,))])
    assert misfits == 1


def test_usage_without_a_report_replays_the_fit():
    gpus = (("gpu-0", 40, True), ("gpu-1", 40, True))
    state, _ = usage(gpus, None, [BoundPod("a/x", 0, (30,)), BoundPod("a/y", 0, (10,))])
    assert [g.free for g in state] == [0, 40]  # best fit packed both onto gpu-0


def test_node_gpus_from_the_agent_annotation_or_the_labels():
    gpus = [
        {"uuid": "GPU-a", contract.GPU_MEMORY_MIB: 81920, "healthy": True},
        {"uuid": "GPU-b", contract.GPU_MEMORY_MIB: 81920, "healthy": False},
        {"uuid": "GPU-m", contract.GPU_MEMORY_MIB: 81920, "migEnabled": True},
    ]
    assert sharing.node_gpus(json.dumps(gpus), 3, 81920) == (
        ("GPU-a", 80, True),
        ("GPU-b", 80, False),
        ("GPU-m", 0, False),
    )
    assert sharing.node_gpus(None, 2, 16384) == (("gpu-0", 16, True), ("gpu-1", 16, True))
    assert sharing.node_gpus("not json", 1, 16384) == (("gpu-0", 16, True),)
    assert sharing.node_gpus(json.dumps([{"uuid": 5}]), 1, 16384) == ()
    assert sharing.node_gpus(None, None, 16384) == ()
    assert sharing.node_gpus(None, 10**6, 16384) == ()
