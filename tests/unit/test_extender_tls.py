"""The extender over HTTPS with client certificates: only a holder of a certificate
from the client CA gets /filter and /prioritize; the ops port serves the rest."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from certs import build, store
from tests.factories import make_node, make_pod
from tests.fuzz.servers import extender_fake_cluster
from tests.helpers import free_port

BODY = {"Pod": make_pod(gpus=1), "NodeNames": ["a"]}


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    identity = build.service_identity("gpu-scheduler-extender", "ns", ["127.0.0.1"])
    store.generate(root / "extender", identity, ca_dir=root / "ca")
    store.generate(
        root / "scheduler",
        build.service_identity("gpu-scheduler", "ns"),
        ca_dir=root / "ca",
        client=True,
    )
    # A client certificate from another CA: must not pass.
    store.generate(root / "stranger", build.service_identity("stranger", "ns"), client=True)
    return root


@pytest.fixture(scope="module")
def server(pki, tmp_path_factory):
    ops = free_port()
    args = (
        f"--tls-cert-dir={pki / 'extender'}",
        f"--client-ca={pki / 'extender' / 'ca.crt'}",
        f"--ops-port={ops}",
    )
    work = tmp_path_factory.mktemp("tls")
    with extender_fake_cluster(work, 1, *args, nodes=[make_node("a", 8)]) as (url, _pid, _log):
        yield url, f"http://127.0.0.1:{ops}"


def test_the_scheduler_with_its_client_certificate_is_answered(server, pki):
    url, _ = server
    cert = (str(pki / "scheduler" / "tls.crt"), str(pki / "scheduler" / "tls.key"))
    r = requests.post(url + "/filter", json=BODY, cert=cert, verify=str(pki / "ca" / "ca.crt"))
    assert r.status_code == 200 and r.json()["Error"] == ""


def test_without_a_certificate_the_verbs_are_refused(server, pki):
    url, _ = server
    verify = str(pki / "ca" / "ca.crt")
    r = requests.post(url + "/prioritize", json=BODY, verify=verify)
    assert r.status_code == 403 and "client certificate" in r.json()["error"]
    assert requests.get(url + "/healthz", verify=verify).status_code == 200  # probes pass


def test_a_certificate_from_another_ca_fails_the_handshake(server, pki):
    url, _ = server
    cert = (str(pki / "stranger" / "tls.crt"), str(pki / "stranger" / "tls.key"))
    with pytest.raises(requests.exceptions.SSLError):
        requests.post(url + "/filter", json=BODY, cert=cert, verify=str(pki / "ca" / "ca.crt"))


def test_the_ops_port_serves_metrics_but_never_the_verbs(server):
    _, ops = server
    assert requests.get(ops + "/metrics").status_code == 200
    r = requests.post(ops + "/filter", json=BODY)
    assert r.status_code == 403 and "TLS port only" in r.json()["error"]
