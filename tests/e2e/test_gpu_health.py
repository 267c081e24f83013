"""A GPU that fails in service, on the real control plane: an 8-GPU node whose device
plugin still advertises 8; one GPU reports XID 79 (fallen off the bus) to the agent,
through the fake inventory's scripted XIDs. The agent publishes it at its next read,
the extender gives no pod the sick GPU and says which it is, and once the XID has
stopped for the agent's quiet period, the GPU is offered again and the pending pod
is placed (kube-scheduler retries it on the agent's Node patch; the extender reads the
node again if its watch has not delivered that patch yet)."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpu_scheduler import contract
from tests.e2e.kube import (
    core,
    create_node,
    create_pod,
    delete_pod,
    gpu_labels,
    pod_manifest,
    read_lease,
    unique,
    wait_bound,
    wait_event,
)
from tests.e2e.scenarios import GPU_TAINT
from tests.e2e.test_agent_daemonset import h100_inventory
from tests.helpers import wait_for


def test_a_sick_gpu_is_not_offered_and_is_again_once_it_recovers(stack, tmp_path: Path):
    case = unique("sick")
    labels = gpu_labels(8, "NVIDIA-H100-80GB-HBM3", 81559)
    # allocatable 8 as the device plugin advertises it; the agent does not touch it
    node = create_node(stack, unique("sick"), case=case, gpus=8, labels=labels, taints=GPU_TAINT)
    inventory = tmp_path / "gpus.yaml"
    inventory.write_text(yaml.safe_dump(h100_inventory(8)))
    agent = stack.start_agent(
        node, inventory, interval="1s", capacity=False, extra=["--recovery-quiet-period=4s"]
    )

    def annotation() -> str:
        return (core(stack).read_node(node).metadata.annotations or {}).get(contract.ANN_GPUS, "")

    try:
        wait_for(lambda: read_lease(stack, node) is not None, 30, "the agent's Lease")
        wait_for(lambda: '"healthy":false' not in annotation() and annotation(), 30, "GPUs read")
        sick = h100_inventory(8)
        sick["gpus"][3]["xid"] = 79
        inventory.write_text(yaml.safe_dump(sick))
        wait_for(lambda: '"xid":79' in annotation(), 30, "GPU-e2e-3's XID published")
        assert _labels(stack, node)[contract.LABEL_GPUS_UNHEALTHY] == "1"

        whole = unique("eight")
        create_pod(stack, pod_manifest(whole, 8, case=case))
        message = wait_event(stack, whole, "7 of 8 GPUs healthy")
        assert "GPU-e2e-3 (GPU lost: XID 79 (GPU has fallen off the bus); since " in message
        seven = unique("seven")
        create_pod(stack, pod_manifest(seven, 7, case=case))
        assert wait_bound(stack, seven) == node
        delete_pod(stack, seven)
        wait_for(lambda: not _exists(stack, seven), 30, "the 7-GPU pod gone")
        assert core(stack).read_namespaced_pod(whole, "default").spec.node_name is None

        inventory.write_text(yaml.safe_dump(h100_inventory(8)))  # the XID stops: recovery
        # The agent's patch (annotation, and the gpus-unhealthy label going) makes
        # kube-scheduler retry the pending pod at once, often before the extender's
        # watch has the patch: filter then reads the node again (extender/recheck.py)
        # rather than park the pod until the next cluster event or the 5-minute flush.
        wait_for(lambda: contract.LABEL_GPUS_UNHEALTHY not in _labels(stack, node), 30, "label")
        assert wait_bound(stack, whole, timeout=60) == node
        assert agent.alive(), agent.tail()
    finally:
        stack.cluster.stop_process(agent.name)


def _labels(stack, node: str) -> dict[str, str]:
    return core(stack).read_node(node).metadata.labels or {}


def _exists(stack, name: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        core(stack).read_namespaced_pod(name, "default")
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True
