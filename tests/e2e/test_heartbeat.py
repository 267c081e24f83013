"""The agent's heartbeat as a Lease, on the real control plane: the agent applies it
(owned by its pod), writes nothing to its Node while nothing changes, and its API
calls per hour are measured; when the agent leaves a node, the garbage collector
takes the Lease and a node its silent agent had closed is accepted again."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import requests
import yaml
from kubernetes import client

from gpu_scheduler import contract
from lab.processes import free_port
from lab.stack import NAMESPACE
from tests.e2e.kube import (
    core,
    create_node,
    create_pod,
    gpu_labels,
    pod_manifest,
    put_lease,
    read_lease,
    unique,
    wait_bound,
    wait_event,
)
from tests.e2e.scenarios import GPU_TAINT
from tests.e2e.test_agent_daemonset import h100_inventory
from tests.helpers import wait_for

# Accelerated for the test; the rates are scaled to the defaults (10m, 5m) below.
RESYNC_S, HEARTBEAT_S = 4, 2
WINDOW_S = 16


def agent_requests(port: int) -> dict[tuple[str, str], float]:
    """gpu_scheduler_agent_api_requests_total by (verb, resource), 2xx only."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "gpu_scheduler_agent_api_requests":
            continue
        for sample in family.samples:
            labels = sample.labels
            if sample.name.endswith("_total") and labels.get("code") == "2xx":
                found[(labels["verb"], labels["resource"])] = sample.value
    return found


def h100_node(stack, case: str) -> str:
    """An 8-GPU H100 node with the GPU taint, in its own case (pods select it)."""
    labels = gpu_labels(8, "NVIDIA-H100-80GB-HBM3", 81559)
    return create_node(stack, unique(case), case=case, gpus=8, labels=labels, taints=GPU_TAINT)


def agent_write_time(stack, node: str) -> list[str]:
    """When the agent's field manager last wrote the Node (managedFields, per subresource)."""
    fields = core(stack).read_node(node).metadata.managed_fields or []
    return sorted(str(e.time) for e in fields if e.manager == "gpu-scheduler-agent")


def test_the_agent_renews_a_lease_and_leaves_its_node_alone(stack, tmp_path: Path):
    """The Lease: named as the node, labelled, owned by the agent's pod, renewed. The
    old heartbeat annotation (an upgrade) is removed once. Then, over WINDOW_S of
    steady state: 0 Node writes, and the agent's calls scaled to the defaults."""
    node = create_node(
        stack,
        unique("beat"),
        case="beat",
        gpus=8,
        labels=gpu_labels(8, "NVIDIA-H100-80GB-HBM3", 81559),
        annotations={contract.ANN_LEGACY_HEARTBEAT: "2026-01-01T00:00:00Z"},
    )
    inventory = tmp_path / "gpus.yaml"
    inventory.write_text(yaml.safe_dump(h100_inventory(8)))
    port = free_port()
    agent = stack.start_agent(
        node,
        inventory,
        interval="1s",
        heartbeat_interval=f"{HEARTBEAT_S}s",
        extra=[f"--resync-interval={RESYNC_S}s", f"--port={port}"],
    )
    try:
        wait_for(lambda: read_lease(stack, node) is not None, 30, "the heartbeat Lease")
        lease = read_lease(stack, node)
        stand_in = core(stack).read_namespaced_pod(f"gpu-scheduler-agent-{node}", NAMESPACE)
        assert lease.metadata.labels == {contract.LEASE_LABEL: contract.LEASE_LABEL_VALUE}
        assert [(o.kind, o.name, o.uid) for o in lease.metadata.owner_references] == [
            ("Pod", stand_in.metadata.name, stand_in.metadata.uid)
        ]
        assert lease.spec.holder_identity == node
        assert lease.spec.lease_duration_seconds == 3 * HEARTBEAT_S
        first = lease.spec.renew_time
        wait_for(lambda: read_lease(stack, node).spec.renew_time > first, 15, "a renewal")
        wait_for(
            lambda: (
                contract.ANN_LEGACY_HEARTBEAT
                not in (core(stack).read_node(node).metadata.annotations or {})
            ),
            15,
            "the old heartbeat annotation removed",
        )

        # Steady state: measure a window.
        time.sleep(2)
        writes, before = agent_write_time(stack, node), agent_requests(port)
        version = core(stack).read_node(node).metadata.resource_version
        started = time.monotonic()
        time.sleep(WINDOW_S)
        after, elapsed = agent_requests(port), time.monotonic() - started
        assert agent_write_time(stack, node) == writes, "the agent wrote to its Node"
        assert core(stack).read_node(node).metadata.resource_version == version
        calls = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        assert calls.get(("patch", "node"), 0) == 0
        gets, leases = calls.get(("read", "node"), 0), calls.get(("apply", "lease"), 0)
        # Per interval, as configured (±1 for the window's edges).
        assert abs(gets - elapsed / RESYNC_S) <= 1.5, calls
        assert abs(leases - elapsed / HEARTBEAT_S) <= 1.5, calls
        # The share of intervals that made their call, scaled to the defaults (10m, 5m):
        # at most 3600/600 reads + 3600/300 applies = 18 an hour.
        per_hour = gets / elapsed * RESYNC_S * 6 + leases / elapsed * HEARTBEAT_S * 12
        print(
            f"\nagent API calls in {elapsed:.1f} s at resync {RESYNC_S}s, heartbeat "
            f"{HEARTBEAT_S}s: {calls}; scaled to the defaults (10m, 5m): {per_hour:.1f} per "
            "hour per node, 0 of them Node writes"
        )
        assert per_hour <= 18.5
        assert agent.alive(), agent.tail()
    finally:
        stack.cluster.stop_process(agent.name)


