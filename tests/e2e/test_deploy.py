"""deploy/ is complete and valid: the admin's `kubectl apply -k deploy/`, server-side
dry run against the real apiserver (schemas, admission, RBAC escalation checks)."""

from __future__ import annotations

import re

from lab.controlplane import ROOT
from lab.stack import NAMESPACE
from tests.e2e.kube import ensure_namespace

EXPECTED = {
    ("namespace", "gpu-scheduler"),
    ("deployment.apps", "gpu-scheduler"),
    ("deployment.apps", "gpu-scheduler-extender"),
    ("deployment.apps", "gpu-scheduler-webhook"),
    ("deployment.apps", "gpu-scheduler-certs"),
    ("serviceaccount", "gpu-scheduler-certs"),
    ("role.rbac.authorization.k8s.io", "gpu-scheduler-certs"),
    ("clusterrole.rbac.authorization.k8s.io", "gpu-scheduler-certs"),
    ("service", "gpu-scheduler-extender"),
    ("service", "gpu-scheduler-webhook"),
    ("poddisruptionbudget.policy", "gpu-scheduler"),
    ("poddisruptionbudget.policy", "gpu-scheduler-extender"),
    ("poddisruptionbudget.policy", "gpu-scheduler-webhook"),
    ("daemonset.apps", "gpu-scheduler-agent"),
    ("mutatingwebhookconfiguration.admissionregistration.k8s.io", "gpu-scheduler-webhook"),
    ("validatingadmissionpolicy.admissionregistration.k8s.io", "gpu-scheduler-agent-own-node"),
    (
        "validatingadmissionpolicybinding.admissionregistration.k8s.io",
        "gpu-scheduler-agent-own-node",
    ),
    ("networkpolicy.networking.k8s.io", "gpu-scheduler-default-deny-ingress"),
    ("networkpolicy.networking.k8s.io", "gpu-scheduler-extender"),
    ("networkpolicy.networking.k8s.io", "gpu-scheduler-certs"),
}


def test_kubectl_apply_k_deploy_server_dry_run(stack):
    ensure_namespace(stack, NAMESPACE)  # a dry run creates nothing, so namespaced objects need it
    out = stack.cluster.k8s("kubectl", "apply", "-k", str(ROOT / "deploy"), "--dry-run=server")
    applied = set()
    for line in out.splitlines():
        if " (server dry run)" in line and "/" in line:
            kind, _, rest = line.partition("/")
            applied.add((kind, rest.split()[0]))
    missing = EXPECTED - applied
    assert not missing, out
    # The generated ConfigMaps carry kustomize's content hash, so pods roll on a change.
    configmaps = sorted(name for kind, name in applied if kind == "configmap")
    assert [re.sub(r"-[a-z0-9]{10}$", "", n) for n in configmaps] == [
        "gpu-scheduler-config",
        "gpu-scheduler-extender-config",
        "gpu-scheduler-webhook-config",
    ], configmaps


def test_scheduler_config_is_v1_with_its_own_lease_and_the_extender():
    import yaml

    cfg = yaml.safe_load((ROOT / "deploy/scheduler/scheduler-config.yaml").read_text())
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert cfg["leaderElection"]["resourceName"] == "gpu-scheduler"
    [profile] = cfg["profiles"]
    assert profile["schedulerName"] == "gpu-scheduler"
    [extender] = cfg["extenders"]
    assert extender["nodeCacheCapable"] is True
    # Every pod of the profile goes to the extender: a pod whose DRA claim asks memory
    # has no resource a managedResources entry could name.
    assert "managedResources" not in extender
