"""The install on a real node: containerd, runc, CNI and a kubelet (lab.realnode).

deploy/ is applied as shipped with only a local overlay (our image's local name; the
agent's fake GPU inventory from a ConfigMap and the capacity component, since the
node has neither GPUs nor a device plugin; kube-scheduler and extender Deployments
at 0 replicas: the lab runs those two from the host). Then, with our images running
as pods:

- the agent DaemonSet's pod runs on the node and publishes its labels, annotations,
  heartbeat and capacity with its in-cluster token (through the confinement policy);
- the webhook Deployment's pods serve admission through their Service;
- a GPU pod created through the API is mutated by them, placed on the node by our
  profile, runs, succeeds, and the extender counts its GPU free again.

Where the machine cannot run a real node the module says exactly what is missing and
skips (CI: fails).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_scheduler import contract
from lab import realnode
from lab.controlplane import ROOT, start_control_plane
from lab.stack import NAMESPACE, Stack
from tests.e2e.kube import ensure_namespace, install_certs, read_lease, unique
from tests.e2e.test_agent_daemonset import h100_inventory
from tests.helpers import required, wait_for

NODE = "gpu-real-0"
#: The longest a fresh install may refuse GPU pods once its certificates exist.
WINDOW_AFTER_CERTIFICATES_S = 60
GPUS = 2
FAKE_GPUS = "/etc/gpu-scheduler-lab/gpus.yaml"


@pytest.fixture(scope="module")
def real(tmp_path_factory, control_plane_binary):
    reason = realnode.missing()
    if reason:
        required("the real node", reason)
    work = tmp_path_factory.mktemp("realnode")
    cluster = start_control_plane(work / "cluster", real_node=True)
    stack = Stack(cluster, work)
    node = None
    try:
        stack.api = cluster.api_client()
        node = realnode.start_real_node(cluster, NODE, {contract.LABEL_GPU_PRESENT: "true"})
        stack.start_extender()
        stack.start_schedulers()
        install(stack, work)
        yield stack
    except BaseException:
        print(cluster.failures())
        raise
    finally:
        cluster.stop()
        if node is not None:
            node.stop()
        left = realnode.leftovers()
    assert left == [], f"the real node left things on the host: {left}"


def overlay(work: Path) -> Path:
    """deploy/ plus the lab's local settings, as an admin's overlay would add them."""
    name, tag = realnode.images()["GPU_SCHEDULER_IMAGE"].rsplit(":", 1)
    folder = work / "overlay"
    folder.mkdir()
    (folder / "gpus.yaml").write_text(yaml.safe_dump(h100_inventory(GPUS)))
    agent = [
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--fake-gpus"},
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": FAKE_GPUS},
        {
            "op": "add",
            "path": "/spec/template/spec/volumes/-",
            "value": {"name": "lab-gpus", "configMap": {"name": "gpu-scheduler-lab-gpus"}},
        },
        {
            "op": "add",
            "path": "/spec/template/spec/containers/0/volumeMounts/-",
            "value": {"name": "lab-gpus", "mountPath": str(Path(FAKE_GPUS).parent)},
        },
    ]
    not_here = [{"op": "replace", "path": "/spec/replicas", "value": 0}]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "deploy", folder)],
        "components": [os.path.relpath(ROOT / "deploy" / "agent" / "capacity", folder)],
        "images": [{"name": "ghcr.io/gpu-scheduler/gpu-scheduler", "newName": name, "newTag": tag}],
        "generatorOptions": {"disableNameSuffixHash": True},
        "configMapGenerator": [
            {"name": "gpu-scheduler-lab-gpus", "namespace": NAMESPACE, "files": ["gpus.yaml"]}
        ],
        "patches": [
            {
                "target": {"kind": "DaemonSet", "name": "gpu-scheduler-agent"},
                "patch": yaml.safe_dump(agent),
            },
            {
                "target": {"kind": "Deployment", "name": "gpu-scheduler"},
                "patch": yaml.safe_dump(not_here),
            },
            {
                "target": {"kind": "Deployment", "name": "gpu-scheduler-extender"},
                "patch": yaml.safe_dump(not_here),
            },
        ],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return folder


@dataclass
class AdmissionProbe:
    """A GPU pod created (dry run) every 0.25 s from before the install until our
    webhook pod mutates one: how long a user's GPU pods are refused by a fresh
    install, and what they are told meanwhile."""

    api: Any
    started: float = field(default_factory=time.monotonic)
    outcomes: list[tuple[float, str, str]] = field(default_factory=list)  # (t, kind, text)
    marks: dict[str, float] = field(default_factory=dict)
    thread: threading.Thread | None = None

    def mark(self, what: str) -> None:
        self.marks[what] = time.monotonic() - self.started

    def start(self) -> AdmissionProbe:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        core = client.CoreV1Api(self.api)
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "first-minutes"},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"limits": {contract.RESOURCE_GPU: "1"}},
                    }
                ]
            },
        }
        while time.monotonic() - self.started < 300:
            at = time.monotonic() - self.started
            try:
                pod = core.create_namespaced_pod("default", body, dry_run="All")
            except ApiException as exc:
                self.outcomes.append((at, "refused", str(exc.body)[:300]))
            else:
                mutated = pod.spec.scheduler_name == contract.SCHEDULER_NAME
                self.outcomes.append((at, "mutated" if mutated else "unmutated", ""))
                if mutated:
                    return
            time.sleep(0.25)

    def first(self, kind: str) -> tuple[float, str] | None:
        return next(((t, text) for t, k, text in self.outcomes if k == kind), None)


PROBE: dict[str, AdmissionProbe] = {}


def install(stack: Stack, work: Path) -> None:
    cluster = stack.cluster
    probe = PROBE["install"] = AdmissionProbe(stack.api).start()
    # The agent's DaemonSet asks for the NVIDIA container runtime by RuntimeClass;
    # here plain runc stands in for it (there is no GPU to hand to the container).
    client.NodeV1Api(stack.api).create_runtime_class(
        client.V1RuntimeClass(metadata=client.V1ObjectMeta(name="nvidia"), handler="runc")
    )
    cluster.k8s("kubectl", "apply", "--server-side", "-k", str(overlay(work)))
    probe.mark("applied")
    done = install_certs(cluster, work / "certs", work / "bin")
    probe.mark("certificates")
    assert done.returncode == 0, done.stdout + done.stderr


def pods(stack: Stack, selector: str) -> list[Any]:
    return client.CoreV1Api(stack.api).list_namespaced_pod(NAMESPACE, label_selector=selector).items


def running_ready(pod: Any) -> bool:
    ready = [c.status for c in pod.status.conditions or [] if c.type == "Ready"]
    return pod.status.phase == "Running" and ready == ["True"]


def test_agent_pod_runs_on_the_real_node_and_publishes(real):
    core = client.CoreV1Api(real.api)

    def agent_ready() -> bool:
        found = pods(real, "app.kubernetes.io/name=gpu-scheduler-agent")
        return len(found) == 1 and found[0].spec.node_name == NODE and running_ready(found[0])

    wait_for(agent_ready, 180, "the agent DaemonSet's pod Running and Ready on the real node", 1)

    def published() -> bool:
        node = core.read_node(NODE)
        annotations = node.metadata.annotations or {}
        return (
            node.metadata.labels.get(contract.LABEL_GPU_COUNT) == str(GPUS)
            and contract.ANN_GPUS in annotations
            and node.status.capacity.get(contract.RESOURCE_GPU) == str(GPUS)
            and read_lease(real, NODE) is not None
        )

    wait_for(published, 60, "the agent's labels, annotations, capacity and Lease", 1)
    node = core.read_node(NODE)
    assert node.metadata.labels[contract.LABEL_GPU_PRODUCT] == "NVIDIA-H100-80GB-HBM3"
    assert contract.ANN_LEGACY_HEARTBEAT not in (node.metadata.annotations or {})
    # Written by the pod, with the pod's own token: the kubelet is the only other
    # writer of this Node, and it writes none of these.
    (agent,) = pods(real, "app.kubernetes.io/name=gpu-scheduler-agent")
    # Its heartbeat: the Lease named as the node, owned by the pod (through the
    # admission policy, which checks the owner against the token's pod claim).
    lease = read_lease(real, NODE)
    assert lease.metadata.labels == {contract.LEASE_LABEL: contract.LEASE_LABEL_VALUE}
    assert [(o.kind, o.uid) for o in lease.metadata.owner_references] == [
        ("Pod", agent.metadata.uid)
    ]
    assert lease.spec.holder_identity == NODE and lease.spec.renew_time is not None
    assert agent.spec.service_account_name == "gpu-scheduler-agent"
    assert agent.spec.containers[0].image == realnode.images()["GPU_SCHEDULER_IMAGE"]


def test_first_minutes_of_an_install(real):
    """From `kubectl apply -k` until the webhook's pods serve: GPU pods are refused
    (failurePolicy Fail) with the API server's reason, never let through unmutated
    once the webhook is registered, and the window closes soon after the
    certificates are published."""
    probe = PROBE["install"]
    assert probe.thread is not None
    probe.thread.join(240)
    mutated = probe.first("mutated")
    refused = probe.first("refused")
    assert mutated is not None, probe.outcomes[-3:]
    after_certs = mutated[0] - probe.marks["certificates"]
    print(
        f"\nfirst minutes: applied at {probe.marks['applied']:.1f} s, certificates at "
        f"{probe.marks['certificates']:.1f} s, GPU pods refused from "
        f"{refused[0] if refused else float('nan'):.1f} s to {mutated[0]:.1f} s "
        f"({after_certs:.1f} s after the certificates); "
        f"{sum(k == 'refused' for _, k, _ in probe.outcomes)} refusals; first: "
        f"{refused[1] if refused else '-'}"
    )
    # Once refused (the webhook is registered), never admitted unmutated again.
    kinds = [k for _, k, _ in probe.outcomes]
    if "refused" in kinds:
        assert "unmutated" not in kinds[kinds.index("refused") :], kinds
        assert "gpu-scheduler-webhook" in refused[1]
    assert after_certs < WINDOW_AFTER_CERTIFICATES_S


def test_gpu_pod_mutated_by_the_webhook_pod_placed_run_and_released(real):
    core = client.CoreV1Api(real.api)
    wait_for(
        lambda: (
            sum(
                running_ready(p) for p in pods(real, "app.kubernetes.io/name=gpu-scheduler-webhook")
            )
            == 2
        ),
        180,
        "both webhook pods Running and Ready",
        1,
    )
    wait_for(
        lambda: core.read_node(NODE).status.allocatable.get(contract.RESOURCE_GPU) == str(GPUS),
        120,
        "the real node's GPUs allocatable",
        1,
    )
    namespace = "real-node"
    ensure_namespace(real, namespace)
    name = unique("runs")
    image = realnode.images()["GPU_SCHEDULER_IMAGE"]
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "job",
                    "image": image,
                    "command": ["python3", "-c", "import time; time.sleep(6); print('done')"],
                    "resources": {"limits": {contract.RESOURCE_GPU: "1"}},
                }
            ],
        },
    }
    # The only webhook is the MutatingWebhookConfiguration from deploy/, whose client
    # config names the Service; nothing of ours serves admission from the host here.
    pod = core.create_namespaced_pod(namespace, manifest)
    assert pod.spec.scheduler_name == "gpu-scheduler"
    assert any(t.key == contract.RESOURCE_GPU for t in pod.spec.tolerations or [])

    def phase() -> str:
        return core.read_namespaced_pod(name, namespace).status.phase

    wait_for(lambda: phase() == "Running", 120, "the GPU pod Running on the real node", 0.5)
    assert core.read_namespaced_pod(name, namespace).spec.node_name == NODE
    two = {**manifest, "metadata": {"name": "probe", "namespace": namespace}}
    two["spec"] = {**manifest["spec"], "schedulerName": "gpu-scheduler"}
    two["spec"]["containers"] = [
        {
            **manifest["spec"]["containers"][0],
            "resources": {"limits": {contract.RESOURCE_GPU: str(GPUS)}},
        }
    ]

    def extender_filter() -> dict[str, Any]:
        body = {"Pod": two, "NodeNames": [NODE]}
        return requests.post(real.extender_url + "/filter", json=body, timeout=5).json()

    refused = extender_filter()
    assert refused["NodeNames"] == [], refused
    assert f"1 of {GPUS} GPUs free" in str(refused), refused
    wait_for(lambda: phase() == "Succeeded", 120, "the GPU pod Succeeded", 0.5)
    # The pod still exists (Succeeded), but its GPU is free again in the extender's view.
    wait_for(
        lambda: extender_filter()["NodeNames"] == [NODE], 30, "the extender to free the GPU", 0.5
    )
    assert core.read_namespaced_pod_log(name, namespace).strip() == "done"
