"""DRA consumable capacity: a GPU that allows multiple allocations is shared by claims,
each consuming some of its memory; the extender counts what they consumed and scores
a pod whose claim asks memory, with the fit rule and measure of device-plugin shares."""

from __future__ import annotations

from extender.cache import ClusterCache
from extender.config import ExtenderConfig
from extender.model import pod_facts
from extender.policies import build_policies
from gpu_scheduler import dra
from tests.factories import (
    claim_pod,
    device_class,
    gpu_device,
    make_node,
    resource_slice,
    share_claim,
    shared_device,
)
from tests.helpers import score_nodes


def shares_cache() -> ClusterCache:
    cache = ClusterCache(clock=lambda: 1_800_000_000.0)
    cache.replace_nodes([make_node("a"), make_node("b")])
    cache.replace_device_classes([device_class()])
    cache.replace_slices(
        [
            resource_slice("a", [shared_device(0), shared_device(1)]),
            resource_slice("b", [shared_device(0), shared_device(1)]),
        ]
    )
    cache.replace_claims(
        [
            share_claim("c1", "a", {"gpu-0": "60Gi"}),
            share_claim("c2", "b", {"gpu-1": "10Gi"}),
            share_claim("mine", None, {}, asks="20Gi"),
        ]
    )
    return cache


def test_the_claims_fields_are_read_as_kube_scheduler_writes_them():
    obj = share_claim("c", "a", {"gpu-0": "20Gi", "gpu-1": "512Mi"})
    obj["status"]["allocation"]["devices"]["results"].append(
        {"driver": "gpu.nvidia.com", "pool": "a", "device": "gpu-0",
         "consumedCapacity": {"gpu.nvidia.com/memory": "4Gi", "cores": "10"}}
    )  # fmt: skip
    consumed = dra.claim_consumed(obj)
    assert consumed[("gpu.nvidia.com", "a", "gpu-0")] == 24 << 30
    assert consumed[("gpu.nvidia.com", "a", "gpu-1")] == 512 << 20
    assert dra.claim_memory_requests(obj) == (20 << 30,)
    for junk in ({}, {"status": 5}, {"spec": {"devices": {"requests": [7, {"exactly": 3}]}}}):
        assert dra.claim_consumed(junk) == {} and dra.claim_memory_requests(junk) == ()
    device = dra.slice_devices(resource_slice("a", [shared_device(0), gpu_device(1)]))[3]
    assert [d.shareable for d in device] == [True, False]


def test_what_claims_consumed_is_each_devices_state():
    view = shares_cache().view()
    assert [(g.uuid, g.free, g.whole_free) for g in view.gpus["a"]] == [
        ("gpu-0", 20, False),
        ("gpu-1", 80, True),
    ]
    assert [(g.free, g.whole_free) for g in view.gpus["b"]] == [(80, True), (70, False)]
    assert view.claim_shares["default/mine"] == (20,) and len(view.claim_shares) == 3
    assert view.pod_shares(pod_facts(claim_pod("p", "mine"))) == (20,)


def test_a_pod_whose_claim_asks_memory_is_scored_best_fit_on_the_shared_devices():
    cache = shares_cache()
    view = cache.view()
    pod = pod_facts(claim_pod("p", "mine"))
    assert pod.gpus == 0 and pod.shares == () and pod.claims == ("default/mine",)
    scores = score_nodes(pod, view.lookup(["a", "b"]), view, build_policies(ExtenderConfig()),
                         ExtenderConfig())  # fmt: skip
    # a's gpu-0 has 20 GiB left: the 20 GiB claim fills it exactly; b would break 70.
    assert scores[0] > scores[1]


def test_claims_come_and_go_and_the_view_follows():
    cache = shares_cache()
    cache.claim_event("MODIFIED", share_claim("c1", "a", {"gpu-0": "80Gi"}))
    assert cache.view().gpus["a"][0].free == 0
    cache.claim_event("DELETED", share_claim("c1", "a", {}))
    gpu = cache.view().gpus["a"][0]
    assert (gpu.free, gpu.whole_free) == (80, True)
    cache.claim_event("MODIFIED", share_claim("mine", "b", {"gpu-1": "20Gi"}, asks="20Gi"))
    assert cache.view().gpus["b"][1].free == 50
    cache.claim_event("DELETED", share_claim("mine", None, {}))
    assert "default/mine" not in cache.view().claim_shares
