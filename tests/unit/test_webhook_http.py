"""The webhook as the API server sees it: a real gunicorn process over real TLS.

Certificates come from ``gpu-scheduler certs generate --ip 127.0.0.1``; the client
trusts only the generated CA and checks the SANs (IP and the Service's DNS names).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from gpu_scheduler.contract import GPU_TOLERATION, RESOURCE_GPU
from tests.factories import admission_review
from tests.helpers import CLI, ROOT, free_port, wait_for
from tests.unit.conftest import CERTS_NAMESPACE, CERTS_SERVICE, WebhookServer, certs_generate

SERVICE_DNS = f"{CERTS_SERVICE}.{CERTS_NAMESPACE}.svc"


def gpu_pod(gpus: str = "1", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": "ml"},
        "spec": {
            "containers": [
                {"name": "main", "image": "cuda", "resources": {"limits": {RESOURCE_GPU: gpus}}}
            ],
            **spec,
        },
    }


def review(obj: Any, uid: str = "b7bb6a4f-0000-4000-8000-000000000001", **req: Any) -> dict:
    return admission_review(obj, uid=uid, namespace="ml", **req)


def post(server: WebhookServer, body: Any, **kw: Any) -> requests.Response:
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    headers = {"Content-Type": "application/json"}
    return requests.post(
        server.url + "/mutate",
        data=data,
        headers=headers,
        verify=str(server.cert_dir / "ca.crt"),
        timeout=10,
        **kw,
    )


def peer_cert(port: int, ctx: ssl.SSLContext, hostname: str) -> tuple[bytes, str]:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=hostname) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der, str(tls.version())


def fingerprint_of(pem_path: Path) -> str:
    der = ssl.PEM_cert_to_DER_cert(pem_path.read_text())
    return hashlib.sha256(der).hexdigest()


# --- TLS -------------------------------------------------------------------------------


def test_chain_and_ip_san_verify_against_generated_ca(webhook_server: WebhookServer) -> None:
    r = requests.get(
        webhook_server.url + "/healthz", verify=str(webhook_server.cert_dir / "ca.crt"), timeout=5
    )
    assert r.status_code == 200 and r.json() == {"status": "ok"}


@pytest.mark.parametrize(
    "hostname",
    [
        CERTS_SERVICE,
        f"{CERTS_SERVICE}.{CERTS_NAMESPACE}",
        SERVICE_DNS,  # what the API server dials for clientConfig.service
        f"{SERVICE_DNS}.cluster.local",
    ],
)
def test_dns_sans_verify(webhook_server: WebhookServer, hostname: str) -> None:
    der, version = peer_cert(webhook_server.port, webhook_server.client_context(), hostname)
    assert hashlib.sha256(der).hexdigest() == fingerprint_of(webhook_server.cert_dir / "tls.crt")
    assert version in ("TLSv1.2", "TLSv1.3")


def test_wrong_hostname_and_unknown_ca_are_refused(webhook_server: WebhookServer) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="match"):
        peer_cert(webhook_server.port, webhook_server.client_context(), "evil.example.com")
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(webhook_server.url + "/healthz", timeout=5)  # system CAs only


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_tls_below_1_2_is_refused(webhook_server: WebhookServer) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        ctx.set_ciphers("ALL:@SECLEVEL=0")
    except (ValueError, ssl.SSLError):
        pytest.skip("this OpenSSL cannot even offer TLS 1.1")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        peer_cert(webhook_server.port, ctx, "127.0.0.1")


# --- AdmissionReview over HTTPS ------------------------------------------------------


def test_mutate_gpu_pod(webhook_server: WebhookServer) -> None:
    r = post(webhook_server, review(gpu_pod(tolerations=[])))
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    body = r.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    resp = body["response"]
    assert resp["uid"] == "b7bb6a4f-0000-4000-8000-000000000001"
    assert resp["allowed"] is True and resp["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(resp["patch"])) == [
        {"op": "add", "path": "/spec/schedulerName", "value": "gpu-scheduler"},
        {"op": "add", "path": "/spec/tolerations/-", "value": GPU_TOLERATION},
    ]
    assert any("schedulerName" in w for w in resp["warnings"])


def test_cpu_pod_and_other_operations_get_no_patch(webhook_server: WebhookServer) -> None:
    cpu = gpu_pod()
    cpu["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    for body in (review(cpu), review(gpu_pod(), operation="UPDATE"), review(gpu_pod(), uid="u2")):
        if body["request"]["uid"] == "u2":
            body["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
        r = post(webhook_server, body)
        assert r.status_code == 200
        assert r.json()["response"] == {"uid": body["request"]["uid"], "allowed": True}


def test_uninterpretable_pod_is_allowed_with_warning(webhook_server: WebhookServer) -> None:
    r = post(webhook_server, review(gpu_pod("a-lot")))
    resp = r.json()["response"]
    assert r.status_code == 200 and resp["allowed"] is True and "patch" not in resp
    assert resp["warnings"] and "nvidia.com/gpu" in resp["warnings"][0]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "not JSON"),
        (b"", "empty request body"),
        (b"\xff\xfe", "not JSON"),
        ({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}, "apiVersion"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "Status"}, "kind"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request"),
        (
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}},
            "uid",
        ),
        ([1, 2], "AdmissionReview"),
    ],
)
def test_bad_input_is_400_with_reason(webhook_server: WebhookServer, body: Any, reason) -> None:
    r = post(webhook_server, body)
    assert r.status_code == 400, r.text
    assert reason in r.json()["error"]


def test_wrong_method_and_path_are_json_errors(webhook_server: WebhookServer) -> None:
    ca = str(webhook_server.cert_dir / "ca.crt")
    r = requests.get(webhook_server.url + "/mutate", verify=ca, timeout=5)
    assert r.status_code == 405 and "error" in r.json()
    r = requests.get(webhook_server.url + "/nope", verify=ca, timeout=5)
    assert r.status_code == 404 and "error" in r.json()


def test_keep_alive_connection_serves_many_reviews(webhook_server: WebhookServer) -> None:
    conn = http.client.HTTPSConnection(
        "127.0.0.1", webhook_server.port, context=webhook_server.client_context(), timeout=5
    )
    try:
        for i in range(20):
            payload = json.dumps(review(gpu_pod(), uid=f"uid-{i}"))
            conn.request("POST", "/mutate", payload, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            assert resp.status == 200
            assert json.loads(resp.read())["response"]["uid"] == f"uid-{i}"
    finally:
        conn.close()


def test_ops_endpoints_and_metrics(webhook_server: WebhookServer) -> None:
    ca = str(webhook_server.cert_dir / "ca.crt")
    post(webhook_server, review(gpu_pod()))
    ready = requests.get(webhook_server.url + "/readyz", verify=ca, timeout=5)
    assert ready.status_code == 200 and ready.json()["ready"] is True
    text = requests.get(webhook_server.url + "/metrics", verify=ca, timeout=5).text
    assert 'gpu_scheduler_webhook_reviews_total{outcome="mutated"}' in text
    assert 'gpu_scheduler_webhook_mutations_total{change="schedulerName"}' in text
    assert "gpu_scheduler_webhook_review_seconds_bucket" in text
    assert 'gpu_scheduler_tls_reloads_total{result="ok"}' in text


def test_one_json_log_line_per_decision(webhook_server: WebhookServer) -> None:
    post(webhook_server, review(gpu_pod(), uid="log-line-uid"))

    def logged() -> bool:
        for line in webhook_server.log.read_text().splitlines():
            if "log-line-uid" in line:
                entry = json.loads(line)
                assert entry["msg"] == "admission" and entry["outcome"] == "mutated"
                assert entry["pod"] == "ml/train-*" and entry["gpus"] == 1
                return True
        return False

    wait_for(logged, 10, "the decision's log line")


# --- configuration, body limit and certificate rotation -----------------------------


@pytest.fixture(scope="module")
def webhook_rotating(webhook_server_factory, tmp_path_factory) -> WebhookServer:
    certs = tmp_path_factory.mktemp("rotating-certs")
    certs_generate(certs)
    config = certs / "webhook.yaml"
    config.write_text("schedulerName: gpu-binpack\nmaxBodyBytes: 65536\n")
    return webhook_server_factory(
        certs, "--config", str(config), "--cert-reload-interval", "0.2s", "--workers", "1"
    )


def test_config_file_is_used(webhook_rotating: WebhookServer) -> None:
    r = post(webhook_rotating, review(gpu_pod()))
    patch = json.loads(base64.b64decode(r.json()["response"]["patch"]))
    assert patch[0]["value"] == "gpu-binpack"


def test_body_over_the_limit_is_413(webhook_rotating: WebhookServer) -> None:
    big = review(gpu_pod())
    big["request"]["object"]["metadata"]["annotations"] = {"x": "y" * 70000}
    r = post(webhook_rotating, big)
    assert r.status_code == 413, r.text
    assert "over the limit" in r.json()["error"]


def test_rotated_certificate_is_served_to_new_connections(
    webhook_rotating: WebhookServer, tmp_path: Path
) -> None:
    server = webhook_rotating
    old = fingerprint_of(server.cert_dir / "tls.crt")
    der, _ = peer_cert(server.port, server.client_context(), SERVICE_DNS)
    assert hashlib.sha256(der).hexdigest() == old
    # A keep-alive connection opened before the rotation.
    conn = http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=server.client_context(), timeout=5
    )
    conn.request("GET", "/healthz")
    assert conn.getresponse().read()

    # A new CA and pair, swapped in the way a Secret update does (rename over).
    fresh = tmp_path / "fresh"
    certs_generate(fresh)
    new = fingerprint_of(fresh / "tls.crt")
    assert new != old
    for name in ("tls.key", "tls.crt", "ca.crt"):
        shutil.copy(fresh / name, server.cert_dir / f".{name}.new")
        os.replace(server.cert_dir / f".{name}.new", server.cert_dir / name)

    started = time.monotonic()
    seen: list[str] = []

    def rotated() -> bool:
        ctx = ssl.create_default_context(cafile=str(fresh / "ca.crt"))
        der, _ = peer_cert(server.port, ctx, SERVICE_DNS)  # verifies against the new CA
        seen.append(hashlib.sha256(der).hexdigest())
        return seen[-1] == new

    wait_for(rotated, 10, "the rotated certificate", interval=0.1)
    assert time.monotonic() - started < 10
    r = post(server, review(gpu_pod()))  # verified against the new ca.crt in the dir
    assert r.status_code == 200
    # The connection opened before keeps working on its original session.
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    conn.close()


def test_missing_certificates_fail_fast(tmp_path: Path) -> None:
    cmd = [*CLI, "webhook", "--host", "127.0.0.1", "--port", str(free_port())]
    proc = subprocess.run(
        [*cmd, "--cert-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "tls.crt" in proc.stderr
