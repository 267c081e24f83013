"""A CA rollover (begin, switch, finish: what `deploy/install-certs.sh rotate-ca` runs)
while GPU pods are created in a loop: none is refused by the webhook's TLS, and every
one is placed by the real kube-scheduler through the extender over mTLS.

The API server and kube-scheduler keep their connections alive, and TLS trust is only
checked at a handshake, so the pods alone would not notice a bad moment. A prober
therefore opens fresh connections throughout, with the trust as published at that
instant: the webhook configuration's caBundle against the webhook, and
kube-scheduler's files (client pair, CA bundle) against the extender."""

from __future__ import annotations

import base64
import shutil
import socket
import ssl
import tempfile
import threading
import time
from pathlib import Path

import requests
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from certs import store
from gpu_scheduler import certinfo
from tests.e2e.kube import (
    core,
    create_pod,
    pod_manifest,
    unique,
    wait_bound,
)
from tests.e2e.scenarios import gpu_node
from tests.fuzz.servers import names_body

SETTLE_S = 3.0  # the lab's files are its Secret volumes: the servers check every 1s


def _served(port: int):
    """The certificate a server on 127.0.0.1:``port`` presents now."""
    return certinfo.load_cert(ssl.get_server_certificate(("127.0.0.1", port)).encode())


def _probe_once(stack, admission: client.AdmissionregistrationV1Api, name: str) -> str | None:
    """One fresh handshake per trust relation; what failed, or None."""
    config = admission.read_mutating_webhook_configuration(name)
    bundle = base64.b64decode(config.webhooks[0].client_config.ca_bundle).decode()
    try:
        context = ssl.create_default_context(cadata=bundle)
        with socket.create_connection(("127.0.0.1", stack.webhook_port), timeout=5) as sock:
            context.wrap_socket(sock, server_hostname="127.0.0.1").close()
    except (OSError, ssl.SSLError) as exc:
        return f"API server -> webhook: {exc}"
    trust = stack.extender_client()
    trust["cert"] = _one_pair(*trust["cert"])
    try:
        response = requests.post(
            f"{stack.extender_url}/filter", json=names_body(), timeout=5, **trust
        )
    except requests.RequestException as exc:
        return f"kube-scheduler -> extender: {exc}"
    finally:
        shutil.rmtree(Path(trust["cert"][0]).parent, ignore_errors=True)
    if response.status_code != 200:
        return f"kube-scheduler -> extender: {response.status_code} {response.text[:200]}"
    return None


def _one_pair(cert: str, key: str) -> tuple[str, str]:
    """kube-scheduler's client pair as one update of its Secret volume shows it: a copy
    of the two files taken when they match. The lab replaces them one rename after the
    other, so a reader between the renames would pair the new certificate with the old
    key (KEY_VALUES_MISMATCH before any byte is sent), which a Secret volume, swapped
    whole by the kubelet, never shows; a pair that never matches is returned as read."""
    out = Path(tempfile.mkdtemp(prefix="pair-"))
    paths = (str(out / "tls.crt"), str(out / "tls.key"))
    for _ in range(20):
        Path(paths[0]).write_bytes(Path(cert).read_bytes())
        Path(paths[1]).write_bytes(Path(key).read_bytes())
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(*paths)
            return paths
        except ssl.SSLError:
            time.sleep(0.05)
    return paths


def _cas(text: bytes) -> int:
    return text.count(b"BEGIN CERTIFICATE")


def test_ca_rollover_refuses_no_gpu_pod(stack):
    case = "rollover"
    for _ in range(3):
        gpu_node(stack, case, 64)
    created: list[str] = []
    refused: list[str] = []
    stop = threading.Event()

    def create_in_a_loop() -> None:
        while not stop.is_set():
            name = unique("roll")
            try:
                create_pod(stack, pod_manifest(name, 1, case=case))
                created.append(name)
            except ApiException as exc:
                refused.append(f"{exc.status}: {exc.body}")
            time.sleep(0.25)

    admission = client.AdmissionregistrationV1Api(stack.api)
    (config,) = [
        c
        for c in admission.list_mutating_webhook_configuration().items
        if c.metadata.name.endswith("-local")
    ]
    broken: list[str] = []
    probes = [0]

    def probe_in_a_loop() -> None:
        while not stop.is_set():
            problem = _probe_once(stack, admission, config.metadata.name)
            probes[0] += 1
            if problem:
                broken.append(problem)
            time.sleep(0.05)

    ca_file = stack.pki / "ca" / store.CA_CERT
    old_ca = ca_file.read_bytes()
    loops = [threading.Thread(target=f, daemon=True) for f in (create_in_a_loop, probe_in_a_loop)]
    for loop in loops:
        loop.start()
    restarts = 0
    try:
        time.sleep(1)
        for phase in store.PHASES:
            store.rotate_ca(stack.pki / "ca", phase)
            restarts += stack.publish_certificates()
            time.sleep(SETTLE_S)
    finally:
        stop.set()
        for loop in loops:
            loop.join(10)

    assert not refused, f"{len(refused)} of {len(created) + len(refused)} refused: {refused[:3]}"
    assert not broken, f"{len(broken)} of {probes[0]} fresh handshakes failed: {broken[:3]}"
    assert len(created) >= 20 and probes[0] >= 50
    # The rollover happened: a new CA signs, the servers present leaves it signed, and
    # it alone is trusted now (each leaf's bundle, the webhook's caBundle).
    new_ca = certinfo.load_cert(ca_file.read_bytes())
    assert ca_file.read_bytes() != old_ca
    for port in (stack.webhook_port, stack.extender_port):
        _served(port).verify_directly_issued_by(new_ca)
    for folder in ("webhook", "extender", "scheduler"):
        certinfo.load_cert(
            (stack.pki / folder / store.TLS_CERT).read_bytes()
        ).verify_directly_issued_by(new_ca)
        assert _cas((stack.pki / folder / store.CA_CERT).read_bytes()) == 1, folder
    config = admission.read_mutating_webhook_configuration(config.metadata.name)
    assert _cas(base64.b64decode(config.webhooks[0].client_config.ca_bundle)) == 1
    assert restarts == 3  # kube-scheduler was restarted after each change to its files
    # Every pod created during the rollover is placed (through the extender, over mTLS).
    for pod in created:
        wait_bound(stack, pod, timeout=120)
    for pod in created:
        core(stack).delete_namespaced_pod(pod, "default", grace_period_seconds=0)
