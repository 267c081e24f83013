"""The four files (``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``): read, judge, write.

The names are those of a ``kubernetes.io/tls`` Secret (plus the CA), so a directory
written here can become the Secret as it is, and a mounted Secret can be read back.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from certs import build

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"


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
) -> Outcome:
    """Write a CA and a serving pair into ``out_dir`` unless a good pair is there.

    A good pair (matching keys, signed by the CA in the directory, valid for more than
    30 days, SANs covering ``identity``) is kept. A serving pair that must be replaced
    is re-signed by the existing CA when that CA is still good, so the caBundle the
    API server holds stays valid. ``force`` replaces everything, the CA included.
    """
    now = now or dt.datetime.now(dt.UTC)
    out = Path(out_dir)
    existed = any((out / name).exists() for name in (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY))
    ca = None if force else _read_ca(out, now)
    if ca is not None:
        ca_cert, ca_key = ca
        reason = _serving_problem(out, ca_cert, identity, now)
        if reason is None:
            cert = build.load_cert((out / TLS_CERT).read_bytes())
            return Outcome("kept", "valid pair present", True, build.describe(cert))
    else:
        reason = "--force" if force else _ca_reason(out, now) or "no CA"
        ca_key = build.new_key()
        ca_cert = build.build_ca(ca_key, now, ca_days, f"{identity.common_name} CA")
        out.mkdir(parents=True, exist_ok=True)
        write_private(out / CA_KEY, build.key_pem(ca_key))
        write_public(out / CA_CERT, build.cert_pem(ca_cert))
    key = build.new_key()
    cert = build.build_serving_cert(key, identity, ca_cert, ca_key, now, days)
    # Key first, then certificate: a reader that sees the new certificate also finds
    # the new key (the webhook retries a mismatched pair at its next check anyway).
    write_private(out / TLS_KEY, build.key_pem(key))
    write_public(out / TLS_CERT, build.cert_pem(cert))
    action = "renewed" if existed else "created"
    return Outcome(action, reason, ca is not None, build.describe(cert))


def ca_bundle(cert_dir: str | os.PathLike[str]) -> str:
    """``ca.crt`` as a webhook's ``clientConfig.caBundle`` wants it (base64 of the PEM)."""
    data = (Path(cert_dir) / CA_CERT).read_bytes()
    build.load_cert(data)  # refuse to print something that is not a certificate
    return base64.b64encode(data).decode("ascii")


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


def _read_ca(out: Path, now: dt.datetime) -> tuple[build.x509.Certificate, build.PrivateKey] | None:
    try:
        cert = build.load_cert((out / CA_CERT).read_bytes())
        key = build.load_key((out / CA_KEY).read_bytes())
    except (OSError, ValueError):
        return None
    if build.ca_problem(cert, key, now) is not None:
        return None
    return cert, key


def _ca_reason(out: Path, now: dt.datetime) -> str | None:
    try:
        cert = build.load_cert((out / CA_CERT).read_bytes())
        key = build.load_key((out / CA_KEY).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return f"unreadable CA: {exc}"
    return build.ca_problem(cert, key, now)


def _serving_problem(
    out: Path, ca_cert: build.x509.Certificate, identity: build.Identity, now: dt.datetime
) -> str | None:
    try:
        cert = build.load_cert((out / TLS_CERT).read_bytes())
        key = build.load_key((out / TLS_KEY).read_bytes())
    except FileNotFoundError:
        return "no serving pair"
    except (OSError, ValueError) as exc:
        return f"unreadable serving pair: {exc}"
    return build.serving_problem(cert, key, ca_cert, identity, now)
