"""The agent's ServiceAccount is confined to its own Node and its own keys
(deploy/agent/admission-policy.yaml), on the real API server: requests made with a
token bound to a pod on node A, as the kubelet mounts it into the agent's pod."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from kubernetes import client

from agent.heartbeat import PodIdentity, lease_object
from gpu_scheduler import contract
from lab.controlplane import ROOT
from lab.stack import NAMESPACE
from tests.e2e.kube import create_node, ensure_namespace, read_lease, unique
from tests.e2e.test_agent_daemonset import h100_inventory
from tests.helpers import wait_for

AGENT_ACCOUNT = "gpu-scheduler-agent"
POLICY = ROOT / "deploy" / "agent" / "admission-policy.yaml"
RBAC = [
    ROOT / "deploy" / "agent" / "rbac.yaml",
    ROOT / "deploy" / "agent" / "capacity" / "rbac.yaml",
]


def _apply(stack, *paths: Path, delete: bool = False) -> None:
    args = ["kubectl", "delete" if delete else "apply", "-n", NAMESPACE]
    if delete:
        args.append("--ignore-not-found")
    for path in paths:
        args += ["-f", str(path)]
    stack.cluster.k8s(*args)


def _token(core: client.CoreV1Api, pod: Any | None) -> str:
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if pod is not None:
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.metadata.name,
            "uid": pod.metadata.uid,
        }
    review = core.create_namespaced_service_account_token(AGENT_ACCOUNT, NAMESPACE, {"spec": spec})
    return review.status.token


class AsAgent:
    """Node writes with the agent's token, as JSON merge patches."""

    def __init__(self, stack, token: str) -> None:
        self.server = stack.cluster.server
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.verify = str(stack.cluster.ca_file)
        self.session.headers["Authorization"] = f"Bearer {token}"

    def apply_lease(self, name: str, body: dict[str, Any]) -> requests.Response:
        """Server-side apply of a Lease in the install's namespace, as the agent does."""
        url = (
            f"{self.server}/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{name}"
            "?fieldManager=gpu-scheduler-agent&force=true"
        )
        return self.session.patch(
            url,
            data=json.dumps(body),
            headers={"Content-Type": "application/apply-patch+yaml"},
            timeout=10,
        )

    def patch(self, node: str, body: dict[str, Any], status: bool = False) -> requests.Response:
        url = f"{self.server}/api/v1/nodes/{node}" + ("/status" if status else "")
        return self.session.patch(
            url,
            data=json.dumps(body),
            headers={"Content-Type": "application/merge-patch+json"},
            timeout=10,
        )


def _denied(
    response: requests.Response, needle: str, policy: str = "gpu-scheduler-agent-own-node"
) -> None:
    assert response.status_code == 403, response.text
    message = response.json().get("message", "")
    assert policy in message and needle in message, message


@pytest.fixture(scope="module")
def confined(stack):
    """The agent's RBAC (with capacity) and the admission policy from deploy/, node A
    with a pod of the agent's ServiceAccount on it, node B, and tokens."""
    core = client.CoreV1Api(stack.api)
    ensure_namespace(stack, NAMESPACE)
    _apply(stack, *RBAC, POLICY)
    node_a = create_node(stack, unique("own"), case="confinement")
    node_b = create_node(stack, unique("other"), case="confinement")
    pod = _agent_pod(core, node_a)
    agent = AsAgent(stack, _token(core, pod))
    # The policy takes effect once the API server has compiled it and seen the binding.
    wait_for(
        lambda: (
            agent.patch(
                node_b, {"metadata": {"labels": {contract.LABEL_GPU_COUNT: "1"}}}
            ).status_code
            == 403
        ),
        30,
        "the admission policy to take effect",
        interval=0.5,
    )
    yield {"core": core, "agent": agent, "a": node_a, "b": node_b, "pod": pod}
    _apply(stack, *RBAC, POLICY, delete=True)
    core.delete_collection_namespaced_pod(NAMESPACE, label_selector="e2e=confinement")
    for node in (node_a, node_b):
        core.delete_node(node)


