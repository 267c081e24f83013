"""The certificate controller arms the webhook: registered with failurePolicy Ignore,
it gets the configured policy (Fail) once its caBundle is in place and the webhook's
Deployment has a Ready replica; never Ignore back. Against an explicit fake of the
three APIs the controller calls (Secrets, Deployments, the webhook configuration),
whose patch merges webhooks by name and refuses a stale resourceVersion as the API
server does."""

from __future__ import annotations

import base64
import logging
import subprocess
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from certs import controller, reconcile
from tests.helpers import CLI, ROOT

NS = "gpu-scheduler"
HOOK = "pods.gpu-scheduler.io"


def _missing() -> ApiException:
    return ApiException(status=404, reason="Not Found")


class FakeCore:
    def __init__(self) -> None:
        self.secrets: dict[str, client.V1Secret] = {}

    def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> client.V1Secret:
        if name not in self.secrets:
            raise _missing()
        return self.secrets[name]

    def create_namespaced_secret(self, namespace: str, body: client.V1Secret, **_: Any) -> None:
        body.metadata.resource_version = "1"
        self.secrets[body.metadata.name] = body

    def replace_namespaced_secret(self, name: str, namespace: str, body, **_: Any) -> None:
        self.secrets[name] = body


class FakeApps:
    """The webhook's Deployment, with as many Ready replicas as the test says (None:
    not there). kube-scheduler's is not installed here."""

    def __init__(self, ready: int | None = 0) -> None:
        self.ready = ready
        self.reads: list[str] = []

    def read_namespaced_deployment(self, name: str, namespace: str, **_: Any) -> Any:
        self.reads.append(name)
        if name != "gpu-scheduler-webhook" or self.ready is None:
            raise _missing()
        return SimpleNamespace(status=SimpleNamespace(ready_replicas=self.ready or None))


class FakeAdmission:
    """The webhook configuration. A strategic patch merges webhooks by name; a
    server-side apply by the controller claims the fields it sets, and an empty one
    gives them up: failurePolicy, then no one's, is defaulted to Fail."""

    def __init__(self, policy: str = "Ignore") -> None:
        self.version = 1
        self.patches: list[dict[str, Any]] = []
        self.claimed = False  # the controller's Apply entry in managedFields
        self.hooks = {
            HOOK: {"failurePolicy": policy, "service": ("gpu-scheduler-webhook", NS)},
            "other.example.com": {"failurePolicy": "Ignore", "service": ("other", "other")},
        }

    def read_mutating_webhook_configuration(self, name: str, **_: Any) -> Any:
        webhooks = [
            SimpleNamespace(
                name=hook,
                failure_policy=spec["failurePolicy"],
                client_config=SimpleNamespace(
                    service=SimpleNamespace(name=spec["service"][0], namespace=spec["service"][1]),
                    ca_bundle=spec.get("caBundle"),
                ),
            )
            for hook, spec in self.hooks.items()
        ]
        managed = [SimpleNamespace(manager="helm", operation="Apply")]
        if self.claimed:
            managed.append(SimpleNamespace(manager=controller.MANAGER, operation="Apply"))
        meta = SimpleNamespace(resource_version=str(self.version), managed_fields=managed)
        return SimpleNamespace(metadata=meta, webhooks=webhooks)

    def patch_mutating_webhook_configuration(self, name: str, body: dict, **kw: Any) -> None:
        assert kw["field_manager"] == controller.MANAGER
        version = body["metadata"].get("resourceVersion")
        if version is not None and version != str(self.version):
            raise ApiException(status=409, reason="Conflict")
        if kw["_content_type"] == controller.APPLY:
            assert kw["force"] is True and body["kind"] == "MutatingWebhookConfiguration"
            self.claimed = bool(body["webhooks"])
        else:
            assert kw["_content_type"] == controller.STRATEGIC and version is not None
        self.patches.append(body)
        for entry in body["webhooks"]:  # strategic merge: by name
            spec = self.hooks[entry["name"]]
            if "clientConfig" in entry:
                spec["caBundle"] = entry["clientConfig"]["caBundle"]
            if "failurePolicy" in entry:
                spec["failurePolicy"] = entry["failurePolicy"]
        self.version += 1


def make(ready: int | None = 0, policy: str = "Ignore", want: str = "Fail"):
    ctl = controller.Controller(
        client.ApiClient(),
        controller.Targets(namespace=NS, failure_policy=want),
        reconcile.Settings(namespace=NS),
    )
    ctl.core, ctl.apps, ctl.admission = FakeCore(), FakeApps(ready), FakeAdmission(policy)
    return ctl


def policy(ctl) -> str:
    return ctl.admission.hooks[HOOK]["failurePolicy"]


def writes() -> float:
    return controller.WRITES.labels("webhook_failure_policy")._value.get()


