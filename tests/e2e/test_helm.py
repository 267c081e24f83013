"""The Helm chart and the kustomize base are one install: `helm template` with default
values gives the same objects as `kubectl kustomize deploy/`; `helm lint` is clean for
the default and the other modes; and `helm install` into the real control plane gets
every object accepted, the webhook registered and a valid scheduler configuration.

Two differences are by design and normalised here, nothing else: the chart creates no
Namespace (`helm install --create-namespace`), and configuration changes roll the pods
through a hash in the ConfigMap's name under kustomize, a checksum annotation under
Helm.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml

from lab.controlplane import ROOT
from lab.stack import NAMESPACE
from tests.e2e.kube import install_certs

CHART = ROOT / "charts" / "gpu-scheduler"
HASHED = re.compile(r"^(gpu-scheduler(?:-\w+)*-config)-[a-z0-9]{10}$")
MODES = [
    [],
    ["--set", "certificates.mode=cert-manager"],
    ["--set", "agent.capacity=true", "--set", "agent.gfdLabels=always"],
    ["--set", "extender.tls=false", "--set", "networkPolicy.enabled=false"],
    ["--set", "image.digest=sha256:" + "0" * 64, "--set", "agent.admissionPolicy=false"],
]


def _run(binary, *args: str) -> str:
    import subprocess

    done = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def helm_template(binary, *values: str) -> list[dict[str, Any]]:
    out = _run(binary, "helm", "template", "gpu-scheduler", str(CHART), "-n", NAMESPACE, *values)
    return [d for d in yaml.safe_load_all(out) if d]


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


def _normalise(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    out = {}
    for original in docs:
        obj = copy.deepcopy(original)
        if obj["kind"] == "Namespace":
            continue
        if obj["kind"] == "ConfigMap":
            obj["metadata"]["name"] = HASHED.sub(r"\1", obj["metadata"]["name"])
            obj["data"] = {k: yaml.safe_load(v) for k, v in obj["data"].items()}
        template = obj.get("spec", {}).get("template", {})
        annotations = template.get("metadata", {}).get("annotations", {})
        annotations.pop("checksum/config", None)
        if "metadata" in template and not annotations:
            template["metadata"].pop("annotations", None)
        for volume in template.get("spec", {}).get("volumes", []):
            if "configMap" in volume:
                volume["configMap"]["name"] = HASHED.sub(r"\1", volume["configMap"]["name"])
        out[_key(obj)] = obj
    return out


def test_helm_template_equals_kubectl_kustomize(control_plane_binary):
    chart = _normalise(helm_template(control_plane_binary))
    kustomize = _normalise(
        list(
            yaml.safe_load_all(
                _run(control_plane_binary, "kubectl", "kustomize", str(ROOT / "deploy"))
            )
        )
    )
    assert sorted(chart) == sorted(kustomize)
    for key, obj in kustomize.items():
        assert chart[key] == obj, key


@pytest.mark.parametrize("values", MODES, ids=lambda v: " ".join(v[1::2]) or "defaults")
def test_helm_lint_is_clean(control_plane_binary, values):
    out = _run(control_plane_binary, "helm", "lint", "--strict", str(CHART), *values)
    assert "0 chart(s) failed" in out and "[WARNING]" not in out and "[ERROR]" not in out, out


def test_the_modes_render_what_they_say(control_plane_binary):
    def kinds(*values: str) -> dict[tuple[str, str, str], dict[str, Any]]:
        return {_key(d): d for d in helm_template(control_plane_binary, *values)}

    managed = kinds("--set", "certificates.mode=cert-manager")
    assert ("Certificate", NAMESPACE, "gpu-scheduler-scheduler") in managed
    webhook = managed[("MutatingWebhookConfiguration", "", "gpu-scheduler-webhook")]
    assert webhook["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE}/gpu-scheduler-webhook"
    }
    capacity = kinds("--set", "agent.capacity=true")
    agent = capacity[("DaemonSet", NAMESPACE, "gpu-scheduler-agent")]
    assert "--capacity" in agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert ("ClusterRole", "", "gpu-scheduler-agent-capacity") in capacity
    plain = kinds("--set", "extender.tls=false")
    config = yaml.safe_load(
        plain[("ConfigMap", NAMESPACE, "gpu-scheduler-config")]["data"]["scheduler-config.yaml"]
    )
    assert config["extenders"][0]["enableHTTPS"] is False
    assert config["extenders"][0]["urlPrefix"].startswith("http://")
    pinned = kinds("--set", "image.digest=sha256:" + "a" * 64)
    image = pinned[("Deployment", NAMESPACE, "gpu-scheduler-webhook")]["spec"]["template"]["spec"][
        "containers"
    ][0]["image"]
    assert image == "ghcr.io/gpu-scheduler/gpu-scheduler@sha256:" + "a" * 64
    other = {
        _key(d): d
        for d in yaml.safe_load_all(
            _run(control_plane_binary, "helm", "template", "x", str(CHART), "-n", "gpu-other")
        )
        if d
    }
    policy = other[("ValidatingAdmissionPolicy", "", "gpu-scheduler-agent-own-node")]
    assert (
        "system:serviceaccount:gpu-other:gpu-scheduler-agent"
        in policy["spec"]["matchConditions"][0]["expression"]
    )


@pytest.fixture(scope="module")
def fresh_cluster(tmp_path_factory, control_plane_binary):
    """A control plane of its own: the chart registers a webhook for every GPU pod and
    cluster-wide names, which must not meet the shared stack's."""
    from lab.controlplane import start_control_plane

    cluster = start_control_plane(tmp_path_factory.mktemp("helm"))
    yield cluster
    cluster.stop()


