"""The files: a CA directory, and leaf directories it signs: read, judge, write.

A leaf directory holds ``tls.crt``, ``tls.key`` and ``ca.crt``: the names of a
``kubernetes.io/tls`` Secret plus its CA, so it can become the Secret as it is. Its
``ca.crt`` is the *trust bundle* (every CA that is trusted now), which is what the
webhook's caBundle, kube-scheduler's ``caFile`` and the extender's client CA read.

The CA directory holds ``ca.crt``/``ca.key`` (the CA that signs), and during a CA
rollover also ``ca-next.crt``/``ca-next.key`` (a new CA, trusted but not signing yet)
or ``ca-previous.crt`` (the old one, still trusted but no longer signing). Without
``--ca-dir`` the CA lives in the leaf directory itself, as it always did for the
webhook.

A rollover never leaves a window in which a client refuses a server, or a server a
client (:func:`rotate_ca`):

1. ``begin``: a new CA is made; the bundle holds old and new. Publish the bundle
   everywhere and wait until every reader has it. Leaves are still the old CA's.
2. ``switch``: the new CA signs from now on; leaves are re-issued by it (``generate``
   renews every leaf the current CA did not sign). The old CA stays in the bundle,
   so a peer still presenting an old leaf is trusted. Publish the leaves; wait.
3. ``finish``: the old CA leaves the bundle. Publish the bundle.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography.x509.oid import NameOID

from certs import build
from gpu_scheduler import certinfo

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
NEXT_CERT = "ca-next.crt"
NEXT_KEY = "ca-next.key"
PREVIOUS_CERT = "ca-previous.crt"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
PHASES = ("begin", "switch", "finish")


@dataclass(frozen=True)
class Outcome:
    action: str  # "kept", "created" or "renewed"
    reason: str
    ca_reused: bool
    serving: dict[str, object]


def generate(
    out_dir: str | os.PathLike[str],
    identity: build.Identity,
    *,
    days: int = 365,
    ca_days: int = 3650,
    force: bool = False,
    now: dt.datetime | None = None,
    ca_dir: str | os.PathLike[str] | None = None,
    client: bool = False,
) -> Outcome:
    """Write a CA (unless a good one is there) and a leaf pair into ``out_dir`` unless
    a good pair is there; the CA lives in ``ca_dir`` when given, else in ``out_dir``.

    A good pair (matching keys, signed by the current CA, valid for more than 30 days,
    SANs covering ``identity``, of the same kind: serving or ``client``) is kept. A
    pair that must be replaced is signed by the existing CA when that CA is still good,
    so the caBundle peers hold stays valid. ``force`` replaces everything, the CA
    included. The leaf's ``ca.crt`` is refreshed to the current trust bundle.
    """
    now = now or dt.datetime.now(dt.UTC)
    out = Path(out_dir)
    cas = Path(ca_dir) if ca_dir is not None else out
    existed = any((out / name).exists() for name in (TLS_CERT, TLS_KEY))
    ca = None if force else read_ca(cas, now)
    reason: str | None
    if ca is not None:
        ca_cert, ca_key = ca
        reason = _serving_problem(out, ca_cert, identity, now, client)
    else:
        reason = "--force" if force else _ca_reason(cas, now) or "no CA"
        ca_key = build.new_key()
        ca_cert = build.build_ca(ca_key, now, ca_days, f"{identity.common_name} CA")
        cas.mkdir(parents=True, exist_ok=True)
        write_private(cas / CA_KEY, build.key_pem(ca_key))
        write_public(cas / CA_CERT, build.cert_pem(ca_cert))
        for stale in (NEXT_CERT, NEXT_KEY, PREVIOUS_CERT):
            (cas / stale).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    if cas != out:
        write_public(out / CA_CERT, trust_bundle(cas))
    if reason is None:
        cert = certinfo.load_cert((out / TLS_CERT).read_bytes())
        return Outcome("kept", "valid pair present", True, certinfo.describe(cert))
    key = build.new_key()
    cert = build.build_serving_cert(key, identity, ca_cert, ca_key, now, days, client=client)
    # Key first, then certificate: a reader that sees the new certificate also finds
    # the new key (the servers retry a mismatched pair at their next check anyway).
    write_private(out / TLS_KEY, build.key_pem(key))
    write_public(out / TLS_CERT, build.cert_pem(cert))
    action = "renewed" if existed else "created"
    return Outcome(action, reason, ca is not None, certinfo.describe(cert))


def trust_bundle(ca_dir: str | os.PathLike[str]) -> bytes:
    """Every CA trusted now, PEM: the signing one, and the next or previous one during a
    rollover."""
    cas = Path(ca_dir)
    parts = []
    for name in (CA_CERT, NEXT_CERT, PREVIOUS_CERT):
        path = cas / name
        if path.exists():
            data = path.read_bytes()
            certinfo.load_cert(data)  # never pass on something that is not a certificate
            parts.append(data if data.endswith(b"\n") else data + b"\n")
    if not parts:
        raise FileNotFoundError(f"no {CA_CERT} in {cas}")
    return b"".join(parts)


def rotate_ca(
    ca_dir: str | os.PathLike[str], phase: str, *, days: int = 3650, now: dt.datetime | None = None
) -> str:
    """One step of a CA rollover (see the module): returns what it did."""
    now = now or dt.datetime.now(dt.UTC)
    cas = Path(ca_dir)
    current = read_ca(cas, now, strict=False)
    if current is None:
        raise ValueError(f"no usable CA in {cas}: run generate first")
    if phase == "begin":
        if (cas / NEXT_CERT).exists():
            return "a new CA was already made; publish the bundle, then switch"
        if (cas / PREVIOUS_CERT).exists():
            raise ValueError("a rollover is still switching: finish it first")
        key = build.new_key()
        name = current[0].subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        cert = build.build_ca(key, now, days, str(name))
        write_private(cas / NEXT_KEY, build.key_pem(key))
        write_public(cas / NEXT_CERT, build.cert_pem(cert))
        return "made a new CA: the bundle now holds both; publish it everywhere"
    if phase == "switch":
        if not (cas / NEXT_CERT).exists():
            if (cas / PREVIOUS_CERT).exists():
                return "already switched; re-issue the leaves, publish them, then finish"
            raise ValueError("no new CA: begin first")
        write_public(cas / PREVIOUS_CERT, (cas / CA_CERT).read_bytes())
        write_private(cas / CA_KEY, (cas / NEXT_KEY).read_bytes())
        write_public(cas / CA_CERT, (cas / NEXT_CERT).read_bytes())
        (cas / NEXT_CERT).unlink()
        (cas / NEXT_KEY).unlink()
        return "the new CA signs now; re-issue the leaves (generate) and publish them"
    if phase == "finish":
        if (cas / NEXT_CERT).exists():
            raise ValueError("not switched yet: switch first")
        (cas / PREVIOUS_CERT).unlink(missing_ok=True)
        return "the old CA is out of the bundle; publish it"
    raise ValueError(f"phase must be one of {PHASES}")


def ca_bundle(cert_dir: str | os.PathLike[str]) -> str:
    """The trust bundle of a CA directory (or a leaf's ``ca.crt``) as a webhook's
    ``clientConfig.caBundle`` wants it (base64 of the PEM)."""
    return base64.b64encode(trust_bundle(cert_dir)).decode("ascii")


def write_private(path: Path, data: bytes) -> None:
    _write_atomic(path, data, 0o600)


def write_public(path: Path, data: bytes) -> None:
    _write_atomic(path, data, 0o644)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write a sibling temporary file (created with ``mode``), then rename it over."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_ca(
    out: Path, now: dt.datetime, *, strict: bool = True
) -> tuple[build.x509.Certificate, build.PrivateKey] | None:
    try:
        cert = certinfo.load_cert((out / CA_CERT).read_bytes())
        key = build.load_key((out / CA_KEY).read_bytes())
    except (OSError, ValueError):
        return None
    if strict and build.ca_problem(cert, key, now) is not None:
        return None
    return cert, key


def _ca_reason(out: Path, now: dt.datetime) -> str | None:
    try:
        cert = certinfo.load_cert((out / CA_CERT).read_bytes())
        key = build.load_key((out / CA_KEY).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return f"unreadable CA: {exc}"
    return build.ca_problem(cert, key, now)


def _serving_problem(
    out: Path,
    ca_cert: build.x509.Certificate,
    identity: build.Identity,
    now: dt.datetime,
    client: bool = False,
) -> str | None:
    try:
        cert = certinfo.load_cert((out / TLS_CERT).read_bytes())
        key = build.load_key((out / TLS_KEY).read_bytes())
    except FileNotFoundError:
        return "no pair"
    except (OSError, ValueError) as exc:
        return f"unreadable pair: {exc}"
    if build.is_client_cert(cert) != client:
        return "a client pair is wanted" if client else "a serving pair is wanted"
    return build.serving_problem(cert, key, ca_cert, identity, now)
