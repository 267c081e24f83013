"""Path 1: pods mutated on creation by our webhook, through the real apiserver."""

from __future__ import annotations

import re
import ssl
import urllib.request

import pytest
from kubernetes.client.exceptions import ApiException

from gpu_scheduler import contract
from tests.e2e.kube import create_pod, pod_manifest, unique


def reviews_answered(stack) -> float:
    context = ssl.create_default_context(cafile=str(stack.cert_dir / "ca.crt"))
    url = f"https://127.0.0.1:{stack.webhook_port}/metrics"
    with urllib.request.urlopen(url, context=context, timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^gpu_scheduler_webhook_reviews_total\{[^}]*\} (\S+)$", text, re.M)
    )


def test_gpu_pod_is_stored_with_scheduler_and_toleration(stack):
    pod = create_pod(stack, pod_manifest(unique("gpu"), 2, case="no-such-nodes"))
    assert pod["spec"]["schedulerName"] == contract.SCHEDULER_NAME
    assert contract.GPU_TOLERATION in [
        {k: t.get(k) for k in ("key", "operator", "effect")} for t in pod["spec"]["tolerations"]
    ]


def test_cpu_pod_is_unchanged_and_never_reaches_the_webhook(stack):
    before = reviews_answered(stack)
    pod = create_pod(stack, pod_manifest(unique("cpu"), 0, case="no-such-nodes"))
    assert pod["spec"]["schedulerName"] == contract.DEFAULT_SCHEDULER
    assert not any(
        t.get("key") == contract.RESOURCE_GPU for t in pod["spec"].get("tolerations") or []
    )
    # a GPU pod right after is answered: the counter moves for it, not for the CPU pod
    assert reviews_answered(stack) == before
    create_pod(stack, pod_manifest(unique("gpu"), 1, case="no-such-nodes"))
    assert reviews_answered(stack) == before + 1


def test_opted_out_pod_is_unchanged(stack):
    pod = create_pod(
        stack,
        pod_manifest(
            unique("optout"),
            1,
            case="no-such-nodes",
            annotations={contract.ANN_SKIP_MUTATION: "true"},
        ),
    )
    assert pod["spec"]["schedulerName"] == contract.DEFAULT_SCHEDULER


def test_other_scheduler_is_kept_but_toleration_added(stack):
    pod = create_pod(
        stack, pod_manifest(unique("volcano"), 1, case="no-such-nodes", scheduler="volcano")
    )
    assert pod["spec"]["schedulerName"] == "volcano"
    assert any(t.get("key") == contract.RESOURCE_GPU for t in pod["spec"]["tolerations"])


def test_webhook_down_fails_gpu_pods_only(stack):
    """failurePolicy Fail, scoped by matchConditions: while the webhook is down GPU pods
    are refused (their controllers retry), and CPU pods are created as usual."""
    stack.cluster.stop_process("webhook")
    try:
        cpu = create_pod(stack, pod_manifest(unique("cpu"), 0, case="no-such-nodes"))
        assert cpu["spec"]["schedulerName"] == contract.DEFAULT_SCHEDULER
        with pytest.raises(ApiException) as refused:
            create_pod(stack, pod_manifest(unique("gpu"), 1, case="no-such-nodes"))
        assert refused.value.status == 500
        assert "gpu-scheduler" in refused.value.body
    finally:
        stack.start_webhook()
    pod = create_pod(stack, pod_manifest(unique("gpu"), 1, case="no-such-nodes"))
    assert pod["spec"]["schedulerName"] == contract.SCHEDULER_NAME


def test_decided_pods_keep_the_default_scheduler_while_the_extender_is_down(stack):
    """A GPU-requesting DaemonSet (the GPU Operator's validator is one) and a pod with
    spec.nodeName have their node decided: they never reach the webhook, keep the
    default scheduler, and are placed with our extender stopped."""
    from kubernetes import client, utils

    from tests.e2e.kube import create_node, gpu_labels
    from tests.e2e.scenarios import GPU_TAINT
    from tests.helpers import wait_for

    case = unique("decided")
    nodes = {
        create_node(
            stack,
            unique(case),
            case=case,
            gpus=2,
            taints=GPU_TAINT,
            labels=gpu_labels(2, "NVIDIA-L4", 23034),
        )
        for _ in range(2)
    }
    core, apps = client.CoreV1Api(stack.api), client.AppsV1Api(stack.api)
    stack.cluster.stop_process("extender")
    try:
        name = unique("validator")
        # Like the GPU Operator's DaemonSets, it tolerates the GPU taint in its template:
        # the DaemonSet controller decides where it runs from the template alone.
        pod = pod_manifest(name, 1, case=case, tolerations=[dict(contract.GPU_TOLERATION)])
        template = {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]}
        daemonset = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": name}}, "template": template},
        }
        utils.create_from_dict(stack.api, daemonset)

        def placed() -> dict[str, str]:
            pods = core.list_namespaced_pod("default", label_selector=f"app={name}").items
            return {p.spec.node_name: p.spec.scheduler_name for p in pods if p.spec.node_name}

        def seen() -> str:
            pods = core.list_namespaced_pod("default", label_selector=f"app={name}").items
            found = core.list_namespaced_event("default").items
            return f"{[(p.metadata.name, p.spec.node_name) for p in pods]} " + str(
                [e.message for e in found if name in (e.involved_object.name or "")][-5:]
            )

        try:
            wait_for(lambda: set(placed()) == nodes, 60, "a daemon pod bound on each GPU node")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {seen()}") from None
        assert set(placed().values()) == {contract.DEFAULT_SCHEDULER}
        pinned = create_pod(stack, pod_manifest(unique("pinned"), 1, node_name=sorted(nodes)[0]))
        assert pinned["spec"]["schedulerName"] == contract.DEFAULT_SCHEDULER
        # Never sent to the webhook (matchConditions): no toleration added either.
        assert not any(
            t.get("key") == contract.RESOURCE_GPU for t in pinned["spec"].get("tolerations") or []
        )
        apps.delete_namespaced_daemon_set(name, "default")
    finally:
        stack.start_extender(tls=True)
