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

Leaves that are still valid but signed by no CA this Secret trusts (an install whose
certificates came from ``deploy/install-certs.sh`` or cert-manager, whose CA key is
elsewhere; or our own CA gone bad or deleted) are *adopted* the same way: their
issuers are trusted beside ours while they keep serving, ours signs new leaves after
one settle time, and theirs leave the bundle after another. An upgrade from such an
install never refuses a request. While a rollover or an adoption is under way, the
controller passes ``hold`` until everything of the last step is published
(kube-scheduler rolled included), so the settle time counts from there.
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

#: Not cert-manager's gpu-scheduler-ca (a kubernetes.io/tls Secret, a type that cannot
#: change), so that a switch from one mode to the other meets no Secret of the other.
CA_SECRET = "gpu-scheduler-internal-ca"
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
#: Below this no kubelet has refreshed a Secret volume (about a minute in production,
#: seconds in the lab, whose kubelet syncs every 5 s).
MIN_SETTLE = dt.timedelta(seconds=10)


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
        if self.settle < MIN_SETTLE:
            raise ValueError(f"settle must be at least {MIN_SETTLE.seconds} s")


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
    """The rollover step to take now (``begin``, ``switch``, ``adopt``, ``finish`` or
    None), and when the next one is due if it must wait."""
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


def in_rollover(ca: Mapping[str, bytes]) -> bool:
    return store.NEXT_CERT in ca or store.PREVIOUS_CERT in ca


def reconcile(
    current: Mapping[str, Mapping[str, bytes]],
    step_at: str | None,
    settings: Settings,
    now: dt.datetime | None = None,
    *,
    hold: bool = False,
) -> Outcome:
    """The Secrets' data after one pass: an adoption begun where valid leaves are
    signed by no CA of ours, one rollover step when due (none while ``hold``: the last
    one is not fully published yet), and every leaf kept if good, else issued."""
    now = now or dt.datetime.now(dt.UTC)
    with tempfile.TemporaryDirectory(prefix="gpu-scheduler-certs-") as tmp:
        root = Path(tmp)
        ca_dir = root / CA_SECRET
        _lay_out(ca_dir, _sane_ca(current.get(CA_SECRET, {})), CA_KEYS)
        for name in LEAVES:
            _lay_out(root / name, current.get(name, {}), LEAF_KEYS)
        actions: list[str] = []
        given = step_at
        ca = _read_back(ca_dir, CA_KEYS)
        foreign = None if in_rollover(ca) else _foreign_issuers(current, ca_dir, now)
        if foreign is not None:
            _begin_adoption(ca_dir, foreign, settings, now)
            actions.append("adopting the CA of the leaves found: trusted beside ours for now")
            step, due, step_at = None, now + settings.settle, timestamps.rfc3339(now)
        else:
            last = timestamps.parse_rfc3339(step_at)
            if last is not None and last > now:  # a clock ahead, or a hand: from now
                last, step_at = now, timestamps.rfc3339(now)
            step, due = rollover_step(ca, last, now, settings)
            if in_rollover(ca) and (hold or (step is None and last is None)):
                step, due, step_at = None, now + settings.settle, timestamps.rfc3339(now)
        ca = _read_back(ca_dir, CA_KEYS)
        if step is None and store.NEXT_CERT in ca and store.CA_KEY not in ca:
            actions += _adopting_leaves(root, settings, now)  # the old pairs keep serving
        else:
            if step == "adopt":
                actions.append("adopted CA: ours signs now; the old one stays trusted")
                _finish_adoption(ca_dir)
            elif step is not None:
                done = store.rotate_ca(ca_dir, step, days=settings.ca_days, now=now)
                actions.append(f"CA rollover {step}: {done}")
            if step is not None:
                step_at = timestamps.rfc3339(now)
                due = now + settings.settle if step != "finish" else None
            actions += _generate_leaves(root, ca_dir, settings, now)
        secrets = {CA_SECRET: _read_back(ca_dir, CA_KEYS)}
        secrets.update({name: _read_back(root / name, LEAF_KEYS) for name in LEAVES})
        bundle = store.trust_bundle(ca_dir)
    changed = [name for name, data in secrets.items() if dict(current.get(name, {})) != data]
    if step_at != given and CA_SECRET not in changed:
        changed.append(CA_SECRET)  # only the step's time: the annotation
    return Outcome(secrets, step_at, bundle, changed, actions, due)


def _generate_leaves(root: Path, ca_dir: Path, settings: Settings, now: dt.datetime) -> list[str]:
    """Each leaf kept if good, else issued by ``ca_dir``'s CA; its ca.crt the bundle."""
    actions = []
    for name, (service, client) in LEAVES.items():
        done = _issue(root / name, service, client, ca_dir, settings, now)
        if done.action != "kept":
            actions.append(f"{name}: {done.action} ({done.reason})")
    return actions


def _issue(
    folder: Path, service: str, client: bool, ca_dir: Path, settings: Settings, now: dt.datetime
) -> store.Outcome:
    """The store's rule for one leaf: kept if good, else issued by ``ca_dir``'s CA."""
    identity = build.service_identity(service, settings.namespace)
    return store.generate(
        folder,
        identity,
        days=settings.leaf_days,
        ca_days=settings.ca_days,
        now=now,
        ca_dir=ca_dir,
        client=client,
    )


