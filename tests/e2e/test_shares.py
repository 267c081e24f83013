"""Shares of a GPU through the gpu-scheduler profile, on the real control plane, with
sharing nodes as the agent publishes them (its per-GPU annotation, the sharing label,
``gpu-scheduler.io/gpu-memory`` allocatable) and no kubelet: what the scheduler
decides, not what the device plugin gives (tests/e2e/test_real_node_sharing.py runs
that on a real node).

- shares go by best fit, GPU by GPU, onto the sharing node only, and a pod that fits
  the node's total free memory but no single GPU waits with the largest free piece
  in its reason;
- a high-priority share that fits the node's total but no GPU, beside a whole-GPU
  training pod and a share: the plugins path evicts one of them; the extender path
  cannot, since kube-scheduler asks the extender only about victims its own count
  needs.

The scenarios take a stack: tests/e2e/test_plugins_path.py runs them on the plugins
path too.
"""

from __future__ import annotations

import json
import time

from gpu_scheduler import contract, sharing
from tests.e2e.kube import (
    core,
    create_node,
    create_pod,
    pod_manifest,
    unique,
    wait_bound,
    wait_event,
)
from tests.e2e.scenarios import GPU_TAINT, H100
from tests.e2e.test_preemption import HIGH, LOW, alive, priority_classes

GIB = 80  # units of each GPU here: an 80 GiB GPU


def sharing_node(stack, case: str, gpus: int = 2) -> tuple[str, list[str]]:
    """A tainted node whose agent shares ``gpus`` GPUs of 80 GiB (MPS); its name and its
    GPUs' UUIDs."""
    name = unique("share")
    uuids = [f"GPU-{name}-{i}" for i in range(gpus)]
    entries = [
        {"index": i, contract.GPU_UUID: uuid, contract.GPU_MEMORY_MIB: GIB * sharing.UNIT_MIB,
         contract.GPU_HEALTHY: True}
        for i, uuid in enumerate(uuids)
    ]  # fmt: skip
    labels = {
        contract.LABEL_GPU_PRESENT: "true", contract.LABEL_GPU_PRODUCT: H100[0],
        contract.LABEL_GPU_MEMORY: str(GIB * sharing.UNIT_MIB),
        contract.LABEL_GPU_COUNT: str(gpus), contract.LABEL_GPU_SHARING: "mps",
    }  # fmt: skip
    create_node(
        stack, name, case=case, gpus=gpus, labels=labels, taints=GPU_TAINT,
        annotations={contract.ANN_GPUS: json.dumps(entries)},
    )  # fmt: skip
    units = str(gpus * GIB)
    core(stack).patch_node_status(name, {"status": {
        "capacity": {contract.RESOURCE_GPU_MEMORY: units},
        "allocatable": {contract.RESOURCE_GPU_MEMORY: units},
    }})  # fmt: skip
    return name, uuids


def share(
    stack, case: str | None, units: int, *, node: str | None = None, priority: str | None = None
) -> str:
    """A pod asking ``units`` GiB of one GPU: placed by the scheduler (``case``), or
    already bound to ``node`` as if placed earlier."""
    name = unique("share")
    manifest = pod_manifest(name, case=case, node_name=node)
    (container,) = manifest["spec"]["containers"]
    container["resources"]["limits"] = {contract.RESOURCE_GPU_MEMORY: str(units)}
    if priority:
        manifest["spec"]["priorityClassName"] = priority
    created = create_pod(stack, manifest)
    if node is None:
        assert created["spec"]["schedulerName"] == contract.SCHEDULER_NAME
    return name


def shares_fit_gpu_by_gpu(stack) -> None:
    case = unique("shares")
    node, uuids = sharing_node(stack, case)
    create_node(stack, unique("whole"), case=case, gpus=8, taints=GPU_TAINT, labels={
        contract.LABEL_GPU_PRESENT: "true", contract.LABEL_GPU_PRODUCT: H100[0]})  # fmt: skip
    for units in (20, 20, 50):  # GPU 0 takes 20 + 20 (best fit), GPU 1 the 50
        assert wait_bound(stack, share(stack, case, units)) == node
    big = share(stack, case, 60)  # 70 GiB free on the node, 40 and 30 by GPU
    reason = wait_event(stack, big, "FailedScheduling")
    assert (
        f"no single GPU has 60 GiB free: the largest free piece is 40 GiB on {uuids[0]} "
        "(70 GiB free on 2 GPUs); pod asks 60 GiB"
    ) in reason, reason
    # the whole-GPU node advertises no gpu-memory: kube-scheduler's own fit refuses it
    assert "Insufficient gpu-scheduler.io/gpu-memory" in reason, reason


def share_preempts_a_whole_gpu(stack, *, preempts: bool) -> None:
    """GPU 0 is held whole by a training pod, GPU 1 holds a share of 60: an inference
    share of 40 fits neither, though the node's total does. With the plugins
    (``preempts``), DefaultPreemption's what-if runs GPUScheduler's Filter: one of the
    two is evicted (either leaves a GPU the share fits; kube-scheduler's order of
    equals decides which). On the extender path, kube-scheduler's own count finds the pod
    fitting with every pod put back, so it has no candidate to ask the extender about
    (1.37 reports it as "expected at least one victim pod"): the pod waits and nothing
    is evicted."""
    priority_classes(stack)
    case = unique("share-preempt")
    node, _ = sharing_node(stack, case)
    training = unique("train")
    manifest = pod_manifest(training, 1, node_name=node)
    manifest["spec"]["priorityClassName"] = LOW
    create_pod(stack, manifest)
    kept = share(stack, None, 60, node=node, priority=LOW)
    urgent = share(stack, case, 40, priority=HIGH)
    if preempts:  # one victim, either: with it gone the share fits a GPU
        assert wait_bound(stack, urgent, timeout=90) == node
        assert len(alive(stack, [training, kept])) == 1
        return
    wait_event(stack, urgent, "no single GPU has 40 GiB free")
    time.sleep(10)  # kube-scheduler retries the pod meanwhile
    assert core(stack).read_namespaced_pod(urgent, "default").spec.node_name is None
    assert alive(stack, [training, kept]) == [training, kept]


def test_shares_fit_gpu_by_gpu_and_wait_with_the_largest_piece(stack):
    shares_fit_gpu_by_gpu(stack)


def test_a_share_blocked_by_a_whole_gpu_pod_waits_on_the_extender_path(stack):
    share_preempts_a_whole_gpu(stack, preempts=False)
