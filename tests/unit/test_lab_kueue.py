"""The lab's Kueue install: the release's manifests, changed only where a process on
loopback must differ (lab.kueue)."""

from __future__ import annotations

import base64

import pytest
import yaml
from cryptography import x509

from lab import kueue
from lab.processes import ControlPlaneError

RELEASE_CONFIG = {
    "apiVersion": "config.kueue.x-k8s.io/v1beta2",
    "kind": "Configuration",
    "health": {"healthProbeBindAddress": ":8081"},
    "webhook": {"port": 9443},
    "leaderElection": {"leaderElect": True},
    "integrations": {"frameworks": ["batch/job", "ray.io/rayjob", "pod"]},
    "clientConnection": {"qps": 50, "burst": 100},
}
DOCS = [
    {
        "kind": "ConfigMap",
        "metadata": {"name": kueue.CONFIG_MAP},
        "data": {kueue.CONFIG_KEY: yaml.safe_dump(RELEASE_CONFIG)},
    }
]


def test_the_manager_configuration_is_the_releases_with_loopback_changes(tmp_path):
    config = kueue.manager_configuration(
        DOCS, webhook_port=1234, health_port=5678, cert_dir=tmp_path
    )
    assert config["webhook"] == {"port": 1234, "host": "127.0.0.1", "certDir": str(tmp_path)}
    assert config["health"] == {"healthProbeBindAddress": "127.0.0.1:5678"}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["integrations"] == {"frameworks": ["batch/job"]}
    assert config["internalCertManagement"]["webhookSecretName"] == kueue.SECRET
    assert config["clientConnection"] == RELEASE_CONFIG["clientConnection"]  # kept as shipped


def test_service_client_configs_become_url_ones():
    service = {"service": {"name": kueue.SERVICE, "namespace": "kueue-system", "path": "/x"}}
    got = kueue.local_client_config(service, "https://127.0.0.1:9", "QlVORExF")
    assert got == {"url": "https://127.0.0.1:9/x", "caBundle": "QlVORExF"}
    with pytest.raises(ControlPlaneError):
        kueue.local_client_config({"service": {"name": "other"}}, "https://x", "")


def test_the_certificate_secret_passes_kueues_rotation_checks(tmp_path):
    """The rotation keeps the Secret only if its CA verifies for ``kueue-ca``, its CA key
    is PKCS #1 RSA, and the serving certificate names the Service; the lab also needs
    127.0.0.1 in it (the API server calls the url)."""
    secret, bundle = kueue.certificate_secret(tmp_path)
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert data["ca.key"].startswith(b"-----BEGIN RSA PRIVATE KEY-----")
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    names = ca.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [kueue.CA_NAME]
    leaf = x509.load_pem_x509_certificate(data["tls.crt"])
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{kueue.SERVICE}.{kueue.NAMESPACE}.svc" in sans.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert base64.b64decode(bundle) == data["ca.crt"]
    assert (tmp_path / "tls.crt").read_bytes() == data["tls.crt"]  # as a volume mounts it
