"""A filter that picks (extender/choice.py) under the real kube-scheduler: a pod that
asks for no preferences costs one extender call, and kube-scheduler binds the node the
filter answered; a pod with a preference is weighed by kube-scheduler with prioritize;
a node Cluster Autoscaler marked for removal (PreferNoSchedule) is passed over."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpu_scheduler import contract
from tests.e2e.kube import (
    bind_pod,
    core,
    create_pod,
    delete_pod,
    pod_manifest,
    unique,
    wait_bound,
    wait_event,
)
from tests.e2e.scenarios import GPU_TAINT, gpu_node

CA_TAINT = {
    "key": "DeletionCandidateOfClusterAutoscaler",
    "value": "1",
    "effect": "PreferNoSchedule",
}


def lines_until(stack, pod: str, done: Callable[[list[dict[str, Any]]], bool]) -> list:
    """The extender's lines about ``pod`` once ``done`` says they are all there (its
    log is written after each answer)."""
    deadline = time.monotonic() + 10
    while True:
        found = calls(stack, pod)
        if done(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def calls(stack, pod: str) -> list[dict[str, Any]]:
    """The extender's log lines about ``pod`` (default namespace), in order."""
    log = stack.cluster.processes["extender"].log_path.read_text(errors="replace")
    out = []
    for line in log.splitlines():
        if f'"default/{pod}"' in line:
            record = json.loads(line)
            if record.get("pod") == f"default/{pod}":
                out.append(record)
    return out


@pytest.fixture
def made(stack) -> Iterator[list[str]]:
    """Pods a test makes, deleted after it: the GPU pods bound in the cluster weigh in
    the fragmentation policy's workload mix, which later modules' cases are set for."""
    names: list[str] = []
    yield names
    for name in names:
        delete_pod(stack, name)


def place(stack, case: str, gpus: int, **spec: Any) -> str:
    name = unique("pod")
    manifest = pod_manifest(name, gpus, case=case)
    manifest["spec"].update(spec)
    assert create_pod(stack, manifest)["spec"]["schedulerName"] == contract.SCHEDULER_NAME
    return name


def test_one_call_a_pod_and_kube_scheduler_binds_the_pick(stack, made):
    case = "pick"
    roomy = gpu_node(stack, case, 8)
    tight = gpu_node(stack, case, 2)
    made.append(bind_pod(stack, roomy, 2))
    pod = place(stack, case, 2)
    made.append(pod)
    assert wait_bound(stack, pod) == tight
    lines = lines_until(stack, pod, lambda ls: any(x["msg"] == "filter" for x in ls))
    verbs = [line["msg"] for line in lines]
    assert "prioritize" not in verbs, lines  # kube-scheduler skipped scoring
    (picked,) = [line for line in lines if line.get("chose")]
    assert picked["chose"] == tight and picked["picker"] == "extender"
    assert picked["passed"] == 2  # both fit; the answer held one


def test_a_pod_with_a_preference_is_weighed_by_kube_scheduler(stack, made):
    case = "prefer"
    roomy = gpu_node(stack, case, 8)
    gpu_node(stack, case, 2)
    made.append(bind_pod(stack, roomy, 2))
    preferred = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": [roomy]}
                        ]
                    },
                }
            ]
        }
    }
    pod = place(stack, case, 2, affinity=preferred)
    made.append(pod)
    wait_bound(stack, pod)
    lines = lines_until(stack, pod, lambda ls: any(x["msg"] == "prioritize" for x in ls))
    # filter passed both (its line says who picks, and why), then prioritize scored
    assert not any(line.get("chose") for line in lines)
    *_, filtered = [line for line in lines if line["msg"] == "filter"]
    assert filtered["picker"] == "kube-scheduler"
    assert filtered["preference"] == "preferred node affinity"
    assert [line for line in lines if line["msg"] == "prioritize"]


def test_a_node_marked_for_removal_is_passed_over(stack, made):
    case = "soft-taint"
    roomy = gpu_node(stack, case, 8)
    tight = gpu_node(stack, case, 2)  # binpack's choice, but Cluster Autoscaler's too
    made.append(bind_pod(stack, roomy, 2))
    core(stack).patch_node(tight, {"spec": {"taints": [*GPU_TAINT, CA_TAINT]}})
    # The extender's node watch delivers the patch in milliseconds; the pod below
    # reaches kube-scheduler through its own watch, and then the queue.
    time.sleep(1)
    pod = place(stack, case, 2)
    made.append(pod)
    assert wait_bound(stack, pod) == roomy
    wait_event(stack, pod, "PreferNoSchedule taint the pod does not tolerate")
