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
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.controlplane import ROOT
from lab.stack import NAMESPACE, deploy_documents
from tests.e2e.kube import install_certs
from tests.helpers import wait_for

CHART = ROOT / "charts" / "gpu-scheduler"
PROFILE = "scheduler.profile."
HASHED = re.compile(r"^(gpu-scheduler(?:-\w+)*-config)-[a-z0-9]{10}$")
MODES = [
    [],
    ["--set", "certificates.mode=cert-manager"],
    ["--set", "certificates.mode=external"],
    ["--set", "certificates.mode=tool", "--set", "certificates.caBundle=QUJD"],
    ["--set", "agent.capacity=true", "--set", "agent.gfdLabels=always"],
    ["--set", "extender.tls=false", "--set", "networkPolicy.enabled=false"],
    ["--set", "image.digest=sha256:" + "0" * 64, "--set", "agent.admissionPolicy=false"],
    ["--set", "agent.platform=gke", "--set", "webhook.hostNetwork=true"],
    ["--set", "agent.platform=gpu-operator", "--set", "extender.hostNetwork=true"],
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


def test_kubectl_delete_k_removes_the_webhook_configuration_first(control_plane_binary):
    # kubectl deletes in the order kustomize builds; kustomize's own order puts webhook
    # configurations last, after the Service an armed webhook is called through.
    built = yaml.safe_load_all(
        _run(control_plane_binary, "kubectl", "kustomize", str(ROOT / "deploy"))
    )
    kinds = [obj["kind"] for obj in built]
    assert kinds[0] == "MutatingWebhookConfiguration", kinds
    assert kinds.index("Namespace") == 1, kinds


@pytest.mark.parametrize(
    "values, picks",
    [
        ((), True),
        (("--set-json", PROFILE + 'extraScorePlugins=[{"name":"ImageLocality"}]'), False),
        (("--set", PROFILE + "systemDefaultSpreading=true"), False),
        (("--set-json", PROFILE + 'extraExtenders=[{"urlPrefix":"http://q:80"}]'), False),
    ],
    ids=["as shipped", "a score plugin", "default spreading", "a second extender"],
)  # fmt: skip
def test_the_pick_is_off_where_the_profile_scores_what_it_does_not_account_for(
    helm_binary, values, picks
):
    docs = {_key(d): d for d in helm_template(helm_binary, *values)}
    profile = yaml.safe_load(
        docs[("ConfigMap", NAMESPACE, "gpu-scheduler-config")]["data"]["scheduler-config.yaml"]
    )
    extender = yaml.safe_load(
        docs[("ConfigMap", NAMESPACE, "gpu-scheduler-extender-config")]["data"][
            "extender-config.yaml"
        ]
    )
    assert extender["filterChooses"] is picks
    scores = profile["profiles"][0].get("plugins", {}).get("score", {}).get("enabled", [])
    spread = next(
        c for c in profile["profiles"][0]["pluginConfig"] if c["name"] == "PodTopologySpread"
    )
    extenders = profile["extenders"]
    assert bool(scores or spread["args"]["defaultingType"] == "System" or len(extenders) > 1) is (
        not picks
    )
    assert extenders[0]["preemptVerb"] == "preempt"


@pytest.mark.parametrize(
    "version, values, off",
    [
        ("1.37.2", (), True),
        ("1.36.3", (), False),
        ("1.34.4", (), False),
        ("1.37.2", ("--set", PROFILE + "podGroupPreemption=true"), False),
    ],
    ids=["1.37", "1.36", "1.34", "1.37 kept on"],
)
def test_podgroup_preemption_is_off_where_the_scheduler_has_it(helm_binary, version, values, off):
    """kube-scheduler's workload-aware PodGroup preemption never calls the preempt verb
    (docs/concepts/preemption.md): off in the profile from 1.37, whose config has the
    field (an older kube-scheduler refuses it: strict decoding)."""
    docs = {_key(d): d for d in helm_template(helm_binary, "--kube-version", version, *values)}
    profile = yaml.safe_load(
        docs[("ConfigMap", NAMESPACE, "gpu-scheduler-config")]["data"]["scheduler-config.yaml"]
    )
    plugins = profile["profiles"][0].get("plugins", {})
    assert plugins.get("podGroupPostFilter") == (
        {"disabled": [{"name": "DefaultPreemption"}]} if off else None
    )


def test_the_chart_carries_its_values_table(helm_binary):
    """`helm show readme` (and chart indexes) show the chart's values, the same table
    docs/configuration.md holds (tools/helm_docs.sh keeps both; make lint checks)."""
    readme = _run(helm_binary, "helm", "show", "readme", str(CHART))
    table = (ROOT / "docs" / "configuration.md").read_text()
    start, end = "<!-- helm-docs:start -->", "<!-- helm-docs:end -->"
    expected = table[table.index(start) : table.index(end)]
    assert expected in readme
    assert "| agent.affinity |" in readme


def test_kube_scheduler_reaches_one_extender_replica(helm_binary):
    """The replica that made a pick, or agreed to victims, answers the next call: the
    extender's Service keeps a client on one replica (kube-scheduler is one leader)."""
    docs = {_key(d): d for d in helm_template(helm_binary)}
    service = docs[("Service", NAMESPACE, "gpu-scheduler-extender")]
    assert service["spec"]["sessionAffinity"] == "ClientIP"


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


def _secret_files(core: Any, name: str) -> dict[str, bytes]:
    import base64

    secret = core.read_namespaced_secret(name, NAMESPACE)
    return {k: base64.b64decode(v) for k, v in secret.data.items()}


def _controller(cluster: Any, core: Any, tmp_path) -> list[str]:
    """`gpu-scheduler certs controller --once` as the chart's ServiceAccount (so with
    the RBAC the chart grants it, nothing more), from the host: the lab's nodes run no
    pods (tests/e2e/test_real_node.py runs it as a pod)."""
    import subprocess
    import sys

    token = core.create_namespaced_service_account_token(
        "gpu-scheduler-certs", NAMESPACE, {"spec": {"expirationSeconds": 600}}
    ).status.token
    kubeconfig = cluster.kubeconfig_with_token("certs-controller", token)
    command = [sys.executable, "-m", "gpu_scheduler.cli", "certs", "controller", "--once"]
    done = subprocess.run(
        [*command, "--namespace", NAMESPACE, "--kubeconfig", str(kubeconfig), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in done.stderr.splitlines() if "certificates:" in line]


def _the_controller_is_confined(cluster: Any) -> None:
    """The controller's ServiceAccount (impersonated) may write only what its job
    needs: its admission policy refuses everything else RBAC would let through."""
    import subprocess

    def as_controller(*args: str) -> subprocess.CompletedProcess[str]:
        account = f"system:serviceaccount:{NAMESPACE}:gpu-scheduler-certs"
        command = [str(cluster.binary), "kubectl", f"--kubeconfig={cluster.kubeconfig}"]
        return subprocess.run(
            [*command, f"--as={account}", "-n", NAMESPACE, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    def patch(kind: str, name: str, body: str, kind_of_patch: str = "strategic"):
        return as_controller("patch", kind, name, f"--type={kind_of_patch}", "-p", body)

    # Arming is allowed (Ignore -> Fail: the webhook never served here, so the
    # controller would not, but the policy lets it); disarming is not.
    armed = patch(
        "mutatingwebhookconfiguration",
        "gpu-scheduler-webhook",
        '[{"op":"replace","path":"/webhooks/0/failurePolicy","value":"Fail"}]',
        "json",
    )
    assert armed.returncode == 0, armed.stderr
    refused = {
        "another Secret": as_controller(
            "create", "secret", "generic", "stolen", "--from-literal=a=b"
        ),
        "kube-scheduler's image": patch(
            "deployment",
            "gpu-scheduler",
            '[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"evil"}]',
            "json",
        ),
        "another annotation": patch(
            "deployment",
            "gpu-scheduler",
            '{"spec":{"template":{"metadata":{"annotations":{"x":"y"}}}}}',
        ),
        "the webhook's failurePolicy back to Ignore": patch(
            "mutatingwebhookconfiguration",
            "gpu-scheduler-webhook",
            '[{"op":"replace","path":"/webhooks/0/failurePolicy","value":"Ignore"}]',
            "json",
        ),
        "where the webhook sends": patch(
            "mutatingwebhookconfiguration",
            "gpu-scheduler-webhook",
            '[{"op":"replace","path":"/webhooks/0/clientConfig/service/name","value":"evil"}]',
            "json",
        ),
    }
    for what, done in refused.items():
        assert done.returncode != 0 and "gpu-scheduler-certs-writes" in done.stderr, (
            what,
            done.stdout,
            done.stderr,
        )
    allowed = patch(
        "deployment",
        "gpu-scheduler",
        '{"spec":{"template":{"metadata":{"annotations":'
        '{"gpu-scheduler.io/client-pair-sha256":"test"}}}}}',
    )
    assert allowed.returncode == 0, allowed.stderr


def test_helm_install_makes_its_certificates_inside_the_cluster(
    fresh_cluster, helm_binary, tmp_path
):
    """The default install (certificates.mode internal) with nothing but helm: the
    certificate controller, with its own RBAC, makes the CA and the three pairs,
    injects the caBundle and rolls kube-scheduler; a second pass changes nothing. Then
    an upgrade to mode external hands the certificates to deploy/install-certs.sh."""
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
    assert "STATUS: deployed" in out and "gpu-scheduler-certs controller" in out, out
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
    assert hook.failure_policy == "Ignore"  # until the certificate controller arms it

    core = client.CoreV1Api(api)
    first = _controller(cluster, core, tmp_path)
    assert any("wrote Secret gpu-scheduler-internal-ca" in line for line in first), first
    ca = _secret_files(core, "gpu-scheduler-internal-ca")
    assert set(ca) == {"ca.crt", "ca.key"}
    pairs = {}
    for name in ("webhook", "extender", "scheduler"):
        secret = core.read_namespaced_secret(f"gpu-scheduler-{name}-tls", NAMESPACE)
        assert secret.type == "kubernetes.io/tls"
        pairs[name] = _secret_files(core, f"gpu-scheduler-{name}-tls")
        assert pairs[name]["ca.crt"] == ca["ca.crt"]
    (hook,) = admission.read_mutating_webhook_configuration("gpu-scheduler-webhook").webhooks
    assert base64.b64decode(hook.client_config.ca_bundle) == ca["ca.crt"]
    assert hook.failure_policy == "Ignore"  # no webhook pod is Ready in the lab: not armed
    rolled = apps.read_namespaced_deployment("gpu-scheduler", NAMESPACE)
    fingerprint = rolled.spec.template.metadata.annotations["gpu-scheduler.io/client-pair-sha256"]
    assert _controller(cluster, core, tmp_path) == []  # nothing to do the second time
    assert _secret_files(core, "gpu-scheduler-scheduler-tls") == pairs["scheduler"]
    again = apps.read_namespaced_deployment("gpu-scheduler", NAMESPACE)
    assert again.spec.template.metadata.annotations == rolled.spec.template.metadata.annotations
    assert len(fingerprint) == 64
    _the_controller_is_confined(cluster)
    certs = tmp_path / "from-controller" / "scheduler"
    certs.mkdir(parents=True)
    for key, data in pairs["scheduler"].items():
        (certs / key).write_bytes(data)

    # mode external: the controller goes with the upgrade; deploy/install-certs.sh
    # takes over, twice: the second run keeps everything.
    _run(
        helm_binary,
        "helm",
        "upgrade",
        "gpu-scheduler",
        str(CHART),
        "-n",
        NAMESPACE,
        "--set",
        "certificates.mode=external",
        f"--kubeconfig={cluster.kubeconfig}",
    )
    assert not apps.list_namespaced_deployment(
        NAMESPACE, field_selector="metadata.name=gpu-scheduler-certs"
    ).items
    external = tmp_path / "certs-out"
    for _ in range(2):
        done = install_certs(cluster, external, tmp_path / "bin")
        assert done.returncode == 0, done.stdout + done.stderr
    for name in ("webhook", "extender", "scheduler"):
        files = _secret_files(core, f"gpu-scheduler-{name}-tls")
        assert files["tls.crt"] == (external / name / "tls.crt").read_bytes()
        assert files["ca.crt"] == (external / "ca" / "ca.crt").read_bytes()
    (hook,) = admission.read_mutating_webhook_configuration("gpu-scheduler-webhook").webhooks
    assert (
        base64.b64decode(hook.client_config.ca_bundle) == (external / "ca" / "ca.crt").read_bytes()
    )

    # The rendered KubeSchedulerConfiguration is one this minor's kube-scheduler runs
    # with: it builds the extender client from it (reading the certificate files),
    # starts, and answers /healthz.
    config = client.CoreV1Api(api).read_namespaced_config_map("gpu-scheduler-config", NAMESPACE)
    parsed = yaml.safe_load(config.data["scheduler-config.yaml"])
    # The files of the Secret gpu-scheduler-scheduler-tls, where the pod mounts them.
    tls = parsed["extenders"][0]["tlsConfig"]
    for field, name in (("certFile", "tls.crt"), ("keyFile", "tls.key"), ("caFile", "ca.crt")):
        assert tls[field] == f"/etc/gpu-scheduler/tls/{name}"
        tls[field] = str(certs / name)
    cluster.start_scheduler("gpu-scheduler-from-chart", parsed)
    time.sleep(3)  # its informers list every kind it schedules with
    log = cluster.processes["gpu-scheduler-from-chart"].log_path.read_text()
    assert "could not find the requested resource" not in log, log[-3000:]
    cluster.stop_process("gpu-scheduler-from-chart")


def _gpu_pod_body(prefix: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": prefix},
        "spec": {
            "containers": [
                {"name": "c", "image": "pause", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ]
        },
    }


def _gpu_pod_admitted(api: Any) -> str | None:
    """None when a GPU pod is created (then deleted); else the API server's refusal."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    body = _gpu_pod_body("after-uninstall-")
    core = client.CoreV1Api(api)
    try:
        pod = core.create_namespaced_pod("default", body)
    except ApiException as exc:
        return str(exc.body)[:300]
    core.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=0)
    return None


def test_uninstall_leaves_nothing_that_refuses_pods(fresh_cluster, helm_binary):
    """`helm uninstall` (Helm deletes the MutatingWebhookConfiguration before the
    webhook's Service and pods) and `kubectl delete -k deploy/` each leave no webhook
    behind: a GPU pod that the installed webhook refused (it has no endpoint here) is
    created once they are done."""
    from kubernetes import client

    cluster = fresh_cluster
    api = cluster.api_client()
    admission = client.AdmissionregistrationV1Api(api)

    def webhooks() -> list[str]:
        items = admission.list_mutating_webhook_configuration().items
        return [c.metadata.name for c in items if c.metadata.name.startswith("gpu-scheduler")]

    assert webhooks() == ["gpu-scheduler-webhook"]  # installed by the test before
    assert "gpu-scheduler-webhook" in (_gpu_pod_admitted(api) or "")
    out = _run(
        helm_binary,
        "helm",
        "uninstall",
        "gpu-scheduler",
        "-n",
        NAMESPACE,
        "--wait",
        f"--kubeconfig={cluster.kubeconfig}",
    )
    assert "uninstalled" in out, out
    assert webhooks() == []
    assert _gpu_pod_admitted(api) is None
    # kubectl: the same install from deploy/, then its deletion.
    kubectl = ["kubectl", f"--kubeconfig={cluster.kubeconfig}"]
    _run(cluster.binary, *kubectl, "apply", "--server-side", "-k", str(ROOT / "deploy"))
    assert webhooks() == ["gpu-scheduler-webhook"]
    assert _gpu_pod_admitted(api) is None  # Ignore until armed: it never served here
    arm = '[{"op":"replace","path":"/webhooks/0/failurePolicy","value":"Fail"}]'
    patch = ["patch", "mutatingwebhookconfiguration", "gpu-scheduler-webhook", "--type=json"]
    _run(cluster.binary, *kubectl, *patch, "-p", arm)  # as the controller would arm it
    assert _gpu_pod_admitted(api) is not None
    _run(cluster.binary, *kubectl, "delete", "--wait=false", "-k", str(ROOT / "deploy"))
    assert webhooks() == []
    assert _gpu_pod_admitted(api) is None
    cluster_scoped = [
        ("ClusterRole", client.RbacAuthorizationV1Api(api).list_cluster_role),
        ("ClusterRoleBinding", client.RbacAuthorizationV1Api(api).list_cluster_role_binding),
    ]
    for kind, lister in cluster_scoped:
        left = [o.metadata.name for o in lister().items if o.metadata.name.startswith("gpu-sched")]
        assert left == [], (kind, left)


def _readme_install(chart: Path, *values: str) -> list[str]:
    """The README's helm install, its chart reference this checkout's chart."""
    from tests.e2e.test_real_node import README_CHART, readme_commands

    (helm, *args), *_ = readme_commands()
    assert helm == "helm" and args[0] == "install", args
    args[args.index(README_CHART)] = str(chart)
    return [helm, *args, *values]


def _left_of(cluster: Any, docs: list[dict[str, Any]]) -> list[str]:
    """What of the rendered objects exists, and what is in the namespace besides what
    the API server puts in every namespace."""
    import subprocess

    kubectl = [str(cluster.binary), "kubectl", f"--kubeconfig={cluster.kubeconfig}"]
    left = []
    for obj in docs:
        kind, namespace, name = _key(obj)
        where = ["-n", namespace] if namespace else []
        done = subprocess.run(
            [*kubectl, "get", kind, name, *where, "-o", "name"], capture_output=True, text=True
        )
        if done.returncode == 0 or "NotFound" not in done.stderr:
            left.append(f"{kind} {namespace}/{name}")
    kinds = "deploy,rs,pod,svc,cm,secret,sa,role,rolebinding,pdb,networkpolicy,lease"
    out = _run(cluster.binary, *kubectl[1:], "get", kinds, "-n", NAMESPACE, "-o", "name")
    by_default = {"configmap/kube-root-ca.crt", "serviceaccount/default"}
    return left + [line for line in out.split() if line not in by_default]


def test_a_broken_install_refuses_nothing_and_rolls_back(fresh_cluster, helm_binary):
    """The README's helm install (--wait --rollback-on-failure) with an image that
    cannot be pulled: no webhook pod ever gets Ready (the lab has no kubelet at all).
    While helm waits, the webhook is registered with failurePolicy Ignore and a GPU pod
    is created, unmutated (default-scheduler, no GPU toleration); at the timeout helm
    fails and uninstalls: nothing of the install is left but the namespace
    --create-namespace made, and a GPU pod is created as before."""
    import subprocess
    import threading

    from kubernetes import client

    cluster = fresh_cluster
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    names = lambda: [n.metadata.name for n in core.list_namespace().items]  # noqa: E731
    wait_for(lambda: NAMESPACE not in names(), 120, "the namespace of the test before gone", 1)
    image = ["--set", "image.repository=registry.invalid/gpu-scheduler"]
    argv = _readme_install(CHART, *image, "--timeout", "45s")
    for flag in ("--wait", "--rollback-on-failure", "--timeout"):
        assert flag in argv, f"the README's install has no {flag}: {argv}"
    rendered = helm_template(helm_binary, *image)
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    done: dict[str, Any] = {}
    started = time.monotonic()

    def install() -> None:
        done["run"] = subprocess.run(
            [str(helm_binary), *argv], env=env, capture_output=True, text=True, timeout=300
        )

    thread = threading.Thread(target=install, daemon=True)
    thread.start()

    def registered() -> bool:
        items = admission.list_mutating_webhook_configuration().items
        return any(c.metadata.name == "gpu-scheduler-webhook" for c in items)

    wait_for(registered, 40, "the webhook registered")
    (hook,) = admission.read_mutating_webhook_configuration("gpu-scheduler-webhook").webhooks
    assert hook.failure_policy == "Ignore"
    pod = core.create_namespaced_pod("default", _gpu_pod_body("while-helm-waits-"))
    waited = time.monotonic() - started
    assert pod.spec.scheduler_name == "default-scheduler"
    assert not any(t.key == "nvidia.com/gpu" for t in pod.spec.tolerations or [])
    core.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=0)
    assert "run" not in done, "helm returned before the GPU pod was created"
    thread.join(300)
    run = done["run"]
    assert run.returncode != 0, run.stdout + run.stderr
    assert "INSTALLATION FAILED" in run.stderr and "uninstalled" in run.stderr, run.stderr
    print(f"GPU pod created unmutated {waited:.1f}s into helm's wait; helm: {run.stderr[-300:]}")
    wait_for(lambda: not _left_of(cluster, rendered), 60, "nothing of the install left", 1)
    assert NAMESPACE in names()  # --create-namespace's, which helm leaves by design
    kubeconfig = f"--kubeconfig={cluster.kubeconfig}"
    status = _fails(helm_binary, "helm", "status", "gpu-scheduler", "-n", NAMESPACE, kubeconfig)
    assert "release: not found" in status, status  # no record of it kept either
    assert _gpu_pod_admitted(api) is None
    core.delete_namespace(NAMESPACE)


def test_kustomize_users_pin_the_scheduler_to_their_cluster(control_plane_binary, tmp_path):
    """The README's overlay for kustomize users: kube-scheduler's image set to the
    cluster's version."""
    import re as _re

    readme = (ROOT / "docs" / "install" / "README.md").read_text()
    block = _re.search(r"```yaml\n(# kustomization.yaml: kube-scheduler.*?)```", readme, _re.S)
    assert block, "docs/install/README.md: the kube-scheduler version overlay"
    overlay = yaml.safe_load(block[1])
    import os

    # The README points at the reader's clone; kustomize takes relative paths only.
    overlay["resources"] = [os.path.relpath(ROOT / "deploy", tmp_path)]
    clone = "../gpu-scheduler/"
    overlay["components"] = [
        os.path.relpath(ROOT / c.removeprefix(clone), tmp_path) for c in overlay["components"]
    ]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    docs = list(
        yaml.safe_load_all(_run(control_plane_binary, "kubectl", "kustomize", str(tmp_path)))
    )
    wanted = overlay["images"][0]
    assert scheduler_image(docs) == f"{wanted['name']}:{wanted['newTag']}"
    assert scheduler_image(docs) != base_scheduler_image()
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and "scheduler-config" in str(d)]
    profile = yaml.safe_load(config["data"]["scheduler-config.yaml"])["profiles"][0]
    assert "podGroupPostFilter" not in profile.get("plugins", {})  # 1.34 refuses the field


def _fails(binary, *args: str) -> str:
    import subprocess

    done = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, f"{' '.join(args)} rendered"
    return done.stderr


def _kustomize_with(binary, tmp_path, *components: str) -> list[dict[str, Any]]:
    """deploy/ with ``components`` (folders under deploy/), as an admin's overlay."""
    import os

    folder = tmp_path / ("overlay-" + "-".join(c.replace("/", "_") for c in components))
    folder.mkdir()
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "deploy", folder)],
        "components": [os.path.relpath(ROOT / "deploy" / c, folder) for c in components],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return [d for d in yaml.safe_load_all(_run(binary, "kubectl", "kustomize", str(folder))) if d]


AGENT = ("DaemonSet", NAMESPACE, "gpu-scheduler-agent")


@pytest.mark.parametrize(
    ("values", "components"),
    [
        ([], []),  # auto, without a cluster: eks, as the base
        (["--set", "agent.platform=eks"], []),
        (["--set", "agent.platform=gpu-operator"], ["agent/platform/gpu-operator"]),
        (["--set", "agent.platform=gke"], ["agent/platform/gke"]),
        # auto on a GKE cluster (its version says so): gke.
        (["--kube-version", "v1.34.4-gke.1200"], ["agent/platform/gke"]),
    ],
    ids=["auto", "eks", "gpu-operator", "gke", "auto-on-gke"],
)
def test_each_agent_platform_renders_as_its_component(
    control_plane_binary, helm_binary, tmp_path, values, components
):
    """The chart's agent.platform and deploy/'s components make one DaemonSet."""
    chart = _normalise(helm_template(helm_binary, *values))[AGENT]
    kustomize = _normalise(_kustomize_with(control_plane_binary, tmp_path, *components))[AGENT]
    assert chart == kustomize
    spec = chart["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    platform = components[0].rsplit("/", 1)[1] if components else "eks"
    assert spec.get("runtimeClassName") == ("nvidia" if platform == "gpu-operator" else None)
    if platform == "gke":
        assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
        assert "NVIDIA_VISIBLE_DEVICES" not in env
        (host,) = [v for v in spec["volumes"] if "hostPath" in v]
        assert host["hostPath"] == {"path": "/home/kubernetes/bin/nvidia", "type": "Directory"}
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == host["name"]]
        assert mount == {**mount, "mountPath": "/usr/local/nvidia", "readOnly": True}
        assert container["securityContext"] == {"privileged": True, "readOnlyRootFilesystem": True}
        assert spec["securityContext"]["runAsNonRoot"] is True  # still user 65532
    else:
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
        assert "LD_LIBRARY_PATH" not in env
        assert not [v for v in spec["volumes"] if "hostPath" in v]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert "privileged" not in container["securityContext"]


def test_an_unknown_agent_platform_fails_the_install(helm_binary):
    for verb in ("template", "install"):
        args = ["helm", verb, "gpu-scheduler", str(CHART), "--set", "agent.platform=aks"]
        if verb == "install":
            args += ["--dry-run=client"]
        err = _fails(helm_binary, *args)
        assert "agent.platform aks is not one of auto, gpu-operator, gke, eks" in err, err


def _container_port(container: dict[str, Any], name: str) -> int:
    (port,) = [p for p in container["ports"] if p["name"] == name]
    return port["containerPort"]


def test_host_network_renders_what_it_says(helm_binary):
    """webhook.hostNetwork and extender.hostNetwork with their ports: the pods in the
    node's network on those ports (containerPort = hostPort), one a node, resolving
    cluster names; the Services, probes, arguments and NetworkPolicies follow; the
    webhook's clientConfig and kube-scheduler's URL still name the Services."""
    docs = {
        _key(d): d
        for d in helm_template(
            helm_binary,
            *("--set", "webhook.hostNetwork=true", "--set", "webhook.port=9443"),
            *("--set", "extender.hostNetwork=true", "--set", "extender.port=9888"),
            *("--set", "extender.opsPort=9889"),
        )
    }
    ports = {
        "gpu-scheduler-webhook": {"https": 9443},
        "gpu-scheduler-extender": {"https": 9888, "metrics": 9889},
    }
    for name, wanted in ports.items():
        deployment = docs[("Deployment", NAMESPACE, name)]
        spec = deployment["spec"]["template"]["spec"]
        assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        (container,) = spec["containers"]
        assert {p["name"]: p["containerPort"] for p in container["ports"]} == wanted
        assert all(p["hostPort"] == p["containerPort"] for p in container["ports"])
        for probe in ("readinessProbe", "livenessProbe"):
            assert _container_port(container, container[probe]["httpGet"]["port"]) in set(
                wanted.values()
            )
        (term,) = spec["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term == {
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": name}},
        }
        # A surge pod may find no node without one: the rollout lets one go first.
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 1
        service = docs[("Service", NAMESPACE, name)]
        for port in service["spec"]["ports"]:
            assert _container_port(container, port["targetPort"]) == wanted[port["name"]]
        policy = docs[("NetworkPolicy", NAMESPACE, name)]
        assert {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]} == set(
            wanted.values()
        )
    webhook = docs[("Deployment", NAMESPACE, "gpu-scheduler-webhook")]["spec"]["template"]
    args = webhook["spec"]["containers"][0]["args"]
    assert args[args.index("--port") + 1] == "9443"
    extender = docs[("Deployment", NAMESPACE, "gpu-scheduler-extender")]["spec"]["template"]
    args = extender["spec"]["containers"][0]["args"]
    assert "--port=9888" in args and "--ops-port=9889" in args
    (hook,) = docs[("MutatingWebhookConfiguration", "", "gpu-scheduler-webhook")]["webhooks"]
    service = docs[("Service", NAMESPACE, "gpu-scheduler-webhook")]
    assert hook["clientConfig"]["service"]["name"] == service["metadata"]["name"]
    assert hook["clientConfig"]["service"]["port"] == service["spec"]["ports"][0]["port"] == 443
    config = yaml.safe_load(
        docs[("ConfigMap", NAMESPACE, "gpu-scheduler-config")]["data"]["scheduler-config.yaml"]
    )
    url = config["extenders"][0]["urlPrefix"]
    assert url == f"https://gpu-scheduler-extender.{NAMESPACE}.svc:8888"
    extender_service = docs[("Service", NAMESPACE, "gpu-scheduler-extender")]
    assert 8888 in {p["port"] for p in extender_service["spec"]["ports"]}
    # Off (the default): none of it.
    plain = {_key(d): d for d in helm_template(helm_binary)}
    spec = plain[("Deployment", NAMESPACE, "gpu-scheduler-webhook")]["spec"]["template"]["spec"]
    assert "hostNetwork" not in spec and "affinity" not in spec
    assert "hostPort" not in spec["containers"][0]["ports"][0]


@pytest.mark.parametrize(
    "values",
    [
        ["--set", "webhook.hostNetwork=true", "--set", "webhook.port=10250"],
        ["--set", "webhook.hostNetwork=true", "--set", "webhook.port=443"],
        ["--set", "extender.hostNetwork=true", "--set", "extender.port=30080"],
        ["--set", "extender.opsPort=8888"],
    ],
    ids=["kubelet", "privileged", "nodeport", "same"],
)
def test_ports_that_would_clash_fail_the_install(helm_binary, values):
    err = _fails(helm_binary, "helm", "template", "x", str(CHART), *values)
    assert "hostNetwork" in err or "must differ" in err, err


def test_host_network_and_gke_pods_are_valid(fresh_cluster, helm_binary, tmp_path):
    """The API server takes the pod templates that the options render (server-side dry
    run, in a namespace of their own): the webhook and extender in the node's network,
    the agent of the gke platform."""
    from kubernetes import client

    namespace = "gpu-hostnet"
    core = client.CoreV1Api(fresh_cluster.api_client())
    if not core.list_namespace(field_selector=f"metadata.name={namespace}").items:
        core.create_namespace({"metadata": {"name": namespace}})
    docs = [
        d
        for d in yaml.safe_load_all(
            _run(
                helm_binary,
                *("helm", "template", "x", str(CHART), "-n", namespace),
                *("--set", "webhook.hostNetwork=true", "--set", "extender.hostNetwork=true"),
                *("--set", "agent.platform=gke"),
            )
        )
        if d and d["kind"] in ("Deployment", "DaemonSet")
    ]
    assert len(docs) >= 4
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    out = _run(
        fresh_cluster.binary,
        *("kubectl", f"--kubeconfig={fresh_cluster.kubeconfig}", "create", "--dry-run=server"),
        *("-f", str(path), "-o", "name"),
    )
    assert out.count("\n") == len(docs), out


WEBHOOK_CONFIG = ("MutatingWebhookConfiguration", "", "gpu-scheduler-webhook")


def _client_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (hook,) = {_key(d): d for d in docs}[WEBHOOK_CONFIG]["webhooks"]
    return hook["clientConfig"]


def test_ca_bundle_is_rendered_in_mode_external_only(helm_binary):
    """certificates.caBundle goes into the webhook configuration in mode external (and
    tool, its 0.1.0 name); in mode internal the certificate controller owns the field,
    in mode cert-manager cert-manager's CA injector does, so a value there fails the
    install instead of being put back over theirs on every upgrade."""
    for mode in ("external", "tool"):
        docs = helm_template(
            helm_binary, "--set", f"certificates.mode={mode}", "--set", "certificates.caBundle=QUJD"
        )
        assert _client_config(docs)["caBundle"] == "QUJD", mode
        assert "caBundle" not in _client_config(
            helm_template(helm_binary, "--set", f"certificates.mode={mode}")
        )
    for mode in ("internal", "cert-manager"):
        assert "caBundle" not in _client_config(
            helm_template(helm_binary, "--set", f"certificates.mode={mode}")
        )
        for verb in ("template", "install"):
            args = ["helm", verb, "gpu-scheduler", str(CHART), "-n", NAMESPACE]
            args += ["--set", f"certificates.mode={mode}", "--set", "certificates.caBundle=QUJD"]
            if verb == "install":
                args += ["--dry-run=client"]
            err = _fails(helm_binary, *args)
            assert f"certificates.caBundle is set, but certificates.mode is {mode}" in err, err
            assert "use certificates.mode external" in err, err


def test_mode_tool_is_external_with_a_warning(helm_binary):
    """0.1.0's certificates.mode tool (its default, kept by --reuse-values) renders what
    external does, and the install's notes say it is deprecated; an unknown mode fails."""
    tool = _normalise(helm_template(helm_binary, "--set", "certificates.mode=tool"))
    external = _normalise(helm_template(helm_binary, "--set", "certificates.mode=external"))
    assert tool == external
    assert ("Deployment", NAMESPACE, "gpu-scheduler-certs") not in tool
    assert ("Deployment", NAMESPACE, "gpu-scheduler-certs") in _normalise(
        helm_template(helm_binary)
    )

    def notes(mode: str) -> str:
        out = _run(
            helm_binary,
            *("helm", "install", "gpu-scheduler", str(CHART), "-n", NAMESPACE),
            *("--dry-run=client", "--set", f"certificates.mode={mode}"),
        )
        return out[out.index("NOTES:") :]

    warned = notes("tool")
    assert 'certificates.mode "tool" is deprecated' in warned, warned
    assert "deploy/install-certs.sh" in warned, warned  # the external branch
    assert "deprecated" not in notes("external")
    err = _fails(helm_binary, "helm", "template", "x", str(CHART), "--set", "certificates.mode=x")
    assert "certificates.mode must be one of internal, cert-manager, external" in err, err


def _excluded(docs: list[dict[str, Any]]) -> list[str]:
    (hook,) = {_key(d): d for d in docs}[WEBHOOK_CONFIG]["webhooks"]
    (expression,) = hook["namespaceSelector"]["matchExpressions"]
    assert expression["key"] == "kubernetes.io/metadata.name"
    assert expression["operator"] == "NotIn"
    return expression["values"]


def test_exclude_namespaces_null_is_none_and_a_non_list_fails(helm_binary, tmp_path):
    """webhook.excludeNamespaces: the release namespace is always added; null (from
    --set or a values file) and [] leave it alone; a string or a map fails the install
    with a message, not a template panic."""
    assert _excluded(helm_template(helm_binary)) == ["kube-system", "gpu-operator", NAMESPACE]
    nulled = tmp_path / "null.yaml"
    nulled.write_text("webhook:\n  excludeNamespaces: ~\n")
    emptied = tmp_path / "empty.yaml"
    emptied.write_text("webhook:\n  excludeNamespaces: []\n")
    for values in (
        ["--set", "webhook.excludeNamespaces=null"],
        ["-f", str(nulled)],
        ["-f", str(emptied)],
        ["--set", f"webhook.excludeNamespaces={{{NAMESPACE}}}"],
    ):
        assert _excluded(helm_template(helm_binary, *values)) == [NAMESPACE], values
    assert _excluded(helm_template(helm_binary, "--set", "webhook.excludeNamespaces={a,b}")) == [
        "a",
        "b",
        NAMESPACE,
    ]
    for value in ("webhook.excludeNamespaces=kube-system", "webhook.excludeNamespaces.a=b"):
        err = _fails(helm_binary, "helm", "template", "x", str(CHART), "--set", value)
        assert "webhook.excludeNamespaces must be a list of namespace names" in err, err
        assert "nil pointer" not in err and "Cannot push" not in err, err


@pytest.mark.parametrize("port", ["8888", "8889"], ids=["port", "opsPort"])
def test_host_network_webhook_and_extender_on_one_port_fail_the_install(helm_binary, port):
    """With both in the node's network, webhook.port equal to extender.port or opsPort
    would keep a webhook pod and an extender pod off each other's nodes: refused. With
    one of them off the host network the ports do not meet, and it renders."""
    both = ["--set", "webhook.hostNetwork=true", "--set", "extender.hostNetwork=true"]
    err = _fails(
        helm_binary, "helm", "template", "x", str(CHART), *both, "--set", f"webhook.port={port}"
    )
    assert f"webhook.port {port} is also extender.port or extender.opsPort" in err, err
    assert "the ports must differ" in err, err
    for one in ("webhook.hostNetwork=true", "extender.hostNetwork=true"):
        docs = helm_template(helm_binary, "--set", one, "--set", f"webhook.port={port}")
        webhook = {_key(d): d for d in docs}[("Deployment", NAMESPACE, "gpu-scheduler-webhook")]
        (container,) = webhook["spec"]["template"]["spec"]["containers"]
        assert _container_port(container, "https") == int(port)
    moved = helm_template(helm_binary, *both, "--set", "extender.port=9888")
    assert len(moved) > 0  # 8443, 9888, 8889: all different
