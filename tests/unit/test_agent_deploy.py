"""deploy/agent: the DaemonSet and its RBAC agree with the contract and the CLI."""

from __future__ import annotations

import subprocess
from typing import Any

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
        contract.LABEL_GKE_ACCELERATOR,
    }
    assert keys[contract.LABEL_EKS_ACCELERATOR]["operator"] == "Exists"
    assert keys[contract.LABEL_GKE_ACCELERATOR]["operator"] == "Exists"
    assert keys[contract.LABEL_GPU_PRESENT]["values"] == ["true"]


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
