"""``gpu-scheduler status``: the cluster's GPUs as the extender sees them, one row a node.

It fills the extender's own cache from one list of each kind (Nodes, bound Pods and,
where the cluster serves them, DeviceClasses, ResourceSlices and ResourceClaims), so
the numbers are the extender's numbers: device-plugin nodes and DRA nodes, whole,
shared (time-slicing, MPS) and MIG GPUs alike.

Like every subcommand module it imports nothing heavy at the top: the parser imports
it, and the servers must choose their metrics store before prometheus_client loads.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from gpu_scheduler import contract
from gpu_scheduler.jsondecode import decode_json
from gpu_scheduler.table import render_table

if TYPE_CHECKING:
    from extender.model import NodeFacts
    from extender.view import View

COLUMNS = (
    "NODE",
    "PRODUCT",
    "MEM/GPU",
    "KIND",
    "GPUS",
    "HEALTHY",
    "USED",
    "FREE",
    "ZONE",
    "CAPACITY",
    "AGENT",
)


def kind(facts: NodeFacts) -> str:
    """How the node's GPUs are offered: whole, shares (of GiB, our device plugin's),
    shared xN, MIG or DRA."""
    if facts.dra:
        return "DRA"
    if facts.shared is not None:
        return "shares"
    if facts.replicas > 1:
        return f"shared x{facts.replicas}"
    if facts.product and contract.MIG_PART in facts.product:
        return "MIG"
    return "whole" if facts.allocatable or facts.labelled_gpu else "-"


def healthy(facts: NodeFacts) -> str:
    """GPUs a pod can be given, where the node's agent says some are sick: ``7``; ``-``
    where the agent reports none sick or does not manage the node."""
    return str(facts.usable) if facts.unhealthy else "-"


def age(beat: float | None, now: float) -> str:
    if beat is None:
        return "-"
    seconds = now - beat
    if seconds < 120:
        return f"{int(seconds)}s ago"
    if seconds < 7200:
        return f"{int(seconds // 60)}m ago"
    return f"{int(seconds // 3600)}h ago"


def inventory_rows(view: View, now: float) -> list[tuple[str, ...]]:
    rows = []
    for name in sorted(view.nodes):
        facts = view.nodes[name]
        taken = view.used_gpus(name)
        rows.append(
            (
                name,
                facts.product or "-",
                f"{facts.memory_mib} MiB" if facts.memory_mib else "-",
                kind(facts),
                str(facts.allocatable),
                healthy(facts),
                str(taken),
                str(max(view.free_gpus(facts), 0)),
                facts.zone or "-",
                facts.capacity_type or "-",
                age(facts.heartbeat, now),
            )
        )
    return rows


def _items(call: Any, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    response = call(*args, _preload_content=False, **kwargs)
    return decode_json(response.data).get("items") or []


def cluster_status(api_client: Any, namespace: str = "gpu-scheduler") -> str:
    """The inventory table as the extender would see it; AGENT is the age of each
    node's heartbeat Lease in ``namespace`` (the install's)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from extender.cache import ClusterCache
    from extender.sources import POD_FIELD_SELECTOR
    from gpu_scheduler import contract

    core = client.CoreV1Api(api_client)
    cache = ClusterCache()
    cache.replace_nodes(_items(core.list_node))
    cache.replace_pods(_items(core.list_pod_for_all_namespaces, field_selector=POD_FIELD_SELECTOR))
    try:
        cache.replace_leases(
            _items(
                client.CoordinationV1Api(api_client).list_namespaced_lease,
                namespace,
                label_selector=contract.LEASE_SELECTOR,
            )
        )
    except ApiException as exc:
        if exc.status != 403:  # not ours to read: AGENT stays "-"
            raise
    resource = client.ResourceV1Api(api_client)
    try:
        cache.replace_device_classes(_items(resource.list_device_class))
        cache.replace_slices(_items(resource.list_resource_slice))
        cache.replace_claims(_items(resource.list_resource_claim_for_all_namespaces))
    except ApiException as exc:
        if exc.status not in (403, 404):  # no DRA here, or not ours to read
            raise
    try:
        cache.replace_taint_rules(_items(resource.list_device_taint_rule))
    except ApiException as exc:
        if exc.status not in (403, 404):  # before 1.37, or not ours to read
            raise
    rows = inventory_rows(cache.view(), time.time())
    total, taken, free = (
        sum(int(r[COLUMNS.index(column)]) for r in rows) for column in ("GPUS", "USED", "FREE")
    )
    summary = f"{len(rows)} nodes, {total} GPUs allocatable, {taken} in use, {free} free"
    return render_table(COLUMNS, rows) + "\n" + summary


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster or ~/.kube/config)")
    parser.add_argument(
        "--namespace",
        default="gpu-scheduler",
        help="the install's namespace, where the agents' heartbeat Leases are (default "
        "gpu-scheduler)",
    )


def run(args: argparse.Namespace) -> int:
    from gpu_scheduler.kube import api_client

    print(cluster_status(api_client(args.kubeconfig), args.namespace))
    return 0
