"""``gpu-scheduler certs controller``: the install's certificates, made and kept inside
the cluster (the chart's default, ``certificates.mode: internal``).

Each pass reads the four Secrets (:mod:`certs.reconcile`), writes back those whose
data changed (optimistic: a write that lost a race is redone next pass), puts the
trust bundle into the MutatingWebhookConfiguration's caBundle, and restarts
kube-scheduler's Deployment when its client pair or trust bundle changed after it
started (kube-scheduler reads its extender TLS files only when it starts; the
webhook and the extender reload theirs). It runs every ``interval`` (1 min), sooner
while something is missing or a rollover step is due.

It also *arms* the webhook: the install registers it with ``failurePolicy: Ignore``,
so an install that never comes up (an image that cannot be pulled, no certificate, no
Ready pod) refuses no pod. Once the caBundle is in place and the webhook's Deployment
has a Ready replica, the controller sets the configured policy (``Fail``). It never
sets ``Ignore`` back: an outage of a webhook that once served refuses GPU pods, as
documented; a re-apply that rendered ``Ignore`` again is armed again at the next pass
(the controller keeps no claim on the field: see :meth:`Controller._apply`).

What it may touch is what its Role and ClusterRole name: the four Secrets, the one
Deployment and the one MutatingWebhookConfiguration (``create`` on Secrets cannot be
limited by name in RBAC; see docs/SECURITY.md).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import logging
import threading
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from certs import reconcile
from gpu_scheduler import certinfo

log = logging.getLogger("gpu_scheduler.certs")
TIMEOUT = (5, 30)
#: On kube-scheduler's pod template: the pair its pods were started with. A change
#: rolls them (kubectl rollout restart's way), and a restart that failed is redone.
FINGERPRINT = "gpu-scheduler.io/client-pair-sha256"
RETRY_S = 5.0
#: The field manager its writes are recorded under.
MANAGER = "gpu-scheduler-certs"
#: Webhooks merge by name, pod template annotations by key: nothing else is touched.
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"

SYNCS = Counter(
    "gpu_scheduler_certs_syncs_total",
    "Certificate controller passes by result (ok, waiting: the webhook configuration "
    "is not there yet, error)",
    ["result"],
)
WRITES = Counter(
    "gpu_scheduler_certs_writes_total",
    "Writes by object (secret, webhook_ca_bundle, webhook_failure_policy, scheduler_restart)",
    ["object"],
)
NOT_AFTER = Gauge(
    "gpu_scheduler_certs_not_after_timestamp_seconds",
    "When each certificate stops being valid (Unix time), by Secret; alert when it is "
    "within 20 days: the controller renews at 30",
    ["secret"],
)


@dataclass(frozen=True)
class Targets:
    namespace: str
    webhook_configuration: str = "gpu-scheduler-webhook"
    webhook_service: str = "gpu-scheduler-webhook"
    scheduler_deployment: str = "gpu-scheduler"
    webhook_deployment: str = "gpu-scheduler-webhook"
    #: What the webhook is armed with once it serves; Ignore: left as rendered.
    failure_policy: str = "Fail"


class Controller:
    def __init__(self, api: Any, targets: Targets, settings: reconcile.Settings) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.admission = client.AdmissionregistrationV1Api(api)
        self.targets = targets
        self.settings = settings
        self.problem = "no pass yet"
        #: The last pass published everything, kube-scheduler's rollout included; until
        #: one does, a rollover under way holds its next step (reconcile's ``hold``).
        self.complete = False
        #: The webhook has its configured failurePolicy (the last pass saw it so).
        self.armed = False

    def ready(self) -> tuple[bool, str]:
        """Ready while the last pass left the Secrets and the caBundle in place."""
        return (not self.problem, self.problem or "certificates in place")

    def sync(self, now: dt.datetime | None = None) -> float | None:
        """One pass; returns how soon (seconds) the next one should come, or None for
        the regular interval."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        hold, self.complete = not self.complete, False
        try:
            current, secrets, step_at = self._read()
            outcome = reconcile.reconcile(current, step_at, self.settings, now, hold=hold)
            for name in outcome.changed:
                self._write(name, outcome, secrets.get(name))
            self._publish_metrics(outcome)
            config, bundle_written = self._inject_ca_bundle(outcome.bundle)
            # A caBundle written just now is armed at the next pass: the API server
            # can call the webhook only once it trusts it.
            self.armed = config is not None and not bundle_written and self._arm(config)
            pair = _fingerprint(outcome.secrets[reconcile.SCHEDULER_SECRET])
            rolled_out = self._roll_scheduler(pair)
        except (ApiException, HTTPError, OSError) as exc:
            reason = f"{exc.status}: {exc.reason}" if isinstance(exc, ApiException) else exc
            self.problem = f"API error {reason}"
            log.warning("certificate pass failed", extra={"error": str(self.problem)[:512]})
            SYNCS.labels("error").inc()
            return RETRY_S
        for action in outcome.actions:
            log.info("certificates: %s", action)
        if config is None:
            self.problem = (
                f"MutatingWebhookConfiguration {self.targets.webhook_configuration} not found"
            )
            SYNCS.labels("waiting").inc()
            return RETRY_S
        self.problem = ""
        self.complete = rolled_out
        SYNCS.labels("ok").inc()
        if not rolled_out or not self.armed:
            return RETRY_S
        if outcome.next_step_at is not None:
            return max(1.0, (outcome.next_step_at - _now(now)).total_seconds())
        return None

    def _read(self) -> tuple[dict[str, dict[str, bytes]], dict[str, Any], str | None]:
        from kubernetes.client.exceptions import ApiException

        current: dict[str, dict[str, bytes]] = {}
        secrets: dict[str, Any] = {}
        step_at = None
        for name in (reconcile.CA_SECRET, *reconcile.LEAVES):
            try:
                secret = self.core.read_namespaced_secret(
                    name, self.targets.namespace, _request_timeout=TIMEOUT
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
                continue
            current[name] = _decoded(secret.data)
            secrets[name] = secret
            if name == reconcile.CA_SECRET:
                step_at = (secret.metadata.annotations or {}).get(reconcile.STEP_ANNOTATION)
        return current, secrets, step_at

    def _write(self, name: str, outcome: reconcile.Outcome, secret: Any | None) -> None:
        """Create the Secret, or replace its data keeping everything else of it (others'
        labels and annotations, owners, finalizers, its type, which cannot change)."""
        from kubernetes import client

        is_ca = name == reconcile.CA_SECRET
        data = {k: base64.b64encode(v).decode() for k, v in outcome.secrets[name].items()}
        if secret is None:
            secret = client.V1Secret(
                metadata=client.V1ObjectMeta(
                    name=name,
                    namespace=self.targets.namespace,
                    labels={"app.kubernetes.io/part-of": "gpu-scheduler"},
                ),
                type="Opaque" if is_ca else "kubernetes.io/tls",
            )
        secret.data = data
        if is_ca and outcome.step_at:
            secret.metadata.annotations = {
                **(secret.metadata.annotations or {}),
                reconcile.STEP_ANNOTATION: outcome.step_at,
            }
        if secret.metadata.resource_version is None:
            self.core.create_namespaced_secret(
                self.targets.namespace, secret, _request_timeout=TIMEOUT, field_manager=MANAGER
            )
        else:  # optimistic: the resourceVersion read; a lost race is redone next pass
            self.core.replace_namespaced_secret(
                name,
                self.targets.namespace,
                secret,
                _request_timeout=TIMEOUT,
                field_manager=MANAGER,
            )
        WRITES.labels("secret").inc()
        log.info("certificates: wrote Secret %s", name)

    def _inject_ca_bundle(self, bundle: bytes) -> tuple[Any, bool]:
        """Our webhooks' caBundle is the trust bundle. Returns the configuration as
        read (None while it does not exist: kubectl applies it after the Deployments)
        and whether the caBundle was written."""
        from kubernetes.client.exceptions import ApiException

        encoded = base64.b64encode(bundle).decode()
        try:
            config = self.admission.read_mutating_webhook_configuration(
                self.targets.webhook_configuration, _request_timeout=TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                return None, False
            raise
        stale = [
            {"name": hook.name, "clientConfig": {"caBundle": encoded}}
            for hook in self._ours(config)
            if hook.client_config.ca_bundle != encoded
        ]
        if stale:
            self.admission.patch_mutating_webhook_configuration(
                self.targets.webhook_configuration,
                {
                    "metadata": {"resourceVersion": config.metadata.resource_version},
                    "webhooks": stale,
                },
                _request_timeout=TIMEOUT,
                _content_type=STRATEGIC,
                field_manager=MANAGER,
            )
            WRITES.labels("webhook_ca_bundle").inc()
            log.info("certificates: caBundle of %s updated", self.targets.webhook_configuration)
        return config, bool(stale)

    def _ours(self, config: Any) -> list[Any]:
        """The configuration's webhooks that call our Service."""
        return [
            hook
            for hook in config.webhooks or []
            if hook.client_config.service is not None
            and hook.client_config.service.name == self.targets.webhook_service
            and hook.client_config.service.namespace == self.targets.namespace
        ]

    def _arm(self, config: Any) -> bool:
        """Our webhooks get the configured failurePolicy once the webhook's Deployment
        has a Ready replica; True once they have it. Only Ignore -> Fail: a configured
        Ignore is what the install renders, and the controller never disarms."""
        want = self.targets.failure_policy
        unarmed = [h.name for h in self._ours(config) if h.failure_policy != want]
        if want != "Fail" or not unarmed:
            self._let_go(config)
            return True
        if not self._webhook_ready():
            return False
        hooks = [{"name": name, "failurePolicy": want} for name in unarmed]
        self._apply(hooks, config.metadata.resource_version)
        self._apply([], None)
        WRITES.labels("webhook_failure_policy").inc()
        log.info(
            "certificates: webhook %s armed: failurePolicy %s (its Deployment %s has a "
            "Ready replica)",
            ", ".join(unarmed),
            want,
            self.targets.webhook_deployment,
        )
        return True

    def _let_go(self, config: Any) -> None:
        """Drop a claim on failurePolicy that an arming left behind (its second apply
        failed)."""
        fields = config.metadata.managed_fields or []
        if any(f.manager == MANAGER and f.operation == "Apply" for f in fields):
            self._apply([], None)

    def _apply(self, webhooks: list[dict[str, str]], version: str | None) -> None:
        """Server-side apply of ``webhooks`` as the controller, forced. Armed in two
        applies: the first takes failurePolicy (Fail), the second, empty, gives it up;
        the API server then defaults the field no one sets to Fail, and no manager
        owns it. So a re-apply of the install (helm rollback, kubectl apply
        --server-side) never conflicts with the controller: it renders Ignore, and the
        next pass arms again."""
        metadata: dict[str, str] = {"name": self.targets.webhook_configuration}
        if version is not None:  # optimistic: a lost race is redone next pass
            metadata["resourceVersion"] = version
        self.admission.patch_mutating_webhook_configuration(
            self.targets.webhook_configuration,
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": metadata,
                "webhooks": webhooks,
            },
            _request_timeout=TIMEOUT,
            _content_type=APPLY,
            field_manager=MANAGER,
            force=True,
        )

    def _webhook_ready(self) -> bool:
        """The webhook's Deployment has at least one Ready replica."""
        from kubernetes.client.exceptions import ApiException

        try:
            deployment = self.apps.read_namespaced_deployment(
                self.targets.webhook_deployment, self.targets.namespace, _request_timeout=TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return deployment.status is not None and (deployment.status.ready_replicas or 0) >= 1

    def _roll_scheduler(self, fingerprint: str) -> bool:
        """kube-scheduler's pods run with this pair, or are rolled to it; True once
        its rollout is complete (or it is not installed here)."""
        from kubernetes.client.exceptions import ApiException

        name, namespace = self.targets.scheduler_deployment, self.targets.namespace
        try:
            deployment = self.apps.read_namespaced_deployment(
                name, namespace, _request_timeout=TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                return True  # not installed here: it reads the pair when it comes
            raise
        annotations = deployment.spec.template.metadata.annotations or {}
        if annotations.get(FINGERPRINT) != fingerprint:
            patch = {
                "spec": {"template": {"metadata": {"annotations": {FINGERPRINT: fingerprint}}}}
            }
            self.apps.patch_namespaced_deployment(
                name,
                namespace,
                patch,
                _request_timeout=TIMEOUT,
                _content_type=STRATEGIC,
                field_manager=MANAGER,
            )
            WRITES.labels("scheduler_restart").inc()
            log.info("certificates: %s rolled to its client pair %s", name, fingerprint[:12])
            return False
        return rolled_out(deployment)

    def _publish_metrics(self, outcome: reconcile.Outcome) -> None:
        for name, data in outcome.secrets.items():
            key = "ca.crt" if name == reconcile.CA_SECRET else "tls.crt"
            if key in data:
                cert = certinfo.load_cert(data[key])
                NOT_AFTER.labels(name).set(cert.not_valid_after_utc.timestamp())

    def run(self, stop: threading.Event, interval_s: float) -> None:
        while not stop.is_set():
            try:
                delay = self.sync()
            except Exception:  # a bug of ours: log it, keep the loop, try again soon
                log.exception("certificate pass failed unexpectedly")
                SYNCS.labels("error").inc()
                delay = RETRY_S * 6
            stop.wait(interval_s if delay is None else min(delay, interval_s))


def rolled_out(deployment: Any) -> bool:
    """Every replica of the Deployment's current template is updated and available."""
    status = deployment.status
    want = deployment.spec.replicas if deployment.spec.replicas is not None else 1
    return (
        status is not None
        and (status.observed_generation or 0) >= (deployment.metadata.generation or 0)
        and (status.updated_replicas or 0) >= want
        and (status.available_replicas or 0) >= want
        and (status.replicas or 0) <= want  # no old pod left
    )


def _decoded(data: Any) -> dict[str, bytes]:
    """A Secret's data, keys of ours only as bytes; a value that is not base64 is left
    out (the pass then treats it as missing)."""
    out = {}
    for key, value in (data or {}).items():
        try:
            out[key] = base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            continue
    return out


def _fingerprint(data: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for key in sorted(data):
        digest.update(key.encode() + b"\0" + data[key] + b"\0")
    return digest.hexdigest()


def _now(now: dt.datetime | None) -> dt.datetime:
    return now or dt.datetime.now(dt.UTC)
