"""DRA: DeviceClasses, ResourceSlices and ResourceClaims as the NVIDIA DRA driver and
kube-scheduler write them, read into GPUs per node, and merged into the cache's view."""

from __future__ import annotations

import pytest

from extender.cache import ClusterCache
from extender.config import ExtenderConfig
from extender.engine import filter_nodes
from extender.model import pod_facts
from extender.policies import build_policies
from gpu_scheduler import contract, dra
from tests.factories import (
    claim,
    device_class,
    gpu_device,
    make_node,
    make_pod,
    resource_slice,
)
from tests.helpers import score_nodes

# --- reading the objects ---------------------------------------------------------------


def test_class_for_picks_the_newest_then_the_first_name():
    old = dra.device_class(device_class("a.example", created="2026-01-01T00:00:00Z"))
    new = dra.device_class(device_class("b.example", created="2026-06-01T00:00:00Z"))
    twin = dra.device_class(device_class("a2.example", created="2026-06-01T00:00:00Z"))
    other = dra.device_class(device_class("x", resource="example.com/fpga"))
    assert dra.class_for([old, new, other], contract.RESOURCE_GPU) == new
    assert dra.class_for([new, twin], contract.RESOURCE_GPU) == twin  # "a2" sorts first
    assert dra.class_for([other], contract.RESOURCE_GPU) is None


def test_slice_devices_keep_attributes_by_domain_and_exact_capacity():
    driver, pool, generation, devices = dra.slice_devices(
        resource_slice("n1", [gpu_device(0), gpu_device(1)])
    )
    assert (driver, pool, generation) == ("gpu.nvidia.com", "n1", 1)
    first = devices[0]
    assert first.key == ("gpu.nvidia.com", "n1", "gpu-0") and first.node == "n1"
    assert first.attribute("productName") == "NVIDIA H100 80GB HBM3"
    assert first.attributes["resource.kubernetes.io"]["pciBusID"] == "0000:00:00.0"
    assert first.capacity_of("memory") == 81559 * (1 << 20)


def test_devices_of_slices_that_are_not_node_local_are_left_out():
    shared = resource_slice("n1", [gpu_device(0)])
    del shared["spec"]["nodeName"]
    shared["spec"]["allNodes"] = True
    assert dra.slice_devices(shared)[3] == []
    assert dra.slice_devices({"spec": "x"}) is None


def test_claim_devices():
    assert dra.claim_devices(claim("c", "n1", ["gpu-0", "gpu-3"])) == {
        ("gpu.nvidia.com", "n1", "gpu-0"),
        ("gpu.nvidia.com", "n1", "gpu-3"),
    }
    assert dra.claim_devices({"status": {}}) == frozenset()


def test_class_matcher_evaluates_cel_and_memoises_on_what_it_reads():
    matcher = dra.ClassMatcher(dra.device_class(device_class()))
    devices = dra.slice_devices(
        resource_slice("n1", [gpu_device(i) for i in range(8)] + [gpu_device(9, type="mig")])
    )[3]
    assert [matcher.matches(d) for d in devices] == [True] * 8 + [False]
    assert len(matcher._memo) == 2  # uuids and bus ids differ; the selector reads neither


def test_a_selector_cel_python_cannot_evaluate_matches_nothing():
    semver = device_class(
        selector="device.attributes['gpu.nvidia.com'].cudaComputeCapability"
        ".isGreaterThan(semver('8.0.0'))"
    )
    matcher = dra.ClassMatcher(dra.device_class(semver))
    assert not matcher.matches(dra.slice_devices(resource_slice("n", [gpu_device(0)]))[3][0])


# --- the cache: DRA nodes beside device-plugin nodes -------------------------------------

H100 = dict(product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)


def dra_cache() -> ClusterCache:
    cache = ClusterCache(clock=lambda: 1_800_000_000.0)
    cache.replace_nodes(
        [
            make_node("dp", 8, zone="z1", **H100),  # device plugin: allocatable 8
            make_node("dra-h100", zone="z1"),  # no allocatable: DRA
            make_node("dra-l4", zone="z2"),
            make_node("cpu"),
        ]
    )
    cache.replace_device_classes([device_class()])
    cache.replace_slices(
        [
            resource_slice("dra-h100", [gpu_device(i) for i in range(8)]),
            resource_slice("dra-l4", [gpu_device(i, "NVIDIA L4", 23034) for i in range(4)]),
        ]
    )
    cache.replace_claims([claim("c1", "dra-h100", ["gpu-0", "gpu-1", "gpu-2"])])
    cache.replace_pods(
        [
            make_pod("on-dp", 2, node="dp", phase="Running"),
            # The pod whose claim c1 is: its request must not count a second time.
            make_pod("on-dra", 3, node="dra-h100", phase="Running"),
        ]
    )
    return cache