def _agent_pod(core: client.CoreV1Api, node: str) -> Any:
    """A pod of the agent's ServiceAccount bound to ``node`` (what the DaemonSet makes)."""
    return core.create_namespaced_pod(
        NAMESPACE,
        {
            "metadata": {"name": unique("agent"), "labels": {"e2e": "confinement"}},
            "spec": {
                "serviceAccountName": AGENT_ACCOUNT,
                "nodeName": node,
                "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}],
                "tolerations": [{"operator": "Exists"}],
            },
        },
    )


def test_own_labels_annotations_heartbeat_and_gpu_capacity_pass(confined):
    agent, a = confined["agent"], confined["a"]
    labels = {key: None for key in contract.AGENT_LABELS}
    labels |= {contract.LABEL_GPU_PRESENT: "true", contract.LABEL_GPU_COUNT: "8"}
    response = agent.patch(
        a,
        {
            "metadata": {
                "labels": labels,
                "annotations": {
                    contract.ANN_GPUS: "[]",
                    contract.ANN_LEGACY_HEARTBEAT: "2026-11-30T00:00:00Z",
                },
            }
        },
    )
    assert response.status_code == 200, response.text
    gpu = {contract.RESOURCE_GPU: "8"}
    response = agent.patch(a, {"status": {"capacity": gpu, "allocatable": gpu}}, status=True)
    assert response.status_code == 200, response.text
    # Removing its own keys is a change to its own keys too.
    response = agent.patch(a, {"metadata": {"labels": {contract.LABEL_GPU_COUNT: None}}})
    assert response.status_code == 200, response.text


def test_another_node_is_denied(confined):
    response = confined["agent"].patch(
        confined["b"], {"metadata": {"annotations": {contract.ANN_LEGACY_HEARTBEAT: "now"}}}
    )
    _denied(response, f"may change only that Node, not {confined['b']}")


@pytest.mark.parametrize(
    "spec",
    [
        {"taints": [{"key": "evil", "effect": "NoSchedule"}]},
        {"unschedulable": True},
    ],
    ids=["taint", "unschedulable"],
)
def test_spec_changes_are_denied(confined, spec):
    _denied(confined["agent"].patch(confined["a"], {"spec": spec}), "never changes a Node's spec")


