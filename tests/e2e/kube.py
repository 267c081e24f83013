"""Small helpers for the e2e tests: objects through the API, and waiting on them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_scheduler import contract
from lab.kubelet_shim import node_object

CASE_LABEL = "e2e.gpu-scheduler.io/case"


def core(stack) -> client.CoreV1Api:
    return client.CoreV1Api(stack.api)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def gpu_labels(gpus: int, product: str, memory_mib: int, **extra: str) -> dict[str, str]:
    return {
        contract.LABEL_GPU_PRESENT: "true",
        contract.LABEL_GPU_COUNT: str(gpus),
        contract.LABEL_GPU_PRODUCT: product,
        contract.LABEL_GPU_MEMORY: str(memory_mib),
        **extra,
    }


def create_node(stack, name: str, *, case: str, gpus: int | None = None, **kwargs: Any) -> str:
    labels = {CASE_LABEL: case, **kwargs.pop("labels", {})}
    core(stack).create_node(node_object(name, labels=labels, gpus=gpus, **kwargs))
    return name


def play_kubelet_with_device_plugin(stack, node: str, gpus: int) -> None:
    """What the kubelet writes when the NVIDIA device plugin registers ``gpus``."""
    value = str(gpus)
    patch = {
        "status": {
            "capacity": {contract.RESOURCE_GPU: value},
            "allocatable": {contract.RESOURCE_GPU: value},
        }
    }
    core(stack).patch_node_status(node, patch, field_manager="kubelet")


def server_minor(stack) -> int:
    """The API server's Kubernetes minor (37 for 1.37)."""
    return int(client.VersionApi(stack.api).get_code().minor.rstrip("+"))


def pod_manifest(
    name: str,
    gpus: int = 0,
    *,
    case: str | None = None,
    annotations: dict[str, str] | None = None,
    node_name: str | None = None,
    scheduler: str | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {contract.RESOURCE_GPU: str(gpus)}
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": resources}
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if case or node_selector:
        spec["nodeSelector"] = {**({CASE_LABEL: case} if case else {}), **(node_selector or {})}
    if node_name:
        spec["nodeName"] = node_name
    if scheduler:
        spec["schedulerName"] = scheduler
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": spec,
    }


def create_pod(stack, manifest: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    api = core(stack)
    api.create_namespaced_pod(namespace, manifest)
    return read_pod(stack, manifest["metadata"]["name"], namespace)


def bind_pod(stack, node: str, gpus: int, annotations: dict[str, str] | None = None) -> str:
    """A pod already running on ``node`` (bound directly, as if scheduled earlier)."""
    name = unique("running")
    create_pod(stack, pod_manifest(name, gpus, node_name=node, annotations=annotations))
    return name


def read_pod(stack, name: str, namespace: str = "default") -> dict[str, Any]:
    return stack.api.sanitize_for_serialization(core(stack).read_namespaced_pod(name, namespace))


def wait_bound(stack, name: str, namespace: str = "default", timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node = core(stack).read_namespaced_pod(name, namespace).spec.node_name
        if node:
            return node
        time.sleep(0.2)
    raise AssertionError(
        f"pod {namespace}/{name} not scheduled in {timeout}s: {events(stack, name)}"
    )


def events(stack, name: str, namespace: str = "default") -> list[str]:
    found = core(stack).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    )
    return [f"{e.reason}: {e.message}" for e in found.items]


def wait_event(
    stack, name: str, needle: str, namespace: str = "default", timeout: float = 60
) -> str:
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        seen = events(stack, name, namespace)
        for message in seen:
            if needle in message:
                return message
        time.sleep(0.5)
    raise AssertionError(f"no event with {needle!r} for {name} in {timeout}s; saw {seen}")


def delete_pod(stack, name: str, namespace: str = "default") -> None:
    try:
        core(stack).delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise


def ensure_namespace(stack, name: str) -> None:
    try:
        core(stack).create_namespace({"metadata": {"name": name}})
    except ApiException as exc:
        if exc.status != 409:
            raise


def install_certs(cluster: Any, out: Path, shims: Path) -> subprocess.CompletedProcess[str]:
    """deploy/install-certs.sh against ``cluster``, as an admin runs it: ``kubectl`` is
    the control-plane binary by another name, ``gpu-scheduler`` this checkout's CLI
    (both put on PATH from ``shims``)."""
    from lab.controlplane import ROOT

    if not shims.exists():
        shims.mkdir(parents=True)
        (shims / "kubectl").symlink_to(cluster.binary)
        cli = shims / "gpu-scheduler"
        cli.write_text(f'#!/bin/sh\nexec {sys.executable} -m gpu_scheduler.cli "$@"\n')
        cli.chmod(0o755)
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "PATH": f"{shims}:{os.environ['PATH']}",
    }
    return subprocess.run(
        ["bash", str(ROOT / "deploy" / "install-certs.sh"), str(out)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


def read_lease(stack, node: str) -> Any:
    """The agent's heartbeat Lease for ``node``, or None."""
    from lab.stack import NAMESPACE

    try:
        return client.CoordinationV1Api(stack.api).read_namespaced_lease(node, NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def put_lease(stack, node: str, renewed: Any) -> None:
    """Write ``node``'s heartbeat Lease as renewed at ``renewed`` (a datetime), as the
    agent would but with no owner (there is no agent pod to own it), by server-side
    apply as the admin."""
    from agent.heartbeat import PodIdentity, lease_object
    from lab.stack import NAMESPACE

    ensure_namespace(stack, NAMESPACE)
    body = lease_object(node, PodIdentity(NAMESPACE, "none", "none"), renewed, 300)
    del body["metadata"]["ownerReferences"]
    client.CoordinationV1Api(stack.api).patch_namespaced_lease(
        node,
        NAMESPACE,
        body,
        field_manager="e2e",
        force=True,
        _content_type="application/apply-patch+yaml",
    )
