"""deploy/agent: the DaemonSet and its RBAC agree with the contract and the CLI."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from gpu_scheduler import contract
from gpu_scheduler.cli import build_parser
from tests.helpers import ROOT, required

AGENT = ROOT / "deploy" / "agent"


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((AGENT / name).read_text()) if d]


def daemonset() -> dict[str, Any]:
    (ds,) = [d for d in docs("daemonset.yaml") if d["kind"] == "DaemonSet"]
    return ds


def test_only_on_gpu_nodes_any_common_label() -> None:
    terms = daemonset()["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    # One expression per term: the terms are ORed.
    assert all(len(t["matchExpressions"]) == 1 for t in terms)
    keys = {t["matchExpressions"][0]["key"]: t["matchExpressions"][0] for t in terms}
    assert set(keys) == {
        contract.LABEL_NFD_NVIDIA_PCI,
        contract.LABEL_GPU_PRESENT,
        contract.LABEL_EKS_ACCELERATOR,
        contract.LABEL_KARPENTER_GPU_MANUFACTURER,
        contract.LABEL_EKS_AUTO_GPU_MANUFACTURER,
        contract.LABEL_AKS_ACCELERATOR,
        contract.LABEL_GKE_ACCELERATOR,
    }
    assert keys[contract.LABEL_EKS_ACCELERATOR]["operator"] == "Exists"
    assert keys[contract.LABEL_GKE_ACCELERATOR]["operator"] == "Exists"
    assert keys[contract.LABEL_GPU_PRESENT]["values"] == ["true"]


# The labels each platform itself puts on an NVIDIA GPU node, with nothing added by the
# user (docs/reference/labels.md, "Which nodes run the agent", cites the sources).
# Each case is (GPU node labels, the same platform's CPU node labels).
_EKS_NODE = {
    "kubernetes.io/arch": "amd64",
    "kubernetes.io/os": "linux",
    "topology.kubernetes.io/zone": "us-west-2a",
}
_EKS_MNG = {**_EKS_NODE, "eks.amazonaws.com/capacityType": "ON_DEMAND"}
PLATFORM_NODES: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    # Karpenter (AWS provider): the instance type's well-known labels; the GPU ones only
    # on instance types with GPUs.
    "karpenter": (
        {
            **_EKS_NODE,
            "node.kubernetes.io/instance-type": "g6.12xlarge",
            "karpenter.sh/capacity-type": "on-demand",
            "karpenter.sh/nodepool": "gpu",
            "karpenter.k8s.aws/instance-family": "g6",
            "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
            "karpenter.k8s.aws/instance-gpu-name": "l4",
            "karpenter.k8s.aws/instance-gpu-count": "4",
            "karpenter.k8s.aws/instance-gpu-memory": "22888",
        },
        {
            **_EKS_NODE,
            "node.kubernetes.io/instance-type": "m7i.2xlarge",
            "karpenter.sh/capacity-type": "on-demand",
            "karpenter.sh/nodepool": "default",
            "karpenter.k8s.aws/instance-family": "m7i",
            "karpenter.k8s.aws/instance-cpu-manufacturer": "intel",
        },
    ),
    # EKS Auto Mode: the same with the eks.amazonaws.com/ prefix.
    "eks-auto-mode": (
        {
            **_EKS_NODE,
            "node.kubernetes.io/instance-type": "p5.48xlarge",
            "eks.amazonaws.com/compute-type": "auto",
            "karpenter.sh/nodepool": "gpu",
            "eks.amazonaws.com/instance-family": "p5",
            "eks.amazonaws.com/instance-gpu-manufacturer": "nvidia",
            "eks.amazonaws.com/instance-gpu-name": "h100",
            "eks.amazonaws.com/instance-gpu-count": "8",
        },
        {
            **_EKS_NODE,
            "node.kubernetes.io/instance-type": "c6g.xlarge",
            "eks.amazonaws.com/compute-type": "auto",
            "karpenter.sh/nodepool": "general-purpose",
            "eks.amazonaws.com/instance-family": "c6g",
            "eks.amazonaws.com/instance-cpu-manufacturer": "aws",
        },
    ),
    # Managed node groups (AL2023 NVIDIA or Bottlerocket NVIDIA AMI) set no GPU label:
    # the node group carries k8s.amazonaws.com/accelerator (docs/install/eks.md).
    "eks-managed-node-group": (
        {
            **_EKS_MNG,
            "node.kubernetes.io/instance-type": "g5.xlarge",
            "eks.amazonaws.com/nodegroup": "gpu",
            "eks.amazonaws.com/nodegroup-image": "ami-0123456789abcdef0",
            "k8s.amazonaws.com/accelerator": "nvidia-a10g",
        },
        {
            **_EKS_MNG,
            "node.kubernetes.io/instance-type": "m6i.large",
            "eks.amazonaws.com/nodegroup": "system",
            "eks.amazonaws.com/nodegroup-image": "ami-0123456789abcdef1",
        },
    ),
    # AKS: a reserved system label on GPU node pools.
    "aks": (
        {
            "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "Standard_NC24ads_A100_v4",
            "kubernetes.azure.com/agentpool": "gpunp",
            "kubernetes.azure.com/mode": "user",
            "kubernetes.azure.com/role": "agent",
            "kubernetes.azure.com/accelerator": "nvidia",
        },
        {
            "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "Standard_D4s_v5",
            "kubernetes.azure.com/agentpool": "nodepool1",
            "kubernetes.azure.com/mode": "system",
            "kubernetes.azure.com/role": "agent",
        },
    ),
    # GKE: every node with GPUs attached.
    "gke": (
        {
            "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "g2-standard-8",
            "cloud.google.com/gke-nodepool": "gpu-pool",
            "cloud.google.com/gke-accelerator": "nvidia-l4",
            "cloud.google.com/gke-gpu": "true",
        },
        {
            "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "e2-standard-4",
            "cloud.google.com/gke-nodepool": "default-pool",
        },
    ),
    # Anywhere: NFD, or GFD (the GPU Operator).
    "nfd": (
        {"feature.node.kubernetes.io/pci-10de.present": "true"},
        {"feature.node.kubernetes.io/pci-8086.present": "true"},
    ),
    "gfd": ({"nvidia.com/gpu.present": "true"}, {"nvidia.com/gpu.present": "false"}),
}


def _agent_pods() -> dict[str, dict[str, Any]]:
    """The agent's pod spec as deploy/ ships it and as the chart's values set it."""
    values = yaml.safe_load((ROOT / "charts" / "gpu-scheduler" / "values.yaml").read_text())
    deploy_spec = daemonset()["spec"]["template"]["spec"]
    chart_spec = {
        "nodeSelector": values["agent"]["nodeSelector"],
        "affinity": values["agent"]["affinity"],
    }
    return {"deploy": {"spec": deploy_spec}, "chart": {"spec": chart_spec}}


def test_the_chart_and_deploy_choose_the_same_nodes() -> None:
    pods = _agent_pods()
    assert pods["deploy"]["spec"]["affinity"] == pods["chart"]["spec"]["affinity"]
    assert not pods["deploy"]["spec"].get("nodeSelector")
    assert not pods["chart"]["spec"]["nodeSelector"]


@pytest.mark.parametrize("source", ["chart", "deploy"])
@pytest.mark.parametrize("platform", sorted(PLATFORM_NODES))
def test_the_agent_lands_on_each_platforms_gpu_nodes_and_not_its_cpu_nodes(
    platform: str, source: str
) -> None:
    from tests.nodeaffinity import required_node_affinity_matches

    pod = _agent_pods()[source]
    gpu, cpu = PLATFORM_NODES[platform]
    assert required_node_affinity_matches(pod, {"metadata": {"name": "gpu", "labels": gpu}})
    assert not required_node_affinity_matches(pod, {"metadata": {"name": "cpu", "labels": cpu}})


def test_the_sharing_component_keeps_every_term_off_sharing_nodes() -> None:
    """deploy/agent/sharing patches the terms by index: one patch per term, or the
    plain agent would also land on sharing nodes through the unpatched ones."""
    terms = daemonset()["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    component = yaml.safe_load((AGENT / "sharing" / "kustomization.yaml").read_text())
    (patch,) = [p for p in component["patches"] if p["target"]["name"] == "gpu-scheduler-agent"]
    ops = yaml.safe_load(patch["patch"])
    indices = sorted(int(op["path"].split("/nodeSelectorTerms/")[1].split("/")[0]) for op in ops)
    assert indices == list(range(len(terms)))
    assert {op["value"]["operator"] for op in ops} == {"DoesNotExist"}


def test_every_term_is_the_only_match_of_some_platform() -> None:
    """Removing any one term leaves some platform's GPU nodes without the agent."""
    from tests.nodeaffinity import required_node_affinity_matches

    spec = _agent_pods()["deploy"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    for i, term in enumerate(terms):
        rest = terms[:i] + terms[i + 1 :]
        pod = {
            "spec": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": rest
                        }
                    }
                }
            }
        }
        lost = [
            p
            for p, (gpu, _) in PLATFORM_NODES.items()
            if not required_node_affinity_matches(pod, {"metadata": {"name": p, "labels": gpu}})
        ]
        assert lost, f"no platform needs {term}"


