from gpu_scheduler import contract
from gpu_scheduler.demo import NODES, PODS, inventory, pod_manifest, why
from gpu_scheduler.status import COLUMNS, inventory_rows, render_table, used_gpus
from tests.factories import make_node, make_pod

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def test_inventory_rows_count_bound_running_pods_only():
    nodes = [
        make_node(
            "b",
            8,
            product="NVIDIA-H100-80GB-HBM3",
            memory_mib=81559,
            zone="z",
            capacity_type="SPOT",
            heartbeat="2027-01-15T07:59:00Z",
        ),
        make_node("a"),
    ]
    pods = [
        make_pod("r", 3, node="b", phase="Running"),
        make_pod("done", 8, node="b", phase="Succeeded"),
        make_pod("pending", 8),
    ]
    assert used_gpus(pods) == {"b": 3}
    rows = inventory_rows(nodes, pods, NOW)
    assert rows[0] == ("a", "-", "-", "0", "0", "0", "-", "-", "-")
    assert rows[1] == (
        "b",
        "NVIDIA-H100-80GB-HBM3",
        "81559 MiB",
        "8",
        "3",
        "5",
        "z",
        "spot",
        "60s ago",
    )
    table = render_table(COLUMNS, rows)
    assert table.splitlines()[0].startswith("NODE")
    assert len(table.splitlines()) == 3


def test_demo_inventories_and_explanations():
    gpu_nodes = [n for n in NODES if n.gpu]
    assert all(len(inventory(n)["gpus"]) == n.count for n in gpu_nodes)
    node = make_node("h", 8, product="NVIDIA-L4", memory_mib=23034, zone="zone-c")
    for name, gpus, annotations, _ in PODS:
        pod = pod_manifest(name, gpus, annotations)
        pod["spec"]["schedulerName"] = contract.SCHEDULER_NAME
        text = why(pod, node, [])
        assert text
    assert "FailedScheduling" in why(pod_manifest("x", 1, {}), None, ["FailedScheduling: nope"])
