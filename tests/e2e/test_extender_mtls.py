"""The extender as deploy/ runs it: verbs over TLS to kube-scheduler's client
certificate only, health and metrics in the clear on a second port. The real
kube-scheduler reaches it over mTLS and places pods; every other caller is refused."""

from __future__ import annotations

import re

import pytest
import requests

from certs import build, store
from tests.e2e.kube import delete_pod, wait_bound
from tests.e2e.scenarios import gpu_node, place
from tests.fuzz.servers import names_body


def _filter_calls(stack) -> float:
    text = requests.get(f"http://127.0.0.1:{stack.extender_ops_port}/metrics", timeout=5).text
    found = re.search(
        r'^gpu_scheduler_extender_requests_total\{code="200",verb="filter"\} (\S+)$', text, re.M
    )
    return float(found[1]) if found else 0.0


def _post(stack, url: str, **kwargs) -> requests.Response:
    return requests.post(f"{url}/filter", json=names_body(), timeout=5, **kwargs)


def test_the_scheduler_places_pods_over_mtls(stack):
    assert stack.extender_url.startswith("https://")
    before = _filter_calls(stack)
    case = "mtls"
    node = gpu_node(stack, case, 4)
    pod = place(stack, case, 2)
    assert wait_bound(stack, pod) == node
    assert _filter_calls(stack) > before  # it went through the TLS port: the only one
    delete_pod(stack, pod)


def test_the_scheduler_client_certificate_is_accepted(stack):
    response = _post(stack, stack.extender_url, **stack.extender_client())
    assert response.status_code == 200, response.text


def test_no_client_certificate_is_refused(stack):
    client = stack.extender_client()
    response = _post(stack, stack.extender_url, verify=client["verify"])
    assert response.status_code == 403
    assert "client certificate" in response.json()["error"]


def test_a_certificate_from_another_ca_fails_the_handshake(stack, tmp_path):
    identity = build.service_identity("gpu-scheduler", "gpu-scheduler", [])
    store.generate(tmp_path / "rogue", identity, client=True)
    rogue = (str(tmp_path / "rogue" / "tls.crt"), str(tmp_path / "rogue" / "tls.key"))
    with pytest.raises(requests.exceptions.SSLError):
        _post(stack, stack.extender_url, cert=rogue, verify=stack.extender_client()["verify"])


def test_a_server_certificate_is_no_client_certificate(stack):
    """The extender's own serving pair, same CA, lacks clientAuth: refused."""
    server = stack.pki / "extender"
    with pytest.raises(requests.exceptions.SSLError):
        _post(
            stack,
            stack.extender_url,
            cert=(str(server / "tls.crt"), str(server / "tls.key")),
            verify=str(server / "ca.crt"),
        )


def test_plain_http_on_the_tls_port_gets_no_answer(stack):
    """Not even an error page: the TLS handshake fails and the connection closes."""
    url = stack.extender_url.replace("https://", "http://")
    with pytest.raises(requests.exceptions.ConnectionError):
        _post(stack, url)


def test_the_ops_port_serves_health_and_metrics_but_never_the_verbs(stack):
    ops = f"http://127.0.0.1:{stack.extender_ops_port}"
    assert requests.get(f"{ops}/readyz", timeout=5).status_code == 200
    assert (
        "gpu_scheduler_tls_certificate_expiry_timestamp_seconds"
        in requests.get(f"{ops}/metrics", timeout=5).text
    )
    for verb in ("filter", "prioritize"):
        response = requests.post(f"{ops}/{verb}", json=names_body(), timeout=5)
        assert response.status_code == 403
        assert "TLS port only" in response.json()["error"]
