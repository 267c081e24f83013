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


def test_kubectl_gpu_scheduler_explains_and_lists_as_a_read_only_user(stack):
    """The kubectl plugin (`kubectl-gpu_scheduler` on PATH, what the package installs)
    run by a user bound to deploy/viewer's roles and nothing else: `explain` and
    `status` answer from the user's kubeconfig, refused nothing."""
    import os
    import sys
    from pathlib import Path

    import yaml
    from kubernetes import client

    from lab.stack import NAMESPACE
    from tests.e2e.kube import ensure_namespace

    api = core(stack)
    rbac = client.RbacAuthorizationV1Api(stack.api)
    ensure_namespace(stack, NAMESPACE)
    for doc in yaml.safe_load_all((ROOT / "deploy" / "viewer" / "rbac.yaml").read_text()):
        if doc["kind"] == "ClusterRole":
            _apply(rbac.create_cluster_role, doc)
        else:
            _apply(rbac.create_namespaced_role, doc, namespace=NAMESPACE)
    _apply(api.create_namespaced_service_account, {"metadata": {"name": "alice"}}, "default")
    alice = [{"kind": "ServiceAccount", "name": "alice", "namespace": "default"}]
    _apply(
        rbac.create_cluster_role_binding,
        {
            "metadata": {"name": "gpu-viewer-alice"},
            "roleRef": _ref("ClusterRole", "gpu-scheduler-viewer"),
            "subjects": alice,
        },
    )
    _apply(
        rbac.create_namespaced_role_binding,
        {
            "metadata": {"name": "gpu-viewer-alice"},
            "roleRef": _ref("Role", "gpu-scheduler-viewer-heartbeats"),
            "subjects": alice,
        },
        namespace=NAMESPACE,
    )
    token = api.create_namespaced_service_account_token(
        "alice", "default", {"spec": {"expirationSeconds": 600}}
    ).status.token
    kubeconfig = stack.cluster.kubeconfig_with_token("alice", token)
    gpu_node(stack, "kubectl-plugin", 8)
    pod = place(stack, "kubectl-plugin", 1)
    wait_event(stack, pod, "GPUPlacement")
    plugins = Path(sys.executable).parent  # the venv's bin: kubectl-gpu_scheduler
    assert (plugins / "kubectl-gpu_scheduler").is_file(), "pip install -e . installs it"
    env = {**os.environ, "PATH": f"{plugins}:{os.environ.get('PATH', '')}"}
    env["KUBECONFIG"] = str(kubeconfig)  # the user's own, as kubectl reads it

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        command = [str(stack.cluster.binary), "kubectl", "gpu-scheduler", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)

    explained = kubectl("explain", pod, "-n", "default")
    assert explained.returncode == 0, explained.stderr
    assert "GPUPlacement: 1 GPU on" in explained.stdout, explained.stdout
    status = kubectl("status", "--namespace", NAMESPACE)
    assert status.returncode == 0, status.stderr
    assert "GPUs allocatable" in status.stdout and "orbidden" not in status.stderr
    # alice may read, and nothing more
    refused = subprocess.run(
        [str(stack.cluster.binary), "kubectl", "delete", "pod", pod, "-n", "default"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower()


def _ref(kind: str, name: str) -> dict[str, str]:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}


def _apply(create, body, namespace: str | None = None) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        create(namespace, body) if namespace else create(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