def test_pod_spec() -> None:
    ds = daemonset()
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    spec = ds["spec"]["template"]["spec"]
    # The base is platform eks (the chart's auto without a cluster): the node's default
    # runtime is nvidia; the components under platform/ add the others.
    assert "runtimeClassName" not in spec
    assert {"key": contract.RESOURCE_GPU, "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # The args parse with the real CLI, and the port matches the probes'.
    args = build_parser().parse_args(container["args"])
    assert args.command == "agent"
    assert args.port == container["ports"][0]["containerPort"]
    # No capacity by default: the device plugin or a DRA driver provides nvidia.com/gpu.
    assert args.interval == "60s" and args.capacity is False and args.gfd_labels == "auto"


def test_rbac_is_least_privilege() -> None:
    (role,) = [d for d in docs("rbac.yaml") if d["kind"] == "ClusterRole"]
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {(("",), ("nodes",)): {"get", "patch"}}
    (binding,) = [d for d in docs("rbac.yaml") if d["kind"] == "ClusterRoleBinding"]
    account = daemonset()["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"][0]["name"] == account
    # Its heartbeat Lease: create and patch (server-side apply), in its namespace only.
    (lease_role,) = [d for d in docs("rbac.yaml") if d["kind"] == "Role"]
    assert lease_role["metadata"]["namespace"] == "gpu-scheduler"
    (rule,) = lease_role["rules"]
    assert rule == {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["create", "patch"],
    }
    (lease_binding,) = [d for d in docs("rbac.yaml") if d["kind"] == "RoleBinding"]
    assert lease_binding["subjects"][0]["name"] == account
    assert lease_binding["roleRef"]["name"] == lease_role["metadata"]["name"]


def test_the_pod_knows_itself_for_its_heartbeat_lease() -> None:
    """The downward API gives the agent its pod's namespace, name and UID: the Lease's
    namespace and owner (without them there is no heartbeat)."""
    env = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in daemonset()["spec"]["template"]["spec"]["containers"][0]["env"]
        if "valueFrom" in e
    }
    assert env == {
        "NODE_NAME": "spec.nodeName",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_NAME": "metadata.name",
        "POD_UID": "metadata.uid",
    }


