"""``gpu-scheduler status``: the cluster's GPU inventory and allocation, one row a node."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpu_scheduler import contract
from gpu_scheduler.fields import FieldError
from gpu_scheduler.quantity import QuantityError, parse_quantity
from gpu_scheduler.timestamps import rfc3339_seconds

COLUMNS = ("NODE", "PRODUCT", "MEM/GPU", "GPUS", "USED", "FREE", "ZONE", "CAPACITY", "AGENT")


def _gpus(value: Any) -> int:
    try:
        return int(parse_quantity(value)) if value is not None else 0
    except QuantityError:
        return 0


def used_gpus(pods: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """GPUs requested by bound, non-terminal pods, per node."""
    used: dict[str, int] = {}
    for pod in pods:
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in contract.TERMINAL_PHASES:
            continue
        try:
            gpus = contract.pod_gpu_request(spec)
        except FieldError:
            continue
        if gpus:
            used[node] = used.get(node, 0) + gpus
    return used


def _age(stamp: str | None, now: float) -> str:
    if not stamp:
        return "-"
    beat = rfc3339_seconds(stamp)
    if beat is None:
        return "unreadable"
    seconds = now - beat
    if seconds < 120:
        return f"{int(seconds)}s ago"
    if seconds < 7200:
        return f"{int(seconds // 60)}m ago"
    return f"{int(seconds // 3600)}h ago"


def inventory_rows(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], now: float
) -> list[tuple[str, ...]]:
    used = used_gpus(pods)
    rows = []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        meta = node["metadata"]
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        name = meta["name"]
        total = _gpus(
            ((node.get("status") or {}).get("allocatable") or {}).get(contract.RESOURCE_GPU)
        )
        memory = contract.node_gpu_memory_mib(labels)
        taken = used.get(name, 0)
        rows.append(
            (
                name,
                labels.get(contract.LABEL_GPU_PRODUCT, "-"),
                f"{memory} MiB" if memory else "-",
                str(total),
                str(taken),
                str(max(total - taken, 0)),
                labels.get(contract.LABEL_ZONE, "-"),
                contract.capacity_type(labels) or "-",
                _age(annotations.get(contract.ANN_HEARTBEAT), now),
            )
        )
    return rows


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def cluster_status(api_client: Any) -> str:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    nodes = api_client.sanitize_for_serialization(core.list_node().items)
    pods = api_client.sanitize_for_serialization(
        core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=").items
    )
    rows = inventory_rows(nodes, pods, time.time())
    total = sum(int(r[3]) for r in rows)
    taken = sum(int(r[4]) for r in rows)
    summary = f"{len(rows)} nodes, {total} GPUs allocatable, {taken} in use, {total - taken} free"
    return render_table(COLUMNS, rows) + "\n" + summary


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster or ~/.kube/config)")


def run(args: argparse.Namespace) -> int:
    from gpu_scheduler.kube import api_client

    print(cluster_status(api_client(args.kubeconfig)))
    return 0
