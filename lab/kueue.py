"""Kueue on the lab's control plane: the release's own binary and manifests.

``tools/k8s/build.sh kueue`` builds ``sigs.k8s.io/kueue/cmd/kueue`` from its Go module
(a go.mod of its own, as Kueue's Kubernetes libraries are older than the control
plane's) and copies the module's ``config/`` beside it. :func:`start_kueue` renders
``config/default`` with the control plane's ``kubectl kustomize``, exactly as a cluster
admin would, and installs from it what a process outside the cluster needs:

* the CRDs (their conversion webhooks pointed at the process);
* Kueue's mutating and validating webhook configurations, with a ``url`` clientConfig
  and the lab CA's bundle instead of the in-cluster Service (the lab has no Service
  network), like our own webhook's (:func:`lab.stack.webhook_configuration`);
* the manager's ``Configuration`` from the release's ConfigMap, changed only where a
  process on loopback must differ: no leader election, loopback ports, and the
  integrations the lab has the CRDs for (``batch/job``).

Kueue's internal certificate rotation stays on (without it the manager insists on
metrics certificates at a fixed ``/etc/kueue`` path). Its Secret is created first, with
a CA named as the rotation checks it (``kueue-ca``) and a serving certificate for the
Service's names and 127.0.0.1, so the rotation finds them good, keeps them, writes them
to the webhook server's folder, and injects that CA into the configurations above.

Kueue runs with the admin kubeconfig (the lab's; its RBAC is the release's, for
clusters). It is the engine of whole-job admission by quota and of Topology Aware
Scheduling; our webhook and extender place the pods it admits.
"""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lab.controlplane import BUILD_SCRIPT, LocalCluster
from lab.processes import ControlPlaneError, Process, free_port, wait_port, wait_url

NAMESPACE = "kueue-system"
CONFIG_MAP = "kueue-manager-config"
CONFIG_KEY = "controller_manager_config.yaml"
SERVICE = "kueue-webhook-service"
SECRET = "kueue-webhook-server-cert"
CA_NAME = "kueue-ca"  # the name Kueue's certificate rotation verifies its CA by
#: Job frameworks the lab serves: batch/Job needs no CRD beyond Kubernetes' own.
FRAMEWORKS = ("batch/job",)
HOW_TO_GET_IT = "Kueue is not built: run `tools/k8s/build.sh kueue` (`make test` does)"


def kueue_binary() -> Path | None:
    """The Kueue build (``tools/k8s/build.sh --path kueue``), if it is there."""
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--path", "kueue"], capture_output=True, text=True
    )
    path = Path(done.stdout.strip()) if done.returncode == 0 else None
    if path is None or not path.is_file() or not (path.parent / "config").is_dir():
        return None
    return path


def render(cluster: LocalCluster, binary: Path) -> list[dict[str, Any]]:
    """The release's install (``config/default``) as ``kubectl kustomize`` renders it."""
    done = subprocess.run(
        [str(cluster.binary), "kubectl", "kustomize", str(binary.parent / "config" / "default")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [d for d in yaml.safe_load_all(done.stdout) if isinstance(d, dict) and d.get("kind")]


def _of_kind(docs: list[dict[str, Any]], kind: str) -> Iterator[dict[str, Any]]:
    return (copy.deepcopy(d) for d in docs if d["kind"] == kind)


def local_client_config(
    client_config: Mapping[str, Any], base_url: str, ca_bundle: str
) -> dict[str, Any]:
    """A Service clientConfig (``service: {name, namespace, path}``) as a ``url`` one
    to the process at ``base_url``, trusting ``ca_bundle``."""
    service = client_config.get("service") or {}
    if service.get("name") != SERVICE:
        raise ControlPlaneError(f"unexpected Kueue webhook clientConfig: {dict(client_config)}")
    return {"url": base_url + (service.get("path") or "/"), "caBundle": ca_bundle}


def manager_configuration(
    docs: list[dict[str, Any]], *, webhook_port: int, health_port: int, cert_dir: Path
) -> dict[str, Any]:
    """The release's manager Configuration, changed where a loopback process must be."""
    (config_map,) = [d for d in _of_kind(docs, "ConfigMap") if d["metadata"]["name"] == CONFIG_MAP]
    config = yaml.safe_load(config_map["data"][CONFIG_KEY])
    config["namespace"] = NAMESPACE
    config["leaderElection"] = {"leaderElect": False}
    config["health"] = {"healthProbeBindAddress": f"127.0.0.1:{health_port}"}
    config["metrics"] = {"bindAddress": "0"}
    config["webhook"] = {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)}
    config["internalCertManagement"] = {
        "enable": True,
        "webhookServiceName": SERVICE,
        "webhookSecretName": SECRET,
    }
    config["integrations"] = {"frameworks": list(FRAMEWORKS)}
    return config


@dataclass
class Kueue:
    cluster: LocalCluster
    process: Process
    webhooks: tuple[tuple[str, str], ...]  # (kind, name) of the webhook configurations

    def stop(self) -> None:
        """Remove its webhook configurations (failurePolicy Fail: they would block Job
        and pod creation once the process is gone), then stop it. CRDs and objects
        stay, as after an uninstall that keeps them."""
        for kind, name in self.webhooks:
            resource = {
                "MutatingWebhookConfiguration": "mutatingwebhookconfiguration",
                "ValidatingWebhookConfiguration": "validatingwebhookconfiguration",
            }[kind]
            self.cluster.k8s("kubectl", "delete", resource, name, "--ignore-not-found", check=False)
        self.cluster.stop_process(self.process.name)


def certificate_secret(cert_dir: Path) -> tuple[dict[str, Any], str]:
    """The Secret Kueue's certificate rotation keeps (CA ``kueue-ca``; a serving pair
    for the webhook Service's names and 127.0.0.1), and that CA's PEM bundle. Its files
    are also written to ``cert_dir``, where a cluster mounts the Secret as a volume."""
    import base64
    import datetime as dt

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from certs import build

    now = dt.datetime.now(dt.UTC)
    # The rotation parses its CA key as PKCS #1 RSA only.
    ca_key, key = rsa.generate_private_key(public_exponent=65537, key_size=2048), build.new_key()
    ca = build.build_ca(ca_key, now, 3650, CA_NAME, dns_names=[CA_NAME])
    identity = build.service_identity(SERVICE, NAMESPACE, ["127.0.0.1"])
    leaf = build.build_serving_cert(key, identity, ca, ca_key, now, 3650)
    data = {
        "ca.crt": build.cert_pem(ca),
        "ca.key": ca_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        ),
        "tls.crt": build.cert_pem(leaf),
        "tls.key": build.key_pem(key),
    }
    cert_dir.mkdir(parents=True, exist_ok=True)
    for name, pem in data.items():
        (cert_dir / name).write_bytes(pem)
        (cert_dir / name).chmod(0o600)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": NAMESPACE},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }
    return secret, base64.b64encode(data["ca.crt"]).decode()