def test_armed_once_the_ca_bundle_is_in_place_and_a_replica_is_ready(caplog):
    ctl = make(ready=0)
    before = writes()
    # First pass: the caBundle goes in; the webhook cannot serve yet. Retried soon.
    assert ctl.sync() == controller.RETRY_S
    assert ctl.admission.hooks[HOOK]["caBundle"]
    assert policy(ctl) == "Ignore" and not ctl.armed
    assert ctl.ready() == (True, "certificates in place")  # arming gates nothing
    assert ctl.sync() == controller.RETRY_S  # no Ready replica: still Ignore
    assert policy(ctl) == "Ignore" and writes() == before
    ctl.apps.ready = 1
    with caplog.at_level(logging.INFO, logger="gpu_scheduler.certs"):
        assert ctl.sync() is None  # armed: back to the regular interval
    assert policy(ctl) == "Fail" and ctl.armed
    assert writes() == before + 1
    assert any("armed: failurePolicy Fail" in r.getMessage() for r in caplog.records)
    # Only our webhook, by name, with the resourceVersion read (optimistic); then the
    # claim on the field given up, so a re-apply of the install never conflicts.
    arm, let_go = ctl.admission.patches[-2:]
    assert arm["webhooks"] == [{"name": HOOK, "failurePolicy": "Fail"}]
    assert arm["metadata"]["resourceVersion"]
    assert let_go["webhooks"] == [] and "resourceVersion" not in let_go["metadata"]
    assert not ctl.admission.claimed
    assert ctl.admission.hooks["other.example.com"]["failurePolicy"] == "Ignore"
    assert ctl.sync() is None and writes() == before + 1  # nothing to do


def test_a_ca_bundle_written_in_the_pass_arms_at_the_next_one():
    """The API server can call the webhook only once it trusts it: even with a Ready
    replica, the pass that writes the caBundle does not arm."""
    ctl = make(ready=2)
    assert ctl.sync() == controller.RETRY_S and policy(ctl) == "Ignore"
    assert ctl.sync() is None and policy(ctl) == "Fail"


def test_never_armed_without_the_webhook_deployment():
    ctl = make(ready=None)
    for _ in range(3):
        assert ctl.sync() == controller.RETRY_S
    assert policy(ctl) == "Ignore" and not ctl.armed
    assert ctl.ready()[0]


def test_never_disarmed_and_rearmed_after_a_re_apply():
    ctl = make(ready=1)
    ctl.sync(), ctl.sync()
    assert policy(ctl) == "Fail"
    ctl.apps.ready = 0  # an outage of a webhook that once served: Fail stays
    assert ctl.sync() is None and policy(ctl) == "Fail" and ctl.armed
    # A re-apply rendered Ignore again: armed at the next pass the webhook is Ready.
    ctl.admission.hooks[HOOK]["failurePolicy"] = "Ignore"
    ctl.admission.version += 1
    assert ctl.sync() == controller.RETRY_S and policy(ctl) == "Ignore"
    ctl.apps.ready = 1
    assert ctl.sync() is None and policy(ctl) == "Fail"


@pytest.mark.parametrize("live", ["Ignore", "Fail"])
def test_a_configured_ignore_writes_no_failure_policy(live):
    """Configured Ignore: the install renders it; the controller never writes the
    field (not even Fail back to Ignore) and does not read the webhook's Deployment."""
    ctl = make(ready=1, policy=live, want="Ignore")
    ctl.sync(), ctl.sync()
    assert policy(ctl) == live and ctl.armed
    assert all("failurePolicy" not in str(p) for p in ctl.admission.patches)
    assert "gpu-scheduler-webhook" not in ctl.apps.reads


def test_a_lost_race_is_redone_next_pass():
    ctl = make(ready=1)
    ctl.sync()
    real_read = ctl.admission.read_mutating_webhook_configuration

    def stale(name: str, **kw: Any) -> Any:
        config = real_read(name, **kw)
        ctl.admission.version += 1  # someone wrote between our read and our patch
        return config

    ctl.admission.read_mutating_webhook_configuration = stale
    assert ctl.sync() == controller.RETRY_S and policy(ctl) == "Ignore"
    assert ctl.ready()[0] is False and "409" in ctl.ready()[1]
    ctl.admission.read_mutating_webhook_configuration = real_read
    assert ctl.sync() is None and policy(ctl) == "Fail" and ctl.ready()[0]


def test_the_ca_bundle_is_the_trust_bundle():
    ctl = make()
    ctl.sync()
    bundle = ctl.core.secrets[reconcile.CA_SECRET].data["ca.crt"]
    assert ctl.admission.hooks[HOOK]["caBundle"] == bundle
    assert base64.b64decode(bundle).startswith(b"-----BEGIN CERTIFICATE-----")
    assert "caBundle" not in ctl.admission.hooks["other.example.com"]


def test_cli_refuses_an_unknown_failure_policy():
    done = subprocess.run(
        [*CLI, "certs", "controller", "--namespace", NS, "--webhook-failure-policy", "Maybe"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--webhook-failure-policy" in done.stderr


def test_a_claim_left_by_a_failed_second_apply_is_given_up_next_pass():
    ctl = make(ready=1)
    ctl.sync()
    real = ctl.admission.patch_mutating_webhook_configuration
    calls = []

    def second_fails(name: str, body: dict, **kw: Any) -> None:
        calls.append(body)
        if kw["_content_type"] == controller.APPLY and not body["webhooks"] and len(calls) == 2:
            raise ApiException(status=503, reason="Service Unavailable")
        real(name, body, **kw)

    ctl.admission.patch_mutating_webhook_configuration = second_fails
    assert ctl.sync() == controller.RETRY_S  # the pass failed after arming
    assert policy(ctl) == "Fail" and ctl.admission.claimed
    assert ctl.sync() is None and not ctl.admission.claimed and policy(ctl) == "Fail"
