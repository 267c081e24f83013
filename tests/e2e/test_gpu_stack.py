"""Beside the GPU stack a cluster already runs: GPU Feature Discovery, the NVIDIA device
plugin, and a DRA driver. On a control plane of this module's own, with the test
playing GFD (labels), the kubelet with the device plugin (capacity) and the NVIDIA DRA
driver (a DeviceClass mapping nvidia.com/gpu, ResourceSlices as the driver publishes
them); the agent and the extender are ours, and kube-scheduler v1.37 with DRA as
shipped allocates the claims."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from kubernetes import client

from gpu_scheduler import contract, dra
from tests.e2e.kube import (
    core,
    create_node,
    gpu_labels,
    play_kubelet_with_device_plugin,
    read_lease,
    server_minor,
    wait_bound,
    wait_event,
)
from tests.e2e.scenarios import (
    GPU_TAINT,
    create_gpu_device_class,
    own_stack,
    publish_slice,
    scenario,
)
from tests.helpers import wait_for

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gpus"
GFD_MANAGER = "gpu-feature-discovery"
GFD_LABELS = {
    contract.LABEL_GFD_TIMESTAMP: "1724632719",
    contract.LABEL_GPU_PRESENT: "true",
    contract.LABEL_GPU_PRODUCT: "Tesla-T4-SHARED",
    contract.LABEL_GPU_COUNT: "2",
    contract.LABEL_GPU_MEMORY: "15360",
    contract.LABEL_GPU_FAMILY: "turing",
    contract.LABEL_GPU_REPLICAS: "2",
    contract.LABEL_GPU_SHARING_STRATEGY: "time-slicing",
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory, control_plane_binary):
    stack = own_stack(tmp_path_factory.mktemp("gpustack"), control_plane_binary)
    yield stack
    stack.stop()


def owned_by(stack, node: str, manager: str) -> list[dict[str, Any]]:
    found = core(stack).read_node(node).metadata.managed_fields or []
    return [stack.api.sanitize_for_serialization(e) for e in found if e.manager == manager]


def test_the_agent_leaves_gfd_labels_and_device_plugin_capacity_alone(lab):
    """A node labelled by GFD (time-sliced T4s) whose capacity the device plugin
    advertises; our agent (fake H100 inventory, defaults: --gfd-labels auto, no
    capacity) runs many sync periods: it never writes GFD's keys or the capacity,
    renews its heartbeat Lease, writes its annotation, and the extender places by GFD's labels."""
    name = create_node(lab, "gfd-node", case="gfd", taints=GPU_TAINT)
    core(lab).patch_node(name, {"metadata": {"labels": GFD_LABELS}}, field_manager=GFD_MANAGER)
    play_kubelet_with_device_plugin(lab, name, 4)  # 2 T4s x 2 replicas
    agent = lab.start_agent(name, FIXTURES / "h100x8.yaml", interval="1s", capacity=False)
    wait_for(lambda: read_lease(lab, name) is not None, 30, "the agent's heartbeat Lease")
    time.sleep(6)  # several sync periods
    node = core(lab).read_node(name)
    for key, value in GFD_LABELS.items():
        assert node.metadata.labels[key] == value, key
    assert contract.ANN_GPUS in node.metadata.annotations
    agent_fields = owned_by(lab, name, "gpu-scheduler-agent")
    assert agent_fields, "the agent wrote nothing"
    for entry in agent_fields:
        assert "f:labels" not in entry["fieldsV1"].get("f:metadata", {}), entry
        assert entry.get("subresource") != "status", entry
    assert node.status.capacity[contract.RESOURCE_GPU] == "4"
    assert "leaving GPU Feature Discovery's labels alone" in agent.log_path.read_text()

    with scenario(lab, "gfd", proxied=False) as s:
        # GFD says Tesla-T4-SHARED; the agent's (unwritten) inventory said H100.
        pod = s.pod(1, "gfd", annotations={contract.ANN_GPU_PRODUCTS: "Tesla-T4"})
        assert wait_bound(lab, pod, timeout=30) == name
    lab.cluster.stop_process(agent.name)


