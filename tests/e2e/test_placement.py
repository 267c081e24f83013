"""Path 3: GPU pods placed by the real kube-scheduler through our extender.

Each case labels its own nodes and pins its pods to them with a nodeSelector, so the
scheduler hands the extender only that case's nodes.
"""

from __future__ import annotations

import datetime as dt

import pytest

from gpu_scheduler import contract
from lab.stack import NAMESPACE, scheduler_config
from tests.e2e.kube import (
    bind_pod,
    create_pod,
    delete_pod,
    pod_manifest,
    put_lease,
    read_pod,
    unique,
    wait_bound,
    wait_event,
)
from tests.e2e.scenarios import gpu_node, place

A100_80 = ("NVIDIA-A100-SXM4-80GB", 81920)
A100_40 = ("NVIDIA-A100-SXM4-40GB", 40960)


def test_binpack_takes_the_tightest_fit_where_mostallocated_takes_the_fuller_node(stack):
    """A node with 8 GPUs, 4 in use, and an empty 2-GPU node. For a 1-GPU pod,
    MostAllocated (deploy/'s profile without the extender) prefers the big node (5/8
    allocated after, against 1/2), which leaves 3 GPUs no 4-GPU pod can use; our
    binpack takes the small node's 1 of 2 and keeps the big node's 4 together. The
    same pod under the profile without the extender shows the case tells the two
    apart."""
    case = "binpack"
    big = gpu_node(stack, case, 8)
    small = gpu_node(stack, case, 2)
    bind_pod(stack, big, 4)
    plain = scheduler_config(stack.extender_url, profile="no-extender")
    plain.pop("extenders")
    stack.cluster.start_scheduler("no-extender", plain)
    try:
        control = unique("control")
        create_pod(
            stack,
            pod_manifest(
                control,
                1,
                case=case,
                scheduler="no-extender",
                tolerations=[contract.GPU_TOLERATION],
            ),
        )
        assert wait_bound(stack, control) == big
        delete_pod(stack, control)
    finally:
        stack.cluster.stop_process("no-extender")
    ours = place(stack, case)
    assert wait_bound(stack, ours) == small
    four = place(stack, case, 4)
    assert wait_bound(stack, four) == big  # the 4 GPUs kept together


def test_min_gpu_memory_lands_only_on_80gib_gpus(stack):
    case = "memory"
    small = [gpu_node(stack, case, 8, A100_40) for _ in range(2)]
    big = gpu_node(stack, case, 8, A100_80)
    for node in small:
        bind_pod(stack, node, 7)  # binpack alone would pick these
    pod = place(stack, case, annotations={contract.ANN_MIN_GPU_MEMORY: "80Gi"})
    assert wait_bound(stack, pod) == big


def test_impossible_pod_stays_pending_refused_by_its_node_affinity(stack):
    """The webhook wrote gpu-products as node affinity: kube-scheduler refuses every node
    itself, before the extender is asked (`gpu-scheduler explain` names the constraint:
    test_explain.py)."""
    case = "impossible"
    gpu_node(stack, case, 8, A100_40)
    pod = place(stack, case, annotations={contract.ANN_GPU_PRODUCTS: "NVIDIA-B200"})
    message = wait_event(stack, pod, "didn't match Pod's node affinity/selector")
    assert "FailedScheduling" in message
    terms = read_pod(stack, pod)["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["NVIDIA-B200", "NVIDIA-B200-SHARED"]


def test_malformed_constraint_keeps_the_extenders_reason(stack):
    """Not written as node affinity: the extender refuses every node and says why."""
    case = "malformed"
    gpu_node(stack, case, 8, A100_40)
    pod = place(stack, case, annotations={contract.ANN_MIN_GPU_MEMORY: "lots"})
    message = wait_event(stack, pod, "is not a memory size")
    assert "FailedScheduling" in message


@pytest.mark.parametrize(("preference", "expected"), [("avoid", "on-demand"), ("prefer", "spot")])
def test_spot_preference_decides_between_otherwise_equal_nodes(stack, preference, expected):
    case = unique("spot")
    nodes = {
        "spot": gpu_node(stack, case, 8, **{contract.LABEL_EKS_CAPACITY_TYPE: "SPOT"}),
        "on-demand": gpu_node(stack, case, 8, **{contract.LABEL_EKS_CAPACITY_TYPE: "ON_DEMAND"}),
    }
    pod = place(stack, case, annotations={contract.ANN_SPOT: preference})
    assert wait_bound(stack, pod) == nodes[expected]


def test_group_is_drawn_to_the_zone_it_runs_in(stack):
    case = "zone"
    zone_a = [gpu_node(stack, case, 8, **{contract.LABEL_ZONE: "zone-a"}) for _ in range(2)]
    zone_b = [gpu_node(stack, case, 8, **{contract.LABEL_ZONE: "zone-b"}) for _ in range(2)]
    group = {contract.ANN_GROUP: "llama-ft"}
    bind_pod(stack, zone_b[0], 2, annotations=group)
    bind_pod(stack, zone_a[0], 5)  # binpack alone would choose zone a's fuller node
    for _ in range(3):
        pod = place(stack, case, annotations=group)
        assert wait_bound(stack, pod) in zone_b


def test_group_is_packed_into_its_nvlink_clique_and_the_event_says_so(stack):
    """One zone, two NVLink cliques (``nvidia.com/gpu.clique``, as GFD labels GB200
    racks). The group runs in clique c2; a new pod of it goes to c2's other node, not
    to c1's fuller one that binpack alone would take, and its GPUPlacement Event names
    the level that drew it."""
    case = "clique"
    zone = {contract.LABEL_ZONE: "zone-a"}
    clique = "nvidia.com/gpu.clique"
    c1 = gpu_node(stack, case, 8, **zone, **{clique: "c1"})
    c2 = [gpu_node(stack, case, 8, **zone, **{clique: "c2"}) for _ in range(2)]
    group = {contract.ANN_GROUP: "nvl-train"}
    bind_pod(stack, c2[0], 8, annotations=group)
    bind_pod(stack, c1, 4)
    pod = place(stack, case, 4, annotations=group)
    assert wait_bound(stack, pod) == c2[1]
    wait_event(stack, pod, f"1 of its group's 1 placed pods in {clique}=c2")


def test_node_with_a_stale_agent_heartbeat_gets_no_gpu_pods(stack):
    case = "heartbeat"
    now = dt.datetime.now(dt.UTC)
    stale = gpu_node(stack, case, 8)
    fresh = gpu_node(stack, case, 8)
    put_lease(stack, stale, now - dt.timedelta(hours=1))
    put_lease(stack, fresh, now)
    bind_pod(stack, fresh, 7)  # fresh has 1 free; stale has 8
    pod = place(stack, case)
    assert wait_bound(stack, pod) == fresh
    waiting = place(stack, case)  # fresh is full now, and stale must not take it
    wait_event(stack, waiting, "agent on this node is silent")
    delete_pod(stack, waiting)
    from kubernetes import client

    for name in (stale, fresh):  # no silent agents left behind for the other tests
        client.CoordinationV1Api(stack.api).delete_namespaced_lease(name, NAMESPACE)
