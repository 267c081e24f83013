"""``gpu-scheduler explain POD``: why a GPU pod landed where it did (the extender's
``GPUPlacement`` Event), or why it has not landed yet (kube-scheduler's
``FailedScheduling`` Events). Imports nothing heavy until it runs (the CLI's rule)."""

from __future__ import annotations

import argparse
from typing import Any

from gpu_scheduler.cli import fail


def pod_story(api_client: Any, namespace: str, name: str) -> str:
    """The pod's node and its placement Events, oldest first."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from extender.explain import REASON

    core = client.CoreV1Api(api_client)
    try:
        pod = core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise LookupError(f"pod {namespace}/{name} not found") from None
        raise
    events = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},involvedObject.kind=Pod"
    ).items
    uid = pod.metadata.uid
    mine = [e for e in events if not e.involved_object.uid or e.involved_object.uid == uid]
    mine.sort(key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp)
    node = pod.spec.node_name
    lines = [
        f"pod {namespace}/{name}: "
        + (f"on {node}" if node else "not placed yet")
        + f", scheduler {pod.spec.scheduler_name}"
    ]
    placed = [e for e in mine if e.reason == REASON]
    failed = [e for e in mine if e.reason == "FailedScheduling"]
    for event in placed:
        lines.append(f"  {event.reason}: {event.message}")
    if not placed:
        if node:
            lines.append(
                "  no GPUPlacement event: not scored by gpu-scheduler (no GPUs "
                "asked, another scheduler), or its event is rate-limited or expired"
            )
        for event in failed[-3:]:
            lines.append(f"  {event.reason}: {event.message}")
        if not node and any("node affinity" in (e.message or "") for e in failed[-3:]):
            lines += constraint_story(api_client, pod)
    if not node:
        lines += gang_story(api_client, pod)
    return "\n".join(lines)


def gang_story(api_client: Any, pod: Any) -> list[str]:
    """For a pending pod of a PodGroup (``spec.schedulingGroup``): kube-scheduler holds
    it before any scheduling attempt (so without an Event) while its group does not
    exist or has fewer than minCount pods; say which, and what the group reports."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from gpu_scheduler import podspec
    from gpu_scheduler.jsondecode import decode_json

    # The typed client's Pod has no schedulingGroup (newer than the client): read JSON.
    core = client.CoreV1Api(api_client)
    namespace = pod.metadata.namespace

    def group_of(raw: Any) -> str | None:
        try:
            return podspec.pod_group_name((raw or {}).get("spec") or {})
        except ValueError:
            return None

    raw = core.read_namespaced_pod(pod.metadata.name, namespace, _preload_content=False)
    group = group_of(decode_json(raw.data))
    if group is None:
        return []
    try:
        found = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            "scheduling.k8s.io", "v1beta1", namespace, "podgroups", group
        )
    except ApiException as exc:
        if exc.status == 404:
            return [
                f"  waiting for PodGroup {namespace}/{group}, which does not exist (or the "
                "API server does not serve scheduling.k8s.io/v1beta1): kube-scheduler "
                "holds its pods until it is created"
            ]
        raise
    gang = ((found.get("spec") or {}).get("schedulingPolicy") or {}).get("gang") or {}
    listed = core.list_namespaced_pod(namespace, _preload_content=False)
    count = sum(1 for p in decode_json(listed.data).get("items") or [] if group_of(p) == group)
    lines = [
        f"  a member of PodGroup {namespace}/{group} (minCount {gang.get('minCount', '-')}, "
        f"{count} pod(s) of it exist)"
    ]
    for condition in (found.get("status") or {}).get("conditions") or []:
        lines.append(
            f"  PodGroup {condition.get('type')}={condition.get('status')}: "
            f"{condition.get('reason', '')} {condition.get('message', '')}".rstrip()
        )
    return lines


def constraint_story(api_client: Any, pod: Any) -> list[str]:
    """For a pod refused by node affinity: the webhook writes its hard GPU constraints
    as node affinity, so kube-scheduler never asks the extender and its message names
    no constraint. The extender's own reasons against every node, counted, say which."""
    from collections import Counter

    from kubernetes import client

    from extender.config import ExtenderConfig
    from extender.engine import filter_nodes
    from extender.model import node_facts, pod_facts
    from extender.policies import build_policies
    from extender.view import View

    serialize = api_client.sanitize_for_serialization
    nodes = [node_facts(n) for n in serialize(client.CoreV1Api(api_client).list_node().items)]
    out = filter_nodes(
        pod_facts(serialize(pod)),
        [n.name for n in nodes],
        nodes,
        View(),  # no pods read: the constraints alone, against empty nodes
        build_policies(ExtenderConfig()),
    )
    reasons = Counter({**out.failed, **out.unresolvable}.values())
    if not reasons:
        return []
    lines = [f"  the pod's GPU constraints against the {len(nodes)} nodes (gpu-scheduler):"]
    lines += [f"    {count} node(s): {reason}" for reason, count in reasons.most_common(5)]
    return lines


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pod", metavar="POD", help="the pod's name")
    parser.add_argument("-n", "--namespace", default="default", help="its namespace")
    parser.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster or ~/.kube/config)")


def run(args: argparse.Namespace) -> int:
    from gpu_scheduler.kube import api_client

    try:
        print(pod_story(api_client(args.kubeconfig), args.namespace, args.pod))
    except LookupError as exc:
        return fail("explain", exc, 1)
    return 0