def test_agent_is_in_the_base() -> None:
    base = yaml.safe_load((ROOT / "deploy" / "kustomization.yaml").read_text())
    assert "agent" in base["resources"]
    own = yaml.safe_load((AGENT / "kustomization.yaml").read_text())
    # No namespace transformer (older kustomize would namespace the cluster-scoped
    # admission policy); the namespaced objects name the install's namespace.
    assert "namespace" not in own
    namespaced = [
        d
        for f in ("rbac.yaml", "daemonset.yaml")
        for d in docs(f)
        if d["kind"] in ("ServiceAccount", "DaemonSet", "Role", "RoleBinding")
    ]
    assert len(namespaced) == 4
    assert {d["metadata"]["namespace"] for d in namespaced} == {"gpu-scheduler"}


def test_kustomize_builds() -> None:
    """With the project's own kubectl (the control-plane binary ``make test`` builds);
    without it the test skips, and fails in CI."""
    from lab.controlplane import find_binary

    binary = find_binary()
    if binary is None:
        required("kustomize on the project's kubectl", "no control-plane binary: make controlplane")
    out = subprocess.run(
        [str(binary), "kubectl", "kustomize", str(AGENT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted(kinds) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "Role",
        "RoleBinding",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
    ]


def _cel_string_list(expression: str) -> list[str]:
    """A CEL list literal of single-quoted strings, as Python strings."""
    literal = expression.strip()
    assert literal.startswith("[") and literal.endswith("]"), literal
    return [item.strip().strip("'") for item in literal[1:-1].split(",") if item.strip()]


def test_both_policy_files_are_what_the_generator_writes() -> None:
    """deploy/'s policy and the chart's template come from tools/agent_policy.py (the
    contract's keys); rerun it after changing either."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "agent_policy", ROOT / "tools" / "agent_policy.py"
    )
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert generator.DEPLOY.read_text() == generator.deploy_text()
    assert generator.CHART.read_text() == generator.chart_text()


def test_admission_policy_confines_the_agent_to_the_contract_keys() -> None:
    policy, binding, lease_policy, lease_binding = docs("admission-policy.yaml")
    assert policy["kind"] == "ValidatingAdmissionPolicy"
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert _cel_string_list(variables["ownedLabels"]) == [
        *contract.AGENT_LABELS,
        *contract.AGENT_OWN_LABELS,
    ]
    assert _cel_string_list(variables["ownedAnnotations"]) == list(contract.AGENT_ANNOTATIONS)
    # It matches the agent's own ServiceAccount, in the namespace the base installs to.
    (account,) = [d for d in docs("rbac.yaml") if d["kind"] == "ServiceAccount"]
    meta = account["metadata"]
    user = f"system:serviceaccount:{meta['namespace']}:{meta['name']}"
    (condition,) = policy["spec"]["matchConditions"]
    assert f"'{user}'" in condition["expression"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["kind"] == "ValidatingAdmissionPolicyBinding"
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    # The Lease policy: the same user, Leases only, the contract's heartbeat label.
    assert lease_policy["spec"]["matchConditions"] == policy["spec"]["matchConditions"]
    (rule,) = lease_policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]
    checks = " ".join(v["expression"] for v in lease_policy["spec"]["validations"])
    assert f"'{contract.LEASE_LABEL}'" in checks and f"'{contract.LEASE_LABEL_VALUE}'" in checks
    assert "variables.podUID" in checks and "request.name == variables.nodeName" in checks
    assert lease_binding["spec"] == {
        "policyName": lease_policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
