"""While the webhook is down (failurePolicy Fail), the pods whose node is decided are
still created: a DaemonSet's pods, in the GPU Operator's namespace and in any other,
and a pod with spec.nodeName, all requesting nvidia.com/gpu. The matchConditions and
the namespaceSelector keep them from the webhook; a GPU pod the webhook would route is
still refused, so the exclusion is proven, not an open door. The webhook is started
again at the end, for the tests after."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_scheduler import contract
from tests.e2e.kube import create_pod, ensure_namespace, pod_manifest, unique
from tests.e2e.scenarios import TOLERATE_GPU, gpu_node
from tests.helpers import wait_for

OPERATOR_NAMESPACE = "gpu-operator"


def daemonset(name: str, case: str) -> dict[str, Any]:
    """A DaemonSet like the GPU Operator's validator: each pod requests one GPU and
    tolerates the GPU taint in its template (the DaemonSet controller decides where it
    runs from the template alone)."""
    pod = pod_manifest(name, 1, case=case, tolerations=TOLERATE_GPU)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]},
        },
    }


def pinned_node(pod: Any) -> str:
    """The node the DaemonSet controller pins its pod to (required node affinity on
    metadata.name)."""
    required = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    (term,) = required.node_selector_terms
    (field,) = term.match_fields
    assert field.key == "metadata.name" and field.operator == "In"
    (node,) = field.values
    return node


def _daemon_pods_everywhere(
    stack, namespace: str, case: str, nodes: set[str]
) -> tuple[float, float]:
    """Create the DaemonSet in ``namespace``; wait for one pod a node, each pinned to
    its node and bound there by the default scheduler. Returns the seconds from the
    DaemonSet's creation to every pod created, and to every pod bound."""
    core, apps = client.CoreV1Api(stack.api), client.AppsV1Api(stack.api)
    name = unique("validator")
    started = time.monotonic()
    apps.create_namespaced_daemon_set(namespace, daemonset(name, case))

    def pods() -> list[Any]:
        return core.list_namespaced_pod(namespace, label_selector=f"app={name}").items

    def seen() -> str:
        found = core.list_namespaced_event(namespace).items
        return str([e.message for e in found if name in (e.involved_object.name or "")][-5:])

    try:
        wait_for(lambda: len(pods()) == len(nodes), 60, f"{len(nodes)} daemon pods")
        created = time.monotonic() - started
        assert {pinned_node(p) for p in pods()} == nodes
        wait_for(lambda: {p.spec.node_name for p in pods()} == nodes, 60, "daemon pods bound")
        bound = time.monotonic() - started
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {[p.metadata.name for p in pods()]} {seen()}") from None
    for pod in pods():
        assert pod.spec.node_name == pinned_node(pod)
        assert pod.spec.scheduler_name == contract.DEFAULT_SCHEDULER  # never mutated
        (owner,) = pod.metadata.owner_references
        assert owner.kind == "DaemonSet" and owner.controller is True
    apps.delete_namespaced_daemon_set(name, namespace)
    return created, bound


def test_decided_pods_are_created_while_the_webhook_is_down(stack):
    core = client.CoreV1Api(stack.api)
    case = unique("outage")
    nodes = {gpu_node(stack, case, 2) for _ in range(2)}
    ensure_namespace(stack, OPERATOR_NAMESPACE)
    # Pods in a namespace are refused until its default ServiceAccount exists.
    wait_for(
        lambda: (
            core.list_namespaced_service_account(
                OPERATOR_NAMESPACE, field_selector="metadata.name=default"
            ).items
        ),
        60,
        f"the default ServiceAccount of {OPERATOR_NAMESPACE}",
    )
    stack.cluster.stop_process("webhook")
    try:
        # (d) The door is shut: a GPU pod the webhook would route is refused.
        with pytest.raises(ApiException) as refused:
            create_pod(stack, pod_manifest(unique("gpu"), 1, case=case))
        assert refused.value.status == 500 and "gpu-scheduler" in refused.value.body
        # (a) The GPU Operator's namespace, (b) any other: a DaemonSet's pods.
        took = {
            ns: _daemon_pods_everywhere(stack, ns, case, nodes)
            for ns in (OPERATOR_NAMESPACE, "default")
        }
        # (c) A pod with spec.nodeName, requesting a GPU: created, left as it was.
        pinned = create_pod(stack, pod_manifest(unique("pinned"), 1, node_name=sorted(nodes)[0]))
        assert pinned["spec"]["nodeName"] == sorted(nodes)[0]
        assert pinned["spec"]["schedulerName"] == contract.DEFAULT_SCHEDULER
        assert not pinned["spec"].get("tolerations") or not any(
            t.get("key") == contract.RESOURCE_GPU for t in pinned["spec"]["tolerations"]
        )
        # Still shut after all that.
        with pytest.raises(ApiException):
            create_pod(stack, pod_manifest(unique("gpu"), 1, case=case))
    finally:
        stack.start_webhook()
    print(
        "webhook down: DaemonSet pods (2 nodes) created in "
        + ", ".join(f"{ns} {c:.2f}s (bound {b:.2f}s)" for ns, (c, b) in took.items())
    )
    # Restored: a GPU pod is routed again.
    pod = create_pod(stack, pod_manifest(unique("gpu"), 1, case="no-such-nodes"))
    assert pod["spec"]["schedulerName"] == contract.SCHEDULER_NAME