def test_capacity_on_still_defers_to_the_device_plugin(lab):
    name = create_node(
        lab,
        "dp-node",
        case="dp",
        taints=GPU_TAINT,
        labels=gpu_labels(8, "NVIDIA-H100-80GB-HBM3", 81559),
    )
    play_kubelet_with_device_plugin(lab, name, 8)
    agent = lab.start_agent(name, FIXTURES / "h100x8-unhealthy.yaml", interval="1s", capacity=True)
    wait_for(lambda: "not advertising" in agent.log_path.read_text(), 30, "the agent's decision")
    time.sleep(3)
    assert core(lab).read_node(name).status.capacity[contract.RESOURCE_GPU] == "8"  # not 7
    assert not [
        e for e in owned_by(lab, name, "gpu-scheduler-agent") if e.get("subresource") == "status"
    ]
    lab.cluster.stop_process(agent.name)


# --- DRA -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dra_nodes(lab):
    return make_dra_nodes(lab)


def make_dra_nodes(lab) -> dict[str, str]:
    """The GPU class, two nodes of DRA GPUs (8 H100s, 4 L4s) and one of the device
    plugin's (8 A100s): the DRA scenarios' cluster, on either path."""
    create_gpu_device_class(lab)
    h100 = create_node(lab, "dra-h100", case="dra", taints=GPU_TAINT)
    l4 = create_node(lab, "dra-l4", case="dra", taints=GPU_TAINT)
    a100 = create_node(
        lab,
        "dp-a100",
        case="dra",
        gpus=8,
        taints=GPU_TAINT,
        labels=gpu_labels(8, "NVIDIA-A100-SXM4-80GB", 81920),
    )
    publish_slice(lab, h100, "NVIDIA H100 80GB HBM3", 81559, 8)
    publish_slice(lab, l4, "NVIDIA L4", 23034, 4)
    return {"h100": h100, "l4": l4, "a100": a100}


def claim_of(stack, pod: str) -> dict[str, Any]:
    """The claim kube-scheduler made for the pod's extended-resource request."""
    status = core(stack).read_namespaced_pod(pod, "default").status.extended_resource_claim_status
    assert status is not None, f"{pod} has no extendedResourceClaimStatus"
    name = status.resource_claim_name
    found = client.ResourceV1Api(stack.api).read_namespaced_resource_claim(name, "default")
    return stack.api.sanitize_for_serialization(found)


def test_dra_and_device_plugin_nodes_in_one_cluster(lab, dra_nodes):
    with scenario(lab, "dra", proxied=False) as s:
        wait_for(
            lambda: "with DRA GPUs" in requests.get(s.url + "/readyz", timeout=2).text,
            30,
            "the extender sees the DRA nodes",
        )
        dra_and_device_plugin_nodes(lab, dra_nodes, lambda gpus, **kw: s.pod(gpus, "dra", **kw))