def start_kueue(cluster: LocalCluster, workdir: Path) -> Kueue:
    """Kueue's CRDs, webhooks and manager on ``cluster``; ready when it returns."""
    binary = kueue_binary()
    if binary is None:
        raise ControlPlaneError(HOW_TO_GET_IT)
    docs = render(cluster, binary)
    webhook_port, health_port = free_port(), free_port()
    base = f"https://127.0.0.1:{webhook_port}"
    workdir.mkdir(parents=True, exist_ok=True)
    cert_dir = workdir / "certs"
    secret, ca_bundle = certificate_secret(cert_dir)

    crds = []
    for crd in _of_kind(docs, "CustomResourceDefinition"):
        webhook = ((crd["spec"].get("conversion") or {}).get("webhook")) or {}
        if "clientConfig" in webhook:
            webhook["clientConfig"] = local_client_config(webhook["clientConfig"], base, ca_bundle)
        crds.append(crd)
    crd_file = workdir / "kueue-crds.yaml"
    crd_file.write_text(yaml.safe_dump_all(crds))
    cluster.k8s("kubectl", "apply", "--server-side", "-f", str(crd_file), timeout=120)
    cluster.k8s(
        "kubectl",
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "-f",
        str(crd_file),
        timeout=90,
    )
    cluster.k8s("kubectl", "create", "namespace", NAMESPACE, check=False)
    secret_file = workdir / "kueue-secret.yaml"
    secret_file.write_text(yaml.safe_dump(secret))
    secret_file.chmod(0o600)
    cluster.k8s("kubectl", "apply", "-f", str(secret_file))

    webhooks = []
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for doc in _of_kind(docs, kind):
            for hook in doc.get("webhooks") or []:
                hook["clientConfig"] = local_client_config(hook["clientConfig"], base, ca_bundle)
            doc["metadata"].pop("annotations", None)  # cert-manager's, not used here
            path = workdir / f"kueue-{kind.lower()}.yaml"
            path.write_text(yaml.safe_dump(doc))
            cluster.k8s("kubectl", "apply", "-f", str(path))
            webhooks.append((kind, doc["metadata"]["name"]))

    config = manager_configuration(
        docs, webhook_port=webhook_port, health_port=health_port, cert_dir=cert_dir
    )
    config_file = workdir / "kueue-config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    process = cluster.spawn(
        "kueue",
        # The visibility API server (an aggregated API the lab does not register) would
        # write its self-signed pair to /visibility on the host.
        [
            str(binary),
            f"--config={config_file}",
            "--feature-gates=VisibilityOnDemand=false",
            "--zap-log-level=2",
        ],
        env={"KUBECONFIG": str(cluster.kubeconfig)},
    )
    kueue = Kueue(cluster, process, tuple(webhooks))
    try:
        wait_url(f"http://127.0.0.1:{health_port}/readyz", 120, process)
        wait_port(webhook_port, 60, process)  # readyz may come from the bootstrap manager
    except BaseException:
        kueue.stop()
        raise
    return kueue
