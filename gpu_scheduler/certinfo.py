"""What a PEM certificate says, for logs, metrics and the ``certs`` command: the one
place that reads a certificate's facts (the servers' TLS reload and ``certs`` both
use it; ``certs`` makes certificates, the floor only reads them)."""

from __future__ import annotations

from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes


def load_cert(data: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data)


def describe(cert: x509.Certificate) -> dict[str, object]:
    """A few facts for logs and the command's output."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names: Sequence[str] = [
            *san.get_values_for_type(x509.DNSName),
            *map(str, san.get_values_for_type(x509.IPAddress)),
        ]
    except x509.ExtensionNotFound:
        names = []
    return {
        "subject": cert.subject.rfc4514_string(),
        "not_after": cert.not_valid_after_utc.isoformat(),
        "not_after_ts": cert.not_valid_after_utc.timestamp(),
        "sans": list(names),
        "sha256": cert.fingerprint(hashes.SHA256()).hex(),
    }