def dra_and_device_plugin_nodes(lab, dra_nodes: dict[str, str], pod) -> None:
    """Pods (``pod(gpus, annotations=...)``: created on the path under test) placed on
    DRA and device-plugin nodes by product, memory and binpack; the claims
    kube-scheduler allocated for them on the chosen nodes."""
    h100, l4, a100 = dra_nodes["h100"], dra_nodes["l4"], dra_nodes["a100"]
    h100_only = {contract.ANN_GPU_PRODUCTS: "NVIDIA-H100-80GB-HBM3"}
    # gpu-products on a DRA node: only the H100s
    first = pod(6, annotations=h100_only)
    assert wait_bound(lab, first, timeout=30) == h100
    # binpack across both kinds: the DRA L4s (4 free) pack better than the device
    # plugin's A100s (8 free); scarcity keeps this unrestricted pod off the H100s,
    # which restricted pods need
    second = pod(2)
    assert wait_bound(lab, second, timeout=30) == l4
    # the H100 node's last 2 (its claim holds 6: usage comes from the claims)
    third = pod(2, annotations=h100_only)
    assert wait_bound(lab, third, timeout=30) == h100
    # min-gpu-memory on DRA nodes: 23034 MiB L4s are too small for 40Gi
    fourth = pod(1, annotations={contract.ANN_MIN_GPU_MEMORY: "40Gi"})
    assert wait_bound(lab, fourth, timeout=30) == a100
    # an impossible pod's event carries the extender's reason
    impossible = pod(1, annotations={contract.ANN_GPU_PRODUCTS: "NVIDIA-B200"})
    wait_event(lab, impossible, "is not one of gpu-scheduler.io/gpu-products=NVIDIA-B200")

    # The claims are allocated on the chosen nodes, and no node is over-committed.
    held: dict[str, set[str]] = {}
    for name, node in ((first, h100), (second, l4), (third, h100)):
        found = claim_of(lab, name)
        assert found["metadata"]["annotations"][dra.ANN_EXTENDED_RESOURCE_CLAIM] == "true"
        results = found["status"]["allocation"]["devices"]["results"]
        assert {r["pool"] for r in results} == {node}
        for r in results:
            assert r["device"] not in held.setdefault(node, set()), "device given twice"
            held[node].add(r["device"])
    assert len(held[h100]) == 8 and len(held[l4]) == 2
    # gpu-scheduler status sees both kinds
    from extender.status import cluster_status

    table = cluster_status(lab.api)
    cells = [re.split(r"\s{2,}", line) for line in table.splitlines()[1:-1]]
    rows = {row[0]: row for row in cells}
    assert rows[h100][1:8] == ["NVIDIA-H100-80GB-HBM3", "81559 MiB", "DRA", "8", "-", "8", "0"]
    assert rows[l4][1:8] == ["NVIDIA-L4", "23034 MiB", "DRA", "4", "-", "2", "2"]
    assert rows[a100][3:8] == ["whole", "8", "-", "1", "7"]


def test_a_tainted_dra_device_is_not_offered(lab, dra_nodes):
    """KEP-5055 device taints, as the NVIDIA DRA driver's health check sets them: a node
    of 4 DRA GPUs, one tainted NoSchedule. The extender counts 3 (status: HEALTHY and
    FREE 3), a 3-GPU pod is placed there and a 4-GPU pod is not. Then a DeviceTaintRule
    takes one more device out, and gives it back when deleted."""
    with scenario(lab, "dra-sick", proxied=False) as s:
        tainted_device_not_offered(lab, lambda gpus: s.pod(gpus, "dra-sick"))


def tainted_device_not_offered(lab, pod) -> None:
    """The tainted-device scenario, its pods made by ``pod(gpus)`` on the path under
    test (skipped before 1.37, whose API server drops device taints)."""
    from extender.status import cluster_status

    minor = server_minor(lab)
    if minor < 37:  # before GA the API server drops device taints (DRADeviceTaints off)
        pytest.skip(f"device taints are served from 1.37; this control plane is 1.{minor}")
    node = create_node(lab, "dra-sick", case="dra-sick", taints=GPU_TAINT)
    taint = {"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    publish_slice(lab, node, "NVIDIA L4", 23034, 4, taints={1: [taint]})
    wait_for(
        lambda: node in cluster_status(lab.api) and _row(lab, node)[5:8] == ["3", "0", "3"],
        30,
        "the tainted device left out",
    )
    whole = pod(4)
    three = pod(3)
    assert wait_bound(lab, three, timeout=30) == node
    wait_event(lab, whole, "FailedScheduling")
    assert core(lab).read_namespaced_pod(whole, "default").spec.node_name is None
    # A DeviceTaintRule (maintenance) on one of the three in use: out of the pool,
    # it counts neither free nor in use; deleting the rule gives it back.
    resource = client.ResourceV1Api(lab.api)
    resource.create_device_taint_rule(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": "dra-sick-maintenance"},
            "spec": {
                "deviceSelector": {
                    "driver": dra.NVIDIA_DRIVER,
                    "pool": node,
                    "device": "gpu-2",
                },
                "taint": {"key": "maintenance", "value": "true", "effect": "NoSchedule"},
            },
        }
    )
    wait_for(lambda: _row(lab, node)[5] == "2", 30, "the rule's device left out")
    resource.delete_device_taint_rule("dra-sick-maintenance")
    wait_for(lambda: _row(lab, node)[5] == "3", 30, "the device back")


