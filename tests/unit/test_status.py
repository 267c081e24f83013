"""``gpu-scheduler status``: the extender's own numbers, for every kind of GPU node."""

from __future__ import annotations

import json

from extender.cache import ClusterCache
from extender.status import COLUMNS, inventory_rows
from gpu_scheduler import contract
from gpu_scheduler.table import render_table
from lab.demo import NODES, SHARE, inventory, pod_manifest, why
from tests.factories import (
    claim,
    device_class,
    gpu_device,
    make_lease,
    make_node,
    make_pod,
    resource_slice,
)

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def test_inventory_rows_for_whole_shared_mig_and_dra_nodes():
    shared = make_node("ts", 32, product="NVIDIA-H100-80GB-HBM3-SHARED", memory_mib=81559)
    shared["metadata"]["labels"][contract.LABEL_GPU_REPLICAS] = "4"
    cache = ClusterCache()
    cache.replace_nodes(
        [
            make_node(
                "b",
                8,
                product="NVIDIA-H100-80GB-HBM3",
                memory_mib=81559,
                zone="z",
                capacity_type="SPOT",
            ),
            make_node("a"),
            shared,
            make_node("mig", 14, product="NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", memory_mib=4864),
            make_node("dra"),
        ]
    )
    sick = [{"uuid": f"GPU-{i}", "healthy": i != 5} for i in range(8)]
    node_b = make_node(
        "b", 8, product="NVIDIA-H100-80GB-HBM3", memory_mib=81559, zone="z", capacity_type="SPOT"
    )
    node_b["metadata"]["annotations"][contract.ANN_GPUS] = json.dumps(sick)
    cache.node_event("MODIFIED", node_b)  # its agent: GPU-5 is sick
    cache.replace_leases([make_lease("b", "2027-01-15T07:59:00.000000Z")])
    cache.replace_device_classes([device_class()])
    cache.replace_slices(
        [resource_slice("dra", [gpu_device(i, "NVIDIA L4", 23034) for i in range(4)])]
    )
    cache.replace_claims([claim("c", "dra", ["gpu-1"])])
    cache.replace_pods(
        [
            make_pod("r", 3, node="b", phase="Running"),
            make_pod("done", 8, node="b", phase="Succeeded"),  # finished: holds nothing
            make_pod("pending", 8),  # not bound: holds nothing
            make_pod("t", 5, node="ts", phase="Running"),
            make_pod("on-dra", 1, node="dra", phase="Running"),  # its claim counts, once
        ]
    )
    rows = {row[0]: row for row in inventory_rows(cache.view(), NOW)}
    assert rows["a"] == ("a", "-", "-", "-", "0", "-", "0", "0", "-", "-", "-")
    assert rows["b"] == (
        "b",
        "NVIDIA-H100-80GB-HBM3",
        "81559 MiB",
        "whole",
        "8",
        "7",
        "3",
        "4",
        "z",
        "spot",
        "60s ago",
    )
    assert rows["ts"][1:8] == (
        "NVIDIA-H100-80GB-HBM3-SHARED",
        "20389 MiB",
        "shared x4",
        "32",
        "-",
        "5",
        "27",
    )
    assert rows["mig"][3:5] == ("MIG", "14")
    assert rows["dra"][1:8] == ("NVIDIA-L4", "23034 MiB", "DRA", "4", "-", "1", "3")
    table = render_table(COLUMNS, list(rows.values())).splitlines()
    assert table[0].split() == list(COLUMNS) and len(table) == 6


def test_demo_inventories_and_explanations():
    gpu_nodes = [n for n in NODES if n.gpu]
    assert all(len(inventory(n)["gpus"]) == n.count for n in gpu_nodes)
    pod = pod_manifest("train", 2, {})
    pod["spec"]["nodeName"] = "h100-a1"
    placed = [
        ("Scheduled", "Successfully assigned default/train to h100-a1"),
        ("GPUPlacement", "2 GPUs on h100-a1: extender score 9/10, rank 1 of 4 candidates"),
    ]
    assert why(pod, placed) == "extender score 9/10, rank 1 of 4 candidates"
    assert why(pod, placed[:1]).startswith("placed; the extender's explanation has not")
    cpu = pod_manifest("web", 0, {})
    cpu["spec"]["nodeName"] = "cpu-c1"
    assert why(cpu, []) == "no GPUs asked: default scheduler; GPU nodes are tainted"
    pending = pod_manifest("x", 1, {})
    assert why(pending, [("FailedScheduling", "0/6 nodes are available")]) == (
        "FailedScheduling: 0/6 nodes are available"
    )
    assert why(pending, []) == "pending"
    # A share names its GPU (the device plugin's pick, by the same fit rule).
    share = pod_manifest("infer", 0, {SHARE: "20"})
    assert share["spec"]["containers"][0]["resources"]["limits"] == {
        contract.RESOURCE_GPU_MEMORY: "20"
    }
    assert SHARE not in share["metadata"]["annotations"]
    share["spec"]["nodeName"] = "l40s-share-c3"
    event = "a 20 GiB share of GPU-l40s-share-c3-0 on l40s-share-c3: extender score 8/10"
    assert why(share, [("GPUPlacement", event)]) == "GPU-l40s-share-c3-0: extender score 8/10"
    (shared,) = [n for n in NODES if n.sharing]
    assert shared.share_units() == 2 * (46068 // 1024)


def test_a_node_labelled_for_shares_is_of_kind_shares():
    from extender.model import node_facts
    from extender.status import kind
    from tests.unit.test_extender_shares import shared_node

    assert kind(node_facts(shared_node("s1"))) == "shares"
    assert kind(node_facts(make_node("w", 8))) == "whole"