def test_foreign_label_and_annotation_are_denied(confined):
    agent, a = confined["agent"], confined["a"]
    _denied(
        agent.patch(a, {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
        "not: node-role.kubernetes.io/control-plane",
    )
    _denied(
        agent.patch(a, {"metadata": {"labels": {"kubernetes.io/hostname": None}}}),
        "not: kubernetes.io/hostname",
    )
    _denied(
        agent.patch(a, {"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "0"}}}),
        "not: node.alpha.kubernetes.io/ttl",
    )


def test_other_resources_and_status_fields_are_denied(confined):
    agent, a = confined["agent"], confined["a"]
    _denied(
        agent.patch(a, {"status": {"capacity": {"example.com/fpga": "4"}}}, status=True),
        "not: example.com/fpga",
    )
    _denied(
        agent.patch(a, {"status": {"allocatable": {"cpu": "1000"}}}, status=True),
        "not: cpu",
    )
    ready = [{"type": "Ready", "status": "False", "reason": "Evil", "message": "x"}]
    _denied(
        agent.patch(a, {"status": {"conditions": ready}}, status=True),
        "changes no Node status but nvidia.com/gpu",
    )


def _lease(node: str, pod: Any, **changes: Any) -> dict[str, Any]:
    body = lease_object(
        node,
        PodIdentity(NAMESPACE, pod.metadata.name, pod.metadata.uid),
        dt.datetime.now(dt.UTC),
        300,
    )
    for path, value in changes.items():
        section, key = path.split("__")
        if value is None:
            body[section].pop(key, None)
        else:
            body[section][key] = value
    return body


LEASE_POLICY = "gpu-scheduler-agent-own-lease"


def test_its_own_heartbeat_lease_owned_by_its_pod_passes(confined):
    agent, a, pod = confined["agent"], confined["a"], confined["pod"]
    response = agent.apply_lease(a, _lease(a, pod))
    assert response.status_code in (200, 201), response.text
    response = agent.apply_lease(a, _lease(a, pod))  # and renewing it
    assert response.status_code == 200, response.text


def test_another_nodes_lease_is_denied(confined):
    b, pod = confined["b"], confined["pod"]
    response = confined["agent"].apply_lease(b, _lease(b, pod, spec__holderIdentity=confined["a"]))
    _denied(response, f"may write only the heartbeat Lease named {confined['a']}", LEASE_POLICY)


def test_a_lease_not_owned_by_its_own_pod_is_denied(confined):
    a, pod = confined["a"], confined["pod"]
    other = [{"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": "not-its-pod"}]
    for owners in (other, None):  # someone else's pod; no owner (would outlive the pod)
        body = _lease(a, pod, metadata__ownerReferences=owners)
        _denied(confined["agent"].apply_lease(a, body), "owned by exactly", LEASE_POLICY)


def test_a_lease_without_the_heartbeat_label_is_denied(confined):
    a, pod = confined["a"], confined["pod"]
    body = _lease(a, pod, metadata__labels={"app": "something-else"})
    _denied(confined["agent"].apply_lease(a, body), "carries the label", LEASE_POLICY)


def test_a_token_without_a_node_claim_is_denied(stack, confined):
    unbound = AsAgent(stack, _token(confined["core"], None))
    response = unbound.patch(
        confined["a"], {"metadata": {"labels": {contract.LABEL_GPU_COUNT: "1"}}}
    )
    _denied(response, "carries no node claim")


def test_the_policy_checks_every_field_of_node_status(stack):
    """The policy's list of NodeStatus fields equals the API server's schema: a field
    added upstream fails here instead of passing the policy unchecked."""
    schema = json.loads(stack.cluster.k8s("kubectl", "get", "--raw", "/openapi/v3/api/v1"))
    fields = set(schema["components"]["schemas"]["io.k8s.api.core.v1.NodeStatus"]["properties"])
    policy = yaml.safe_load(POLICY.read_text().split("\n---\n")[0])
    expressions = " ".join(v["expression"] for v in policy["spec"]["validations"])
    expressions += " ".join(v["expression"] for v in policy["spec"]["variables"])
    checked = {f for f in fields if f"status.?{f}" in expressions}
    assert checked == fields, f"NodeStatus fields the policy does not check: {fields - checked}"


def test_the_agent_keeps_working_with_its_bound_token(stack, confined, tmp_path):
    # A node of its own: the patches above made their keys someone else's (another field
    # manager), and the agent leaves keys it does not own alone.
    core = confined["core"]
    a = create_node(stack, unique("agent"), case="confinement")
    pod = _agent_pod(core, a)
    token = _token(core, pod)
    kubeconfig = stack.cluster.kubeconfig_with_token(unique("agent"), token)
    inventory = tmp_path / "gpus.yaml"
    inventory.write_text(yaml.safe_dump(h100_inventory(4)))
    agent = stack.start_agent(
        a,
        inventory,
        interval="1s",
        kubeconfig=kubeconfig,
        owner=(pod.metadata.name, pod.metadata.uid),
    )
    try:

        def published() -> bool:
            node = core.read_node(a)
            return (
                node.metadata.labels.get(contract.LABEL_GPU_COUNT) == "4"
                and (node.status.capacity or {}).get(contract.RESOURCE_GPU) == "4"
                and read_lease(stack, a) is not None
            )

        wait_for(published, 60, "the confined agent's labels, heartbeat Lease and capacity")
        assert agent.alive()
        log = Path(agent.log_path).read_text()
        assert "Forbidden" not in log, log[-2000:]
    finally:
        stack.cluster.stop_process(agent.name)
        core.delete_node(a)
