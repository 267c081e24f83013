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
