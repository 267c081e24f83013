"""Path 2 (the agent DaemonSet from deploy/ rolls out on GPU nodes only) and path 4
(the agent against the real API: labels, annotation, capacity; updates; no idle writes)."""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from kubernetes import client

from gpu_scheduler import contract
from lab.stack import NAMESPACE, deploy_documents
from tests.e2e.kube import create_node, ensure_namespace, read_lease, unique
from tests.helpers import wait_for

GPU_NODE_LABELS = (
    contract.LABEL_NFD_NVIDIA_PCI,
    contract.LABEL_GPU_PRESENT,
    contract.LABEL_EKS_ACCELERATOR,
    contract.LABEL_GKE_ACCELERATOR,
)


def h100_inventory(count: int, unhealthy: int = 0) -> dict:
    return {
        "driverVersion": "550.54.15",
        "cudaDriverVersion": "12.4",
        "gpus": [
            {
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": f"GPU-e2e-{i}",
                "memoryMiB": 81559,
                "computeCapability": "9.0",
                "migEnabled": False,
                "healthy": i >= unhealthy,
            }
            for i in range(count)
        ],
    }


def test_agent_publishes_updates_and_then_stays_quiet(stack, tmp_path: Path):
    core = client.CoreV1Api(stack.api)
    node = create_node(stack, unique("agent"), case="agent")
    inventory = tmp_path / "gpus.yaml"
    inventory.write_text(yaml.safe_dump(h100_inventory(8)))
    agent = stack.start_agent(node, inventory, interval="1s")

    def published(count: str) -> bool:
        n = core.read_node(node)
        return (
            n.metadata.labels.get(contract.LABEL_GPU_COUNT) == "8"
            and (n.status.capacity or {}).get(contract.RESOURCE_GPU) == count
            and (n.status.allocatable or {}).get(contract.RESOURCE_GPU) == count
        )

    wait_for(lambda: published("8"), 60, "labels and capacity from the agent")
    labels = core.read_node(node).metadata.labels
    assert labels[contract.LABEL_GPU_PRODUCT] == "NVIDIA-H100-80GB-HBM3"
    assert labels[contract.LABEL_GPU_MEMORY] == "81559"
    assert labels[contract.LABEL_GPU_FAMILY] == "hopper"
    annotations = core.read_node(node).metadata.annotations
    assert contract.ANN_GPUS in annotations
    assert contract.ANN_LEGACY_HEARTBEAT not in annotations  # a Lease now
    wait_for(lambda: read_lease(stack, node) is not None, 30, "the agent's heartbeat Lease")

    # a GPU turns unhealthy: capacity follows
    inventory.write_text(yaml.safe_dump(h100_inventory(8, unhealthy=1)))
    wait_for(lambda: published("7"), 60, "capacity 7 after a GPU turned unhealthy")

    # nothing changes: no write at all over several rounds
    time.sleep(2)
    version = core.read_node(node).metadata.resource_version
    time.sleep(5)
    assert core.read_node(node).metadata.resource_version == version
    assert agent.alive(), agent.tail()
    stack.cluster.stop_process(agent.name)


def test_agent_daemonset_runs_on_exactly_the_gpu_nodes(stack):
    core, apps = client.CoreV1Api(stack.api), client.AppsV1Api(stack.api)
    ensure_namespace(stack, NAMESPACE)
    case = unique("ds")
    gpu_nodes = {
        create_node(
            stack, unique("ds-gpu"), case=case, labels={contract.LABEL_GPU_PRESENT: "true"}
        ),
        create_node(
            stack, unique("ds-nfd"), case=case, labels={contract.LABEL_NFD_NVIDIA_PCI: "true"}
        ),
        create_node(
            stack,
            unique("ds-eks"),
            case=case,
            labels={contract.LABEL_EKS_ACCELERATOR: "nvidia-h100"},
        ),
        create_node(
            stack,
            unique("ds-gke"),
            case=case,
            labels={contract.LABEL_GKE_ACCELERATOR: "nvidia-l4"},
        ),
    }
    cpu_nodes = {create_node(stack, unique("ds-cpu"), case=case) for _ in range(2)}
    # The base asks for no RuntimeClass (agent.platform auto renders eks without a
    # cluster): the node's default runtime is nvidia; none exists here.
    for doc in deploy_documents("agent"):
        doc.setdefault("metadata", {})
        if doc["kind"] in ("ServiceAccount", "DaemonSet"):
            doc["metadata"]["namespace"] = NAMESPACE
        if doc["kind"] == "DaemonSet":
            doc["spec"]["template"]["spec"]["containers"][0]["image"] = "gpu-scheduler:e2e"
            name = doc["metadata"]["name"]
        _create(stack, doc)

    all_nodes = core.list_node().items
    expected = {
        n.metadata.name
        for n in all_nodes
        if any(key in (n.metadata.labels or {}) for key in GPU_NODE_LABELS)
    }
    assert gpu_nodes <= expected and not (cpu_nodes & expected)

    def rolled_out() -> bool:
        ds = apps.read_namespaced_daemon_set(name, NAMESPACE)
        return (ds.status.desired_number_scheduled or 0) == len(expected)

    wait_for(rolled_out, 60, "the DaemonSet's desiredNumberScheduled")

    def pods_placed() -> set[str]:
        pods = core.list_namespaced_pod(
            NAMESPACE, label_selector="app.kubernetes.io/name=gpu-scheduler-agent"
        )
        return {p.spec.node_name for p in pods.items if p.spec.node_name}

    wait_for(lambda: pods_placed() == expected, 90, "daemon pods bound to every GPU node")
    assert not (pods_placed() & cpu_nodes)


def _create(stack, doc: dict) -> None:
    from kubernetes import utils

    utils.create_from_dict(stack.api, doc)