def test_a_node_whose_agent_is_gone_is_accepted_again(stack, tmp_path: Path):
    """The agent goes silent: its node gets no GPU pods. Then the agent leaves the node
    (its pod deleted, as when the DaemonSet's nodeSelector stops matching): the garbage
    collector deletes the Lease with the pod, and the node is accepted again. Before
    Leases, the last heartbeat annotation stayed on the Node and refused it forever."""
    case = "leftover"
    node = h100_node(stack, case)
    inventory = tmp_path / "gpus.yaml"
    inventory.write_text(yaml.safe_dump(h100_inventory(8)))
    agent = stack.start_agent(node, inventory, interval="1s", capacity=False)
    wait_for(lambda: read_lease(stack, node) is not None, 30, "the heartbeat Lease")
    stack.cluster.stop_process(agent.name)
    # The agent is silent for an hour (its Lease renewed an hour ago; owner kept).
    put_lease(stack, node, dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
    pod = unique("pod")
    create_pod(stack, pod_manifest(pod, 1, case=case))
    wait_event(stack, pod, "agent on this node is silent")

    stand_in = f"gpu-scheduler-agent-{node}"
    core(stack).delete_namespaced_pod(stand_in, NAMESPACE, grace_period_seconds=0)
    wait_for(lambda: read_lease(stack, node) is None, 60, "the garbage collector to take the Lease")
    # A Lease is not an event kube-scheduler watches; a change to the node is.
    core(stack).patch_node(node, {"metadata": {"labels": {"e2e-touched": "1"}}})
    assert wait_bound(stack, pod, timeout=60) == node


def test_leases_elsewhere_are_not_heartbeats(stack):
    """A Lease named as a node in another namespace (anyone's leader election) is not
    read: the node stays unmanaged and accepted."""
    case = "otherlease"
    node = h100_node(stack, case)
    old = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    client.CoordinationV1Api(stack.api).patch_namespaced_lease(
        node,
        "default",
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": node,
                "labels": {contract.LEASE_LABEL: contract.LEASE_LABEL_VALUE},
            },
            "spec": {"holderIdentity": node, "renewTime": old},
        },
        field_manager="e2e",
        _content_type="application/apply-patch+yaml",
    )
    pod = unique("pod")
    create_pod(stack, pod_manifest(pod, 1, case=case))
    assert wait_bound(stack, pod, timeout=60) == node
