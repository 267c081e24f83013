"""Pods that ask a share of one GPU: routed as GPU pods, refused when no GPU could meet
the request or when they set what the device plugin sets."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from gpu_scheduler.contract import GPU_TOLERATION, RESOURCE_GPU, RESOURCE_GPU_MEMORY
from tests.factories import admission_review
from webhook import mutate
from webhook.admission import review
from webhook.config import WebhookConfig
from webhook.mutate import decide

CFG = WebhookConfig()


def share_pod(*requests: Any, env: list[dict[str, str]] | None = None, **spec: Any) -> dict:
    containers = []
    for i, value in enumerate(requests):
        container: dict[str, Any] = {
            "name": f"c{i}",
            "image": "cuda",
            "resources": {
                "limits": value if isinstance(value, dict) else {RESOURCE_GPU_MEMORY: value}
            },
        }
        if env is not None:
            container["env"] = env
        containers.append(container)
    body = {"containers": containers, **spec}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": body,
    }


def test_a_share_pod_is_routed_and_tolerates_the_gpu_taint() -> None:
    p = share_pod("20", 4)
    d = decide(p, CFG)
    assert d.outcome == mutate.MUTATED and d.gpus == 0 and d.shares == 24
    assert d.scheduler == "gpu-scheduler"
    assert "24 gpu-scheduler.io/gpu-memory" in d.warnings[0]
    out = jsonpatch.apply_patch(p, d.patch)
    assert out["spec"]["schedulerName"] == "gpu-scheduler"
    assert GPU_TOLERATION in out["spec"]["tolerations"]
    assert decide(out, CFG).patch == []  # idempotent


def test_whole_gpus_in_one_container_and_a_share_in_another_is_one_gpu_pod() -> None:
    d = decide(share_pod({RESOURCE_GPU: "1"}, "8"), CFG)
    assert d.outcome == mutate.MUTATED and d.gpus == 1 and d.shares == 8
    assert "1 nvidia.com/gpu and 8 gpu-scheduler.io/gpu-memory" in d.warnings[0]


def test_a_share_asked_before_whole_gpus_in_the_kubelets_order_is_refused() -> None:
    """Issue 49 item 9: the kubelet allocates container by container (init containers
    and sidecars, then app containers, in spec order) and the extender places a pod's
    whole GPUs first: a share before whole GPUs could land where the extender counted a
    whole GPU, so it is refused, saying how to write the pod instead."""
    d = decide(share_pod("8", {RESOURCE_GPU: "1"}), CFG)
    assert d.outcome == mutate.REFUSED
    assert "c0 asks gpu-scheduler.io/gpu-memory before container c1 asks" in d.detail
    assert "ask whole GPUs in the earlier containers" in d.detail
    sidecar = {
        "name": "side",
        "restartPolicy": "Always",
        "resources": {"limits": {RESOURCE_GPU_MEMORY: "4"}},
    }
    d = decide(share_pod({RESOURCE_GPU: "2"}, initContainers=[sidecar]), CFG)
    assert d.outcome == mutate.REFUSED and "side asks" in d.detail
    # Whole GPUs first (a plain init container's, or an earlier app container's): admitted.
    setup = {"name": "setup", "resources": {"limits": {RESOURCE_GPU: "1"}}}
    assert decide(share_pod("8", initContainers=[setup]), CFG).outcome == mutate.MUTATED
    assert decide(share_pod({RESOURCE_GPU: "1"}, "8", "4"), CFG).outcome == mutate.MUTATED


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        ("0", "asks 0"),
        ("16Gi", "write 16, not 16Gi"),
        ("5000", "more than any GPU has"),
        ("0.5", "whole number of GiB"),
        ({RESOURCE_GPU: "1", RESOURCE_GPU_MEMORY: "8"}, "not both"),
        ("lots", "cannot read its gpu-scheduler.io/gpu-memory request"),
        ("-3", "must not be negative"),
        ("1e999999", "gpu-scheduler.io/gpu-memory"),
    ],
)
def test_nonsense_is_refused_with_a_clear_admission_error(request_: Any, words: str) -> None:
    body = review(admission_review(share_pod(request_)), CFG)[0]["response"]
    assert body["allowed"] is False and body["status"]["code"] == 422
    assert words in body["status"]["message"]
    assert body["status"]["message"].startswith("gpu-scheduler: ")


@pytest.mark.parametrize(
    "name", ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "NVIDIA_VISIBLE_DEVICES", "GPU_SCHEDULER_GPU_UUID"]
)
def test_a_share_pod_may_not_set_what_the_device_plugin_sets(name: str) -> None:
    d = decide(share_pod("8", env=[{"name": "A", "value": "1"}, {"name": name, "value": "x"}]), CFG)
    assert d.outcome == mutate.REFUSED and f"sets {name}" in d.detail
    # A whole-GPU pod's env is its own business (NVIDIA's plugin reads its own rules).
    whole = share_pod({RESOURCE_GPU: "1"}, env=[{"name": name, "value": "x"}])
    assert decide(whole, CFG).outcome == mutate.MUTATED


def test_a_decided_pod_with_a_nonsense_share_is_still_left_alone() -> None:
    d = decide(share_pod("0", nodeName="n1"), CFG)
    assert d.outcome == mutate.NODE_DECIDED


def test_a_share_of_the_wrong_json_type_is_a_400() -> None:
    from gpu_scheduler.fields import FieldError

    with pytest.raises(FieldError):
        decide(share_pod({RESOURCE_GPU_MEMORY: ["8"]}), CFG)
