"""The kubelet's part the tests need, without a kubelet: Node objects as a kubelet
registers them (:func:`node_object`), and :class:`KubeletShim`, which copies a node's
extended-resource capacity into allocatable as the kubelet does."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from gpu_scheduler import contract
from gpu_scheduler.kube import json_pointer_token

log = logging.getLogger(__name__)
REAL_PROVIDER = "lab://"  # spec.providerID of the nodes lab.realnode's kubelets run


class KubeletShim:
    """Plays the one part of the kubelet the tests need: once a node's status capacity
    carries ``nvidia.com/gpu`` (the agent's JSON patch), copy it into allocatable, as
    the kubelet does for extended resources. Runs a watch in a daemon thread."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet-shim", daemon=True)

    def start(self) -> KubeletShim:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def sync(self, node: Mapping[str, Any]) -> bool:
        if str((node.get("spec") or {}).get("providerID", "")).startswith(REAL_PROVIDER):
            return False  # a real kubelet runs this node (lab.realnode)
        status = node.get("status") or {}
        capacity = (status.get("capacity") or {}).get(contract.RESOURCE_GPU)
        allocatable = (status.get("allocatable") or {}).get(contract.RESOURCE_GPU)
        if capacity == allocatable:
            return False
        path = "/status/allocatable/" + json_pointer_token(contract.RESOURCE_GPU)
        if capacity is None:
            op = {"op": "remove", "path": path}
        else:
            op = {"op": "add", "path": path, "value": capacity}
        ops = [op]
        if not status.get("allocatable"):  # (capacity is set: None == None returned above)
            ops.insert(0, {"op": "add", "path": "/status/allocatable", "value": {}})
        self.core.patch_node_status(node["metadata"]["name"], ops)
        return True

    def _run(self) -> None:
        from gpu_scheduler.kube import watch_events

        while not self._stop.is_set():
            try:
                for event, obj in watch_events(self.core.list_node, timeout_seconds=60):
                    if event in ("ADDED", "MODIFIED"):
                        self.sync(obj)
                    if self._stop.is_set():
                        return
            except Exception as exc:
                if not self._stop.is_set():  # the apiserver going away at stop is expected
                    log.warning("kubelet shim watch failed: %r", exc)
                self._stop.wait(1)


def node_object(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    gpus: int | None = None,
    cpu: str = "32",
    memory: str = "256Gi",
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A Node as a kubelet would register it (Ready, with capacity and allocatable).

    ``gpus`` sets ``nvidia.com/gpu`` capacity and allocatable directly (as if a device
    plugin had advertised them); leave it None to let the agent publish capacity.
    """
    resources = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus is not None:
        resources[contract.RESOURCE_GPU] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                **(labels or {}),
            },
            "annotations": dict(annotations or {}),
        },
        "spec": {"taints": list(taints or [])},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "node created by gpu-scheduler's local cluster",
                }
            ],
        },
    }
