"""What the install's certificate Secrets should hold, given what they hold now.

The in-cluster controller (:mod:`certs.controller`) reads four Secrets, hands their
data to :func:`reconcile` and writes back what it returns; nothing here calls the
API. The rules are the file store's (:mod:`certs.store`), applied to the Secrets'
data laid out as its directories, so the CLI and the controller judge a pair the
same way:

- ``gpu-scheduler-ca`` (Opaque) is the CA directory: ``ca.crt``/``ca.key``, and
  during a rollover ``ca-next.*`` or ``ca-previous.crt``. It never leaves the cluster.
- ``gpu-scheduler-{webhook,extender,scheduler}-tls`` (``kubernetes.io/tls``) are the
  leaf directories: ``tls.crt``, ``tls.key`` and ``ca.crt``, the trust bundle.

A CA within ``ca_renew_before`` of its end is replaced by the store's three-step
rollover, one step per call once ``settle`` has passed since the last (every
reader of a Secret volume has the new bundle by then: the kubelet refreshes them
within about a minute). Which step is next follows from the CA Secret's keys; only
when the last step was taken is kept, in an annotation.

Leaves signed by a CA the cluster does not hold (an install whose certificates came
from ``deploy/install-certs.sh``, whose CA key stays with the admin) are *adopted*
the same way: a new CA is trusted beside theirs while they keep serving, then signs
new leaves, then theirs leaves the bundle. An upgrade from such an install never
refuses a request.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509

from certs import build, store
from gpu_scheduler import certinfo, timestamps

CA_SECRET = "gpu-scheduler-ca"
#: The leaves: Secret name -> (Service or client name, client pair?).
LEAVES: dict[str, tuple[str, bool]] = {
    "gpu-scheduler-webhook-tls": ("gpu-scheduler-webhook", False),
    "gpu-scheduler-extender-tls": ("gpu-scheduler-extender", False),
    "gpu-scheduler-scheduler-tls": ("gpu-scheduler", True),
}
#: The leaf kube-scheduler reads (only when it starts: a change means a restart).
SCHEDULER_SECRET = "gpu-scheduler-scheduler-tls"
#: On the CA Secret: when the last rollover step was taken (RFC 3339, UTC).
STEP_ANNOTATION = "gpu-scheduler.io/ca-rollover-step-at"
CA_KEYS = (store.CA_CERT, store.CA_KEY, store.NEXT_CERT, store.NEXT_KEY, store.PREVIOUS_CERT)
LEAF_KEYS = (store.TLS_CERT, store.TLS_KEY, store.CA_CERT)

Data = dict[str, bytes]


@dataclass(frozen=True)
class Settings:
    namespace: str
    leaf_days: int = 365
    ca_days: int = 3650
    #: Start a rollover when the CA has less than this left (over the store's 30-day
    #: limit, past which the CA would be replaced outright).
    ca_renew_before: dt.timedelta = dt.timedelta(days=365)
    settle: dt.timedelta = dt.timedelta(minutes=5)

    def __post_init__(self) -> None:
        if self.leaf_days < 1 or self.ca_days < self.leaf_days:
            raise ValueError("leaf days must be at least 1 and no more than the CA's")
        if self.ca_renew_before <= build.RENEW_BEFORE * 2:
            raise ValueError(f"ca_renew_before must exceed {build.RENEW_BEFORE.days * 2} days")
        if self.settle < dt.timedelta(0):
            raise ValueError("settle must not be negative")


@dataclass
class Outcome:
    """What the Secrets should hold, and what changed on the way there."""

    secrets: dict[str, Data]
    step_at: str | None  # the CA Secret's STEP_ANNOTATION
    bundle: bytes  # the trust bundle (the webhook's caBundle, base64-decoded)
    changed: list[str] = field(default_factory=list)  # Secret names whose data changed
    actions: list[str] = field(default_factory=list)  # what was done, for the log
    #: When to call again at the latest (a rollover step that waits on ``settle``).
    next_step_at: dt.datetime | None = None


def rollover_step(
    ca: Mapping[str, bytes], step_at: dt.datetime | None, now: dt.datetime, settings: Settings
) -> tuple[str | None, dt.datetime | None]:
    """The rollover step to take now (``begin``, ``switch``, ``finish`` or None), and
    when the next one is due if it must wait."""
    if store.NEXT_CERT in ca:
        phase = "switch" if store.CA_KEY in ca else "adopt"
    elif store.PREVIOUS_CERT in ca:
        phase = "finish"
    else:
        try:
            not_after = certinfo.load_cert(ca[store.CA_CERT]).not_valid_after_utc
        except (KeyError, ValueError):
            return None, None  # no CA yet, or an unreadable one: generate replaces it
        return ("begin" if not_after - now < settings.ca_renew_before else None), None
    if step_at is None:
        return None, now + settings.settle  # the time of the last step is lost: from now
    due = step_at + settings.settle
    if now < due:
        return None, due
    return phase, None


def reconcile(
    current: Mapping[str, Mapping[str, bytes]],
    step_at: str | None,
    settings: Settings,
    now: dt.datetime | None = None,
) -> Outcome:
    """The Secrets' data after one pass: a CA (made if missing or unusable), one
    rollover step when due, and every leaf kept if good, else issued by the CA."""
    now = now or dt.datetime.now(dt.UTC)
    with tempfile.TemporaryDirectory(prefix="gpu-scheduler-certs-") as tmp:
        root = Path(tmp)
        ca_dir = root / CA_SECRET
        _lay_out(ca_dir, current.get(CA_SECRET, {}), CA_KEYS)
        for name in LEAVES:
            _lay_out(root / name, current.get(name, {}), LEAF_KEYS)
        actions: list[str] = []
        foreign = _foreign_trust(current, now, settings)
        if foreign is not None:
            return _begin_adoption(current, foreign, root, settings, now)
        given = step_at
        last = timestamps.parse_rfc3339(step_at)
        ca = current.get(CA_SECRET, {})
        step, due = rollover_step(ca, last, now, settings)
        if step is None and due is not None and last is None:
            step_at = timestamps.rfc3339(now)
        if step is None and store.NEXT_CERT in ca and store.CA_KEY not in ca:
            # Adopting, and not time yet: the leaves keep serving as they are.
            secrets = {name: dict(data) for name, data in current.items()}
            changed = [CA_SECRET] if step_at != given else []
            return Outcome(secrets, step_at, store.trust_bundle(ca_dir), changed, [], due)
        if step == "adopt":
            actions.append("adopted CA: the new CA signs now; the old one stays trusted")
            _finish_adoption(ca_dir)
        elif step is not None:
            actions.append(
                f"CA rollover {step}: "
                + store.rotate_ca(ca_dir, step, days=settings.ca_days, now=now)
            )
        if step is not None:
            step_at = timestamps.rfc3339(now)
            due = now + settings.settle if step != "finish" else None
        for name, (service, client) in LEAVES.items():
            identity = build.service_identity(service, settings.namespace)
            done = store.generate(
                root / name,
                identity,
                days=settings.leaf_days,
                ca_days=settings.ca_days,
                now=now,
                ca_dir=ca_dir,
                client=client,
            )
            if done.action != "kept":
                actions.append(f"{name}: {done.action} ({done.reason})")
        secrets = {CA_SECRET: _read_back(ca_dir, CA_KEYS)}
        secrets.update({name: _read_back(root / name, LEAF_KEYS) for name in LEAVES})
        bundle = store.trust_bundle(ca_dir)
    changed = [name for name, data in secrets.items() if dict(current.get(name, {})) != data]
    if step_at != given and CA_SECRET not in changed:
        changed.append(CA_SECRET)  # only the step's time: the annotation
    return Outcome(secrets, step_at, bundle, changed, actions, due)


def _lay_out(folder: Path, data: Mapping[str, bytes], keys: tuple[str, ...]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for key in keys:
        if key in data:
            writer = store.write_private if key.endswith(".key") else store.write_public
            writer(folder / key, bytes(data[key]))


def _read_back(folder: Path, keys: tuple[str, ...]) -> Data:
    return {key: (folder / key).read_bytes() for key in keys if (folder / key).is_file()}


def _foreign_trust(
    current: Mapping[str, Mapping[str, bytes]], now: dt.datetime, settings: Settings
) -> bytes | None:
    """The trust bundle of leaves that serve well but were signed by a CA this
    cluster does not hold (no CA of ours yet), or None: nothing to adopt."""
    if any(key in current.get(CA_SECRET, {}) for key in (store.CA_KEY, store.NEXT_KEY)):
        return None
    good = False
    bundles: list[bytes] = []
    for name, (service, client) in LEAVES.items():
        data = current.get(name, {})
        try:
            cas = x509.load_pem_x509_certificates(bytes(data[store.CA_CERT]))
            cert = certinfo.load_cert(bytes(data[store.TLS_CERT]))
            key = build.load_key(bytes(data[store.TLS_KEY]))
        except (KeyError, ValueError):
            continue
        identity = build.service_identity(service, settings.namespace)
        if build.is_client_cert(cert) == client and any(
            build.serving_problem(cert, key, ca, identity, now) is None for ca in cas
        ):
            good = True
            bundles += [build.cert_pem(ca) for ca in cas if build.cert_pem(ca) not in bundles]
    return b"".join(bundles) if good else None


def _begin_adoption(
    current: Mapping[str, Mapping[str, bytes]],
    foreign: bytes,
    root: Path,
    settings: Settings,
    now: dt.datetime,
) -> Outcome:
    """A new CA (``ca-next``) trusted beside the foreign one (``ca-previous``); the
    good leaves keep serving, a missing or bad one is issued by the new CA."""
    ca_dir = root / CA_SECRET
    key = build.new_key()
    ca_cert = build.build_ca(key, now, settings.ca_days, "gpu-scheduler CA")
    store.write_private(ca_dir / store.NEXT_KEY, build.key_pem(key))
    store.write_public(ca_dir / store.NEXT_CERT, build.cert_pem(ca_cert))
    store.write_public(ca_dir / store.PREVIOUS_CERT, foreign)
    bundle = store.trust_bundle(ca_dir)
    signer = root / "signer"
    signer.mkdir()
    store.write_private(signer / store.CA_KEY, build.key_pem(key))
    store.write_public(signer / store.CA_CERT, build.cert_pem(ca_cert))
    actions = ["adopting the CA of the leaves found: a new CA is trusted beside it"]
    secrets = {CA_SECRET: _read_back(ca_dir, CA_KEYS)}
    for name, (service, client) in LEAVES.items():
        folder = root / name
        if _foreign_trust({name: current.get(name, {})}, now, settings) is None:
            identity = build.service_identity(service, settings.namespace)
            store.generate(
                folder,
                identity,
                days=settings.leaf_days,
                ca_days=settings.ca_days,
                now=now,
                ca_dir=signer,
                client=client,
            )
            actions.append(f"{name}: issued by the new CA (no good pair to keep)")
        store.write_public(folder / store.CA_CERT, bundle)
        secrets[name] = _read_back(folder, LEAF_KEYS)
    changed = [n for n, data in secrets.items() if dict(current.get(n, {})) != data]
    due = now + settings.settle
    return Outcome(secrets, timestamps.rfc3339(now), bundle, changed, actions, due)


def _finish_adoption(ca_dir: Path) -> None:
    """The new CA signs from now on (the store's ``switch`` state: ``ca-previous``, the
    adopted trust, stays in the bundle until ``finish``)."""
    store.write_private(ca_dir / store.CA_KEY, (ca_dir / store.NEXT_KEY).read_bytes())
    store.write_public(ca_dir / store.CA_CERT, (ca_dir / store.NEXT_CERT).read_bytes())
    (ca_dir / store.NEXT_CERT).unlink()
    (ca_dir / store.NEXT_KEY).unlink()
