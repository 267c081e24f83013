"""Placements that explain themselves: a GPU pod placed by the real kube-scheduler
through our extender carries a GPUPlacement Event saying why that node, and
`gpu-scheduler explain` prints it."""

from __future__ import annotations

import subprocess

from lab.controlplane import ROOT
from lab.stack import CLI
from tests.e2e.kube import bind_pod, core, wait_bound, wait_event
from tests.e2e.scenarios import gpu_node, place


def explain(stack, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpu-scheduler explain ARGS` against the stack's cluster."""
    return subprocess.run(
        [*CLI, "explain", *args, f"--kubeconfig={stack.cluster.kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_a_placed_gpu_pod_says_why_that_node(stack):
    case = "explain"
    roomy = gpu_node(stack, case, 8)
    tight = gpu_node(stack, case, 2)
    bind_pod(stack, roomy, 2)  # a bound GPU pod: the workload mix is not empty
    pod = place(stack, case, 2)
    node = wait_bound(stack, pod)
    assert node == tight  # 2 of 2: nothing left to strand
    message = wait_event(stack, pod, "GPUPlacement")
    assert f"2 GPUs on {tight}: extender score" in message
    assert "rank 1 of 2 candidates" in message, message
    assert "fragmentation" in message and "gpu" in message
    assert f"Runner-up {roomy}" in message
    events = (
        core(stack)
        .list_namespaced_event(
            "default", field_selector=f"involvedObject.name={pod},reason=GPUPlacement"
        )
        .items
    )
    assert len(events) == 1 and events[0].source.component == "gpu-scheduler-extender"

    out = explain(stack, pod, "-n", "default")
    assert out.returncode == 0, out.stderr
    assert f"pod default/{pod}: on {tight}, scheduler gpu-scheduler" in out.stdout
    assert "GPUPlacement: 2 GPUs on" in out.stdout


def test_explain_says_why_a_pod_is_pending(stack):
    from gpu_scheduler import contract

    pod = place(stack, "explain-none", 1, annotations={contract.ANN_GPU_PRODUCTS: "NVIDIA-B300"})
    wait_event(stack, pod, "FailedScheduling")
    out = explain(stack, pod)
    assert "not placed yet" in out.stdout and "FailedScheduling" in out.stdout, out.stdout
    # Refused by the node affinity the webhook wrote; the constraint is named anyway.
    assert "GPU constraints against the" in out.stdout, out.stdout
    assert "is not one of gpu-scheduler.io/gpu-products=NVIDIA-B300" in out.stdout
    missing = explain(stack, "no-such-pod")
    assert missing.returncode == 1 and "not found" in missing.stderr