def test_helm_install_then_install_certs(fresh_cluster, tmp_path):
    import base64

    from kubernetes import client

    cluster = fresh_cluster
    out = _run(
        cluster.binary,
        "helm",
        "install",
        "gpu-scheduler",
        str(CHART),
        "-n",
        NAMESPACE,
        "--create-namespace",
        f"--kubeconfig={cluster.kubeconfig}",
    )
    assert "STATUS: deployed" in out, out
    rendered = helm_template(cluster.binary)
    api = cluster.api_client()
    for obj in rendered:
        kind, namespace, name = _key(obj)
        args = ["kubectl", f"--kubeconfig={cluster.kubeconfig}", "get", kind, name, "-o", "name"]
        if namespace:
            args += ["-n", namespace]
        _run(cluster.binary, *args)  # every rendered object exists
    admission = client.AdmissionregistrationV1Api(api)
    (hook,) = admission.read_mutating_webhook_configuration("gpu-scheduler-webhook").webhooks
    assert hook.client_config.service.namespace == NAMESPACE and not hook.client_config.ca_bundle

    # deploy/install-certs.sh against it, twice: the second run keeps everything.
    certs = tmp_path / "certs-out"
    for _ in range(2):
        done = install_certs(cluster, certs, tmp_path / "bin")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "rollout restart" not in done.stdout
    core = client.CoreV1Api(api)
    for name in ("webhook", "extender", "scheduler"):
        secret = core.read_namespaced_secret(f"gpu-scheduler-{name}-tls", NAMESPACE)
        assert secret.type == "kubernetes.io/tls"
        assert base64.b64decode(secret.data["tls.crt"]) == (certs / name / "tls.crt").read_bytes()
        assert base64.b64decode(secret.data["ca.crt"]) == (certs / "ca" / "ca.crt").read_bytes()
    (hook,) = admission.read_mutating_webhook_configuration("gpu-scheduler-webhook").webhooks
    assert base64.b64decode(hook.client_config.ca_bundle) == (certs / "ca" / "ca.crt").read_bytes()

    # The rendered KubeSchedulerConfiguration is one kube-scheduler accepts (it builds
    # the extender client from it, reading the certificate files).
    config = client.CoreV1Api(api).read_namespaced_config_map("gpu-scheduler-config", NAMESPACE)
    path = tmp_path / "scheduler-config.yaml"
    parsed = yaml.safe_load(config.data["scheduler-config.yaml"])
    parsed["clientConnection"] = {"kubeconfig": str(cluster.kubeconfig)}  # in-cluster in a pod
    # The files of the Secret gpu-scheduler-scheduler-tls, where the pod mounts them.
    tls = parsed["extenders"][0]["tlsConfig"]
    for field, name in (("certFile", "tls.crt"), ("keyFile", "tls.key"), ("caFile", "ca.crt")):
        assert tls[field] == f"/etc/gpu-scheduler/tls/{name}"
        tls[field] = str(certs / "scheduler" / name)
    path.write_text(yaml.safe_dump(parsed))
    _run(
        cluster.binary,
        "kube-scheduler",
        f"--config={path}",
        f"--write-config-to={tmp_path / 'out.yaml'}",
    )
    assert (
        yaml.safe_load((tmp_path / "out.yaml").read_text())["extenders"][0]["enableHTTPS"] is True
    )