def test_dra_nodes_get_their_gpus_from_the_slices_and_their_use_from_claims():
    view = dra_cache().view()
    h100, l4, dp = view.nodes["dra-h100"], view.nodes["dra-l4"], view.nodes["dp"]
    assert (h100.allocatable, h100.product, h100.memory_mib, h100.dra) == (
        8,
        "NVIDIA-H100-80GB-HBM3",
        81559,
        True,
    )
    assert (l4.allocatable, l4.product, l4.memory_mib) == (4, "NVIDIA-L4", 23034)
    assert (dp.allocatable, dp.dra) == (8, False)
    assert view.used["dra-h100"] == 3  # from the claim, not 3 + the pod's 3
    assert view.used["dp"] == 2 and view.used.get("dra-l4", 0) == 0
    assert view.free["dra-h100"][0] == 5 and view.free["dp"][0] == 6  # what policies read


def test_every_policy_works_on_dra_nodes_as_on_device_plugin_nodes():
    cache = dra_cache()
    view = cache.view()
    policies = build_policies(ExtenderConfig())
    names = ["dp", "dra-h100", "dra-l4", "cpu"]
    nodes = view.lookup(names)
    # binpack across both kinds: dra-h100 has 5 free, dp 6: the fuller one wins
    pod = pod_facts(make_pod(gpus=5))
    out = filter_nodes(pod, names, nodes, view, policies)
    assert out.passed == ["dp", "dra-h100"]
    assert "4 GPUs in all" in out.unresolvable["dra-l4"]
    scored = score_nodes(pod, nodes, view, policies, ExtenderConfig())
    scores = dict(zip(names, scored, strict=True))
    assert scores["dra-h100"] > scores["dp"]
    # gpu-products and min-gpu-memory on DRA nodes
    l4_only = pod_facts(make_pod(gpus=1, annotations={contract.ANN_GPU_PRODUCTS: "NVIDIA-L4"}))
    assert filter_nodes(l4_only, names, nodes, view, policies).passed == ["dra-l4"]
    big = pod_facts(make_pod(gpus=1, annotations={contract.ANN_MIN_GPU_MEMORY: "40Gi"}))
    passed = filter_nodes(big, names, nodes, view, policies).passed
    assert passed == ["dp", "dra-h100"]
    # a full DRA node may fit later
    cache.claim_event("ADDED", claim("c2", "dra-h100", ["gpu-3", "gpu-4", "gpu-5"]))
    out = filter_nodes(
        pod_facts(make_pod(gpus=3)), names, cache.view().lookup(names), cache.view(), policies
    )
    assert out.failed["dra-h100"] == "2 of 8 GPUs free; pod requests 3"


def test_claims_and_slices_come_and_go():
    cache = dra_cache()
    cache.claim_event("DELETED", claim("c1", "dra-h100", ["gpu-0", "gpu-1", "gpu-2"]))
    assert cache.view().used.get("dra-h100", 0) == 0 and cache.view().free["dra-h100"][0] == 8
    # a newer generation of the pool replaces the older one
    cache.slice_event("ADDED", resource_slice("dra-h100", [gpu_device(0)], generation=2))
    assert cache.view().nodes["dra-h100"].allocatable == 1
    cache.slice_event("DELETED", resource_slice("dra-h100", [], generation=2))
    cache.slice_event("DELETED", resource_slice("dra-h100", []))
    assert cache.view().nodes["dra-h100"].allocatable == 0  # no GPUs left at all
    # without a class mapping nvidia.com/gpu, slices are not GPUs
    cache.device_class_event("DELETED", device_class())
    assert cache.view().nodes["dra-l4"].allocatable == 0


def test_a_pools_generation_is_taken_per_node():
    """One pool of two slices over two nodes, one node's slice already republished: each
    node keeps its own newest devices, as kube-scheduler 1.34 gathers a node's pools
    (only the slices for the node). 1.35+ allocates nothing from the pool until it is
    whole again; its own DRA filter holds that line, ours stays the more permissive.
    The plugins take it alike (plugins/pkg/dra, TestAPoolsGenerationIsTakenPerNode)."""
    cache = dra_cache()
    slices = [
        resource_slice("dra-h100", [gpu_device(i) for i in range(8)], generation=1),
        resource_slice("dra-l4", [gpu_device(i, "NVIDIA L4", 23034) for i in range(8, 12)], 2),
    ]
    for obj in slices:
        obj["spec"]["pool"].update(name="rack", resourceSliceCount=2)
    cache.replace_slices(slices)
    nodes = cache.view().nodes
    assert (nodes["dra-h100"].allocatable, nodes["dra-l4"].allocatable) == (8, 4)


def test_a_dra_node_keeps_what_its_node_says_besides_the_gpus():
    """The devices give a DRA node its GPU facts; its CPU and memory (fragmentation
    reads them), its PreferNoSchedule taints (the preemption tiers and the pick read
    them) and its zone stay the Node's."""
    cache = dra_cache()
    node = make_node("dra-h100", zone="z1", cpu="48", memory="512Gi")
    node["spec"]["taints"] = [{"key": "maintenance", "value": "soon", "effect": "PreferNoSchedule"}]
    cache.node_event("MODIFIED", node)
    facts = cache.view().nodes["dra-h100"]
    assert (facts.allocatable, facts.dra, facts.product) == (8, True, "NVIDIA-H100-80GB-HBM3")
    assert (facts.cpu_milli, facts.ram_mib, facts.zone) == (48000, 512 * 1024, "z1")
    assert facts.soft_taints == (("maintenance", "soon"),)