def _lay_out(folder: Path, data: Mapping[str, bytes], keys: tuple[str, ...]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for key in keys:
        if key in data:
            writer = store.write_private if key.endswith(".key") else store.write_public
            writer(folder / key, bytes(data[key]))


def _read_back(folder: Path, keys: tuple[str, ...]) -> Data:
    return {key: (folder / key).read_bytes() for key in keys if (folder / key).is_file()}


def _sane_ca(data: Mapping[str, bytes]) -> Data:
    """The CA Secret without rollover keys that cannot be used (a next CA without its
    key or unreadable, a previous bundle that is not certificates): as if the step
    that wrote them had not been taken."""
    out = {k: bytes(v) for k, v in data.items() if k in CA_KEYS}
    try:
        cert = certinfo.load_cert(out[store.NEXT_CERT])
        key = build.load_key(out[store.NEXT_KEY])
        usable = build.ca_problem(cert, key, cert.not_valid_before_utc) is None
    except (KeyError, ValueError):
        usable = False
    if not usable:
        out.pop(store.NEXT_CERT, None)
        out.pop(store.NEXT_KEY, None)
    if store.PREVIOUS_CERT in out and not _certificates(out[store.PREVIOUS_CERT]):
        del out[store.PREVIOUS_CERT]
    return out


def _certificates(data: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(bytes(data))
    except ValueError:
        return []


def _valid_leaf(data: Mapping[str, bytes], now: dt.datetime) -> x509.Certificate | None:
    """The leaf's certificate when it can keep serving now (any key type and usage)."""
    try:
        cert = certinfo.load_cert(bytes(data[store.TLS_CERT]))
    except (KeyError, ValueError):
        return None
    if store.TLS_KEY not in data or not cert.not_valid_before_utc <= now < cert.not_valid_after_utc:
        return None
    return cert


def _foreign_issuers(
    current: Mapping[str, Mapping[str, bytes]], ca_dir: Path, now: dt.datetime
) -> bytes | None:
    """The issuers (each leaf's ca.crt) of the valid leaves that no CA of ours signed,
    or None: nothing to adopt (every leaf is ours, or none can serve)."""
    ours = _certificates(store.trust_bundle(ca_dir)) if store.read_ca(ca_dir, now) else []
    foreign: list[bytes] = []
    for name in LEAVES:
        data = current.get(name, {})
        cert = _valid_leaf(data, now)
        if cert is None or any(
            cert.issuer == ca.subject and build.signed_by(cert, ca) for ca in ours
        ):
            continue
        for ca in _certificates(data.get(store.CA_CERT, b"")):
            pem = build.cert_pem(ca)
            if pem not in foreign and all(pem != build.cert_pem(o) for o in ours):
                foreign.append(pem)
    return b"".join(foreign) if foreign else None


def _begin_adoption(ca_dir: Path, foreign: bytes, settings: Settings, now: dt.datetime) -> None:
    """Ours (the usable CA, else a new one) as ``ca-next``, not signing yet; the
    foreign issuers as ``ca-previous``: the bundle trusts both."""
    usable = store.read_ca(ca_dir, now)
    if usable is not None:
        cert, key = usable
    else:
        key = build.new_key()
        cert = build.build_ca(key, now, settings.ca_days, "gpu-scheduler CA")
    for stale in (store.CA_CERT, store.CA_KEY):
        (ca_dir / stale).unlink(missing_ok=True)
    store.write_private(ca_dir / store.NEXT_KEY, build.key_pem(key))
    store.write_public(ca_dir / store.NEXT_CERT, build.cert_pem(cert))
    store.write_public(ca_dir / store.PREVIOUS_CERT, foreign)


def _adopting_leaves(root: Path, settings: Settings, now: dt.datetime) -> list[str]:
    """While adopting: every valid pair keeps serving, with the bundle as its ca.crt; a
    missing or dead one is issued at once by ours (``ca-next``, trusted already)."""
    ca_dir = root / CA_SECRET
    bundle = store.trust_bundle(ca_dir)
    signer = root / "signer"
    signer.mkdir(exist_ok=True)
    store.write_private(signer / store.CA_KEY, (ca_dir / store.NEXT_KEY).read_bytes())
    store.write_public(signer / store.CA_CERT, (ca_dir / store.NEXT_CERT).read_bytes())
    actions = []
    for name, (service, client) in LEAVES.items():
        folder = root / name
        if _valid_leaf(_read_back(folder, LEAF_KEYS), now) is None:
            for stale in (store.TLS_CERT, store.TLS_KEY):
                (folder / stale).unlink(missing_ok=True)
            _issue(folder, service, client, signer, settings, now)
            actions.append(f"{name}: issued by our CA (no pair that can serve)")
        store.write_public(folder / store.CA_CERT, bundle)
    return actions


def _finish_adoption(ca_dir: Path) -> None:
    """Ours signs from now on (the store's ``switch`` state: ``ca-previous``, the
    adopted trust, stays in the bundle until ``finish``)."""
    store.write_private(ca_dir / store.CA_KEY, (ca_dir / store.NEXT_KEY).read_bytes())
    store.write_public(ca_dir / store.CA_CERT, (ca_dir / store.NEXT_CERT).read_bytes())
    (ca_dir / store.NEXT_CERT).unlink()
    (ca_dir / store.NEXT_KEY).unlink()