def _row(stack, node: str) -> list[str]:
    from extender.status import cluster_status

    for line in cluster_status(stack.api).splitlines()[1:-1]:
        cells = re.split(r"\s{2,}", line)
        if cells[0] == node:
            return cells
    return []


def _share_claim(name: str, gib: int) -> dict[str, Any]:
    request = {
        "name": "gpu",
        "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "capacity": {"requests": {"memory": f"{gib}Gi"}},
        },
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [request]}},
    }


def _claim_pod(name: str, claim: str, scheduler: str, case: str) -> dict[str, Any]:
    from tests.e2e.kube import pod_manifest
    from tests.e2e.scenarios import TOLERATE_GPU

    pod = pod_manifest(name, case=case, scheduler=scheduler, tolerations=TOLERATE_GPU)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return pod


def test_consumable_capacity_claims_are_allocated_by_kube_scheduler_scored_by_us(lab, dra_nodes):
    """DRAConsumableCapacity (beta and on from 1.36): nodes of one shareable 80 GiB GPU
    each. A 60 GiB claim's pod goes to the first; then a second node comes, with less
    CPU (the extender's last tie-break would pick it); a 20 GiB claim's pod goes to the
    first node's GPU all the same (best fit: what the 60 left), and kube-scheduler
    allocated both claims on that one device, each consuming its share."""
    minor = server_minor(lab)
    if minor < 36:
        pytest.skip(f"consumable capacity is on by default from 1.36; this is 1.{minor}")
    resource = client.ResourceV1Api(lab.api)

    def gpu_node(name: str, cpu: str) -> str:
        node = create_node(lab, name, case="dra-share", taints=GPU_TAINT, cpu=cpu)
        publish_slice(lab, node, "NVIDIA H100 80GB HBM3", 81920, 1, shareable=True)
        return node

    first_node = gpu_node("dra-share-a", "32")
    with scenario(lab, "dra-share", proxied=False) as s:
        wait_for(
            lambda: "with DRA GPUs" in requests.get(s.url + "/readyz", timeout=2).text,
            30,
            "the extender sees the DRA nodes",
        )
        placed = {}
        for name, gib in (("big", 60), ("small", 20)):
            if name == "small":
                seen = _dra_nodes_seen(s)
                gpu_node("dra-share-b", "16")
                wait_for(lambda n=seen + 1: _dra_nodes_seen(s) == n, 30, "the second node seen")
            resource.create_namespaced_resource_claim("default", _share_claim(f"{name}-claim", gib))
            time.sleep(1)  # the extender's watch has the claim's request before the pod
            pod = f"share-{name}"
            core(lab).create_namespaced_pod(
                "default", _claim_pod(pod, f"{name}-claim", s.profile, "dra-share")
            )
            placed[name] = wait_bound(lab, pod, timeout=30)
        assert placed == {"big": first_node, "small": first_node}, placed
        claims = [
            lab.api.sanitize_for_serialization(
                resource.read_namespaced_resource_claim(f"{n}-claim", "default")
            )
            for n in ("big", "small")
        ]
        results = [c["status"]["allocation"]["devices"]["results"][0] for c in claims]
        assert {r["pool"] for r in results} == {placed["big"]}
        assert results[0]["device"] == results[1]["device"]
        assert [r["consumedCapacity"]["memory"] for r in results] == ["60Gi", "20Gi"]


def _dra_nodes_seen(s) -> int:
    """How many nodes with DRA GPUs the scenario's extender knows (its /readyz)."""
    found = re.search(r"(\d+) with DRA GPUs", requests.get(s.url + "/readyz", timeout=2).text)
    return int(found[1]) if found else 0
