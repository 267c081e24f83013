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
import time
from typing import Any

import pytest
import yaml

from lab.controlplane import ROOT
from lab.stack import NAMESPACE, deploy_documents
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


def base_scheduler_image() -> str:
    """kube-scheduler's image in the kustomize base (deploy/scheduler/)."""
    (deployment,) = [d for d in deploy_documents("scheduler") if d["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]["containers"][0]["image"]


def scheduler_image(docs: list[dict[str, Any]]) -> str:
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpu-scheduler"
    ]
    return deployment["spec"]["template"]["spec"]["containers"][0]["image"]


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


def test_helm_template_equals_kubectl_kustomize(control_plane_binary, helm_binary):
    # For the cluster version the base's kube-scheduler image names, the two are one.
    version = base_scheduler_image().rsplit(":", 1)[1]
    chart = _normalise(helm_template(helm_binary, "--kube-version", version))
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
def test_helm_lint_is_clean(helm_binary, values):
    out = _run(helm_binary, "helm", "lint", "--strict", str(CHART), *values)
    assert "0 chart(s) failed" in out and "[WARNING]" not in out and "[ERROR]" not in out, out


def test_the_modes_render_what_they_say(helm_binary):
    def kinds(*values: str) -> dict[tuple[str, str, str], dict[str, Any]]:
        return {_key(d): d for d in helm_template(helm_binary, *values)}

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
            _run(helm_binary, "helm", "template", "x", str(CHART), "-n", "gpu-other")
        )
        if d
    }
    policy = other[("ValidatingAdmissionPolicy", "", "gpu-scheduler-agent-own-node")]
    assert (
        "system:serviceaccount:gpu-other:gpu-scheduler-agent"
        in policy["spec"]["matchConditions"][0]["expression"]
    )


@pytest.fixture(scope="module", params=["newest", "oldest"])
def fresh_cluster(request, tmp_path_factory, control_plane_binary):
    """A control plane of its own (the chart registers a webhook for every GPU pod and
    cluster-wide names, which must not meet the shared stack's): the minor under test,
    then the oldest supported one."""
    from lab.controlplane import start_control_plane

    binary = control_plane_binary
    if request.param == "oldest":
        from tests.e2e.test_versions import oldest_binary

        binary = oldest_binary()
        if binary == control_plane_binary:
            pytest.skip("the minor under test is the oldest")
    cluster = start_control_plane(tmp_path_factory.mktemp(f"helm-{request.param}"), binary)
    yield cluster
    cluster.stop()


def test_helm_install_then_install_certs(fresh_cluster, helm_binary, tmp_path):
    import base64

    from kubernetes import client

    cluster = fresh_cluster
    out = _run(
        helm_binary,
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
    api = cluster.api_client()
    # kube-scheduler's image follows the cluster it was installed into.
    version = client.VersionApi(api).get_code().git_version
    assert version.startswith(f"v1.{cluster.minor}.")
    apps = client.AppsV1Api(api)
    installed = apps.read_namespaced_deployment("gpu-scheduler", NAMESPACE)
    assert installed.spec.template.spec.containers[0].image == (
        f"registry.k8s.io/kube-scheduler:{version}"
    )
    rendered = helm_template(helm_binary, "--kube-version", version)
    assert scheduler_image(rendered) == f"registry.k8s.io/kube-scheduler:{version}"
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

    # The rendered KubeSchedulerConfiguration is one this minor's kube-scheduler runs
    # with: it builds the extender client from it (reading the certificate files),
    # starts, and answers /healthz.
    config = client.CoreV1Api(api).read_namespaced_config_map("gpu-scheduler-config", NAMESPACE)
    parsed = yaml.safe_load(config.data["scheduler-config.yaml"])
    # The files of the Secret gpu-scheduler-scheduler-tls, where the pod mounts them.
    tls = parsed["extenders"][0]["tlsConfig"]
    for field, name in (("certFile", "tls.crt"), ("keyFile", "tls.key"), ("caFile", "ca.crt")):
        assert tls[field] == f"/etc/gpu-scheduler/tls/{name}"
        tls[field] = str(certs / "scheduler" / name)
    cluster.start_scheduler("gpu-scheduler-from-chart", parsed)
    time.sleep(3)  # its informers list every kind it schedules with
    log = cluster.processes["gpu-scheduler-from-chart"].log_path.read_text()
    assert "could not find the requested resource" not in log, log[-3000:]
    cluster.stop_process("gpu-scheduler-from-chart")


def test_kustomize_users_pin_the_scheduler_to_their_cluster(control_plane_binary, tmp_path):
    """The README's overlay for kustomize users: kube-scheduler's image set to the
    cluster's version."""
    import re as _re

    readme = (ROOT / "README.md").read_text()
    block = _re.search(r"```yaml\n(# kustomization.yaml: kube-scheduler.*?)```", readme, _re.S)
    assert block, "README: the kube-scheduler version overlay"
    overlay = yaml.safe_load(block[1])
    import os

    # The README points at the reader's clone; kustomize takes relative paths only.
    overlay["resources"] = [os.path.relpath(ROOT / "deploy", tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    docs = list(
        yaml.safe_load_all(_run(control_plane_binary, "kubectl", "kustomize", str(tmp_path)))
    )
    wanted = overlay["images"][0]
    assert scheduler_image(docs) == f"{wanted['name']}:{wanted['newTag']}"
    assert scheduler_image(docs) != base_scheduler_image()
