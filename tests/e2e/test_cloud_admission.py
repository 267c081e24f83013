"""The install on an API server that limits the critical priority classes, as GKE's
does: the ResourceQuota admission plugin's ``limitedResources`` admits pods of
``system-cluster-critical`` / ``system-node-critical`` outside kube-system only in a
namespace with a ResourceQuota whose scopeSelector names them (Kubernetes docs, "Limit
Priority Class consumption by default"). deploy/ carries that quota. With the agent's
gke platform (deploy/agent/platform/gke/: Google's drivers, no NVIDIA runtime) and no
RuntimeClass in the cluster, as on GKE, every pod of the install is created, the
agent's included."""

from __future__ import annotations

import os

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_scheduler import contract
from lab.controlplane import ROOT, start_control_plane
from lab.kubelet_shim import node_object
from lab.stack import NAMESPACE
from tests.helpers import wait_for

CRITICAL = ["system-node-critical", "system-cluster-critical"]
ADMISSION = {
    "apiVersion": "apiserver.config.k8s.io/v1",
    "kind": "AdmissionConfiguration",
    "plugins": [
        {
            "name": "ResourceQuota",
            "configuration": {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "ResourceQuotaConfiguration",
                "limitedResources": [
                    {
                        "resource": "pods",
                        "matchScopes": [
                            {"scopeName": "PriorityClass", "operator": "In", "values": CRITICAL}
                        ],
                    }
                ],
            },
        }
    ],
}


@pytest.fixture(scope="module")
def limited(tmp_path_factory, control_plane_binary):
    work = tmp_path_factory.mktemp("gke-admission")
    config = work / "admission.yaml"
    config.write_text(yaml.safe_dump(ADMISSION))
    cluster = start_control_plane(
        work / "cluster",
        control_plane_binary,
        apiserver_args=(f"--admission-control-config-file={config}",),
    )
    yield cluster
    cluster.stop()


def critical_pod(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "priorityClassName": "system-cluster-critical",
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


def gke_overlay(folder) -> str:
    """deploy/ with the agent's gke platform component, as a GKE admin's overlay."""
    folder.mkdir(exist_ok=True)
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "deploy", folder)],
        "components": [os.path.relpath(ROOT / "deploy" / "agent" / "platform" / "gke", folder)],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return str(folder)


def test_every_pod_of_the_install_is_created(limited, tmp_path):
    api = limited.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    # The controller manager makes the namespace's default ServiceAccount a moment after
    # start; until then any pod is refused for that, before the quota is consulted.
    wait_for(
        lambda: core.read_namespaced_service_account("default", "default") is not None,
        60,
        "the default ServiceAccount",
    )
    # The rule is on: a critical pod where no quota names the class is refused.
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("default", critical_pod("no-quota-here"))
    assert "insufficient quota to match these scopes" in refused.value.body
    # A GKE GPU node: GKE's accelerator label (no GFD, no NFD there), its GPU taint.
    labels = {contract.LABEL_GKE_ACCELERATOR: "nvidia-l4"}
    taints = [{"key": contract.RESOURCE_GPU, "value": "present", "effect": "NoSchedule"}]
    core.create_node(node_object("gpu-1", labels=labels, gpus=8, taints=taints))
    # No RuntimeClass at all: GKE's drivers come without the NVIDIA container runtime.
    assert not client.NodeV1Api(api).list_runtime_class().items
    limited.k8s("kubectl", "apply", "--server-side", "-k", gke_overlay(tmp_path / "gke"))

    deployments = apps.list_namespaced_deployment(NAMESPACE).items
    assert {d.metadata.name for d in deployments} >= {
        "gpu-scheduler",
        "gpu-scheduler-extender",
        "gpu-scheduler-webhook",
    }
    wanted = sum(d.spec.replicas for d in deployments) + 1  # + the agent on gpu-1

    def created() -> int:
        return len(core.list_namespaced_pod(NAMESPACE).items)

    def failures() -> list[str]:
        events = core.list_namespaced_event(NAMESPACE).items
        return [e.message for e in events if e.reason == "FailedCreate"]

    wait_for(lambda: created() == wanted, 90, f"{wanted} pods ({failures()})")
    assert wanted >= 7
    (agent,) = core.list_namespaced_pod(
        NAMESPACE, label_selector="app.kubernetes.io/name=gpu-scheduler-agent"
    ).items
    assert agent.spec.runtime_class_name is None
    assert {v.name: v.host_path.path for v in agent.spec.volumes if v.host_path} == {
        "nvidia-install-dir": "/home/kubernetes/bin/nvidia"
    }
    assert not [m for m in failures() if "RuntimeClass" in m]
    classes = {p.spec.priority_class_name for p in core.list_namespaced_pod(NAMESPACE).items}
    assert classes == set(CRITICAL)
    assert not [m for m in failures() if "insufficient quota" in m]