def test_a_device_plugin_node_wins_over_its_slices():
    cache = dra_cache()
    cache.slice_event("ADDED", resource_slice("dp", [gpu_device(i) for i in range(2)]))
    assert cache.view().nodes["dp"].allocatable == 8 and not cache.view().nodes["dp"].dra


def dra_footprint(count: int) -> int:
    """Bytes the cache holds for ``count`` DRA nodes of 8 GPUs, each with a claim."""
    import gc
    import tracemalloc

    nodes = [make_node(f"n{i}") for i in range(count)]
    slices = [resource_slice(f"n{i}", [gpu_device(j) for j in range(8)]) for i in range(count)]
    claims = [claim(f"c{i}", f"n{i}", ["gpu-0", "gpu-1"]) for i in range(count)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    cache = ClusterCache()
    cache.replace_nodes(nodes)
    cache.replace_device_classes([device_class()])
    cache.replace_slices(slices)
    cache.replace_claims(claims)
    cache.view()
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return used


def test_the_cache_footprint_with_dra_stays_small():
    """What is kept per node of 8 GPUs with a claim: the devices' keys, product and
    memory, not the objects (a slice of 8 GPUs is ~4 KiB of JSON). Measured as the
    slope between two sizes, so one-time costs (CEL's grammar) do not count."""
    dra_footprint(50)  # imports and compiles once
    per_node = (dra_footprint(1000) - dra_footprint(200)) / 800
    print(f"DRA cache: {per_node:.0f} bytes per node")
    assert per_node < 4 * 1024, per_node


@pytest.mark.parametrize("status", [404, 403])
def test_a_cluster_without_dra_is_synced_and_empty(status):
    from kubernetes.client.exceptions import ApiException

    from tests.fakeapi import FakeCore, FakeListWatch

    class ResourceApi:
        list_device_class = FakeListWatch()
        list_resource_slice = FakeListWatch()
        list_resource_claim_for_all_namespaces = FakeListWatch()
        list_device_taint_rule = FakeListWatch()

    for func in vars(ResourceApi).values():
        if isinstance(func, FakeListWatch):
            func.fail_next.append(ApiException(status=status, reason="no"))
    cache = ClusterCache()
    cache.start(FakeCore([make_node("a", 8, **H100)]), ResourceApi())
    try:
        for reflector in cache.reflectors.values():
            assert reflector.synced.wait(5), reflector.kind
        assert cache.ready()[0] and cache.reflectors["resourceslices"].absent
        assert cache.view().nodes["a"].allocatable == 8
    finally:
        cache.stop()


def prioritized_claim(name: str, subrequests: int = 2) -> dict:
    """A claim asking one GPU from a prioritized list (``firstAvailable``), not
    allocated yet: the pod is being scheduled."""
    first = [
        {"name": f"choice-{i}", "deviceClassName": "gpu.nvidia.com", "count": 1}
        for i in range(subrequests)
    ]
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": first}]}},
    }


def test_a_claim_with_a_prioritized_list_hands_the_choice_to_kube_scheduler():
    """Issue 49 item 7: kube-scheduler's DynamicResources scores which subrequest of a
    firstAvailable list a node can satisfy (the earlier the better); a filter that
    picked would land the pod on its fallback device. The filter passes every node
    that fits, and kube-scheduler picks."""
    from extender.app import create_app
    from tests.fakeapi import synced_cache

    cache = synced_cache([make_node("dra-h100", zone="z1"), make_node("dra-l4", zone="z2")])
    cache.replace_device_classes([device_class()])
    cache.replace_slices(
        [
            resource_slice("dra-h100", [gpu_device(i) for i in range(8)]),
            resource_slice("dra-l4", [gpu_device(i, "NVIDIA L4", 23034) for i in range(4)]),
        ]
    )
    cache.claim_event("ADDED", prioritized_claim("wants-h100"))
    cache.claim_event("ADDED", prioritized_claim("one-choice", subrequests=1))
    assert cache.view().prioritized == frozenset({"default/wants-h100"})
    client = create_app(cache=cache).test_client()

    def filtered(claim_name: str) -> list[str]:
        pod = make_pod(claim_name, 0)
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
        pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
        body = {"Pod": pod, "Nodes": None, "NodeNames": ["dra-h100", "dra-l4"]}
        answer = client.post("/filter", json=body).get_json()
        assert "NodeNames" in answer, answer
        return answer["NodeNames"]

    assert sorted(filtered("wants-h100")) == ["dra-h100", "dra-l4"]
    assert len(filtered("one-choice")) == 1  # nothing to prefer: the filter picks
    cache.claim_event("DELETED", prioritized_claim("wants-h100"))
    assert cache.view().prioritized == frozenset()
    cache.replace_claims([prioritized_claim("again")])
    assert cache.view().prioritized == frozenset({"default/again"})
    cache.stop()
