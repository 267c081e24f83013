"""Pure functions: build a CA and a serving certificate, and judge an existing pair.

Nothing here touches the file system; :mod:`certs.store` does. Keys are ECDSA P-256
(fast to generate and to handshake with; the API server's Go TLS stack accepts them).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Renew a serving certificate that expires within this long.
RENEW_BEFORE = dt.timedelta(days=30)
#: Certificates start this long before "now", for clocks slightly behind ours.
BACKDATE = dt.timedelta(minutes=5)
ORGANIZATION = "gpu-scheduler"


@dataclass(frozen=True)
class Identity:
    """Who the serving certificate is for: DNS names and IP addresses (its SANs)."""

    dns_names: tuple[str, ...]
    ips: tuple[IPAddress, ...] = ()

    @property
    def common_name(self) -> str:
        return self.dns_names[0] if self.dns_names else str(self.ips[0])


def service_identity(service: str, namespace: str, ips: Iterable[str] = ()) -> Identity:
    """The names a Service is reached by inside a cluster, plus the given IPs.

    ``NAME``, ``NAME.NS``, ``NAME.NS.svc`` (what the API server dials for a webhook's
    ``clientConfig.service``) and ``NAME.NS.svc.cluster.local``.
    """
    if not _is_dns_label(service):
        raise ValueError(f"service name {service!r} is not a DNS label (a-z, 0-9, '-')")
    if not _is_dns_label(namespace):
        raise ValueError(f"namespace {namespace!r} is not a DNS label (a-z, 0-9, '-')")
    names = (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    )
    return Identity(names, tuple(parse_ips(ips)))


def parse_ips(values: Iterable[str]) -> list[IPAddress]:
    out: list[IPAddress] = []
    for value in values:
        try:
            ip = ipaddress.ip_address(value.strip())
        except ValueError as exc:
            raise ValueError(f"not an IP address: {value!r}") from exc
        if ip not in out:
            out.append(ip)
    return out


def new_key() -> PrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def build_ca(
    key: PrivateKey, now: dt.datetime, days: int, name: str, *, dns_names: Iterable[str] = ()
) -> x509.Certificate:
    """A self-signed CA that may sign end-entity certificates only (pathLen 0).
    ``dns_names``: SANs of the CA itself, for tools that verify their CA by a name
    (Kueue's certificate rotation checks its CA for ``kueue-ca``)."""
    _check_days(days)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, name),
        ]
    )
    public = key.public_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + dt.timedelta(days=days))
    )
    sans = [x509.DNSName(n) for n in dns_names]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return (
        builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )


def build_serving_cert(
    key: PrivateKey,
    identity: Identity,
    ca_cert: x509.Certificate,
    ca_key: PrivateKey,
    now: dt.datetime,
    days: int,
    *,
    client: bool = False,
) -> x509.Certificate:
    """A TLS server certificate for ``identity``, signed by the CA (``client``: a client
    certificate instead, extended key usage clientAuth, for kube-scheduler calling the
    extender).

    Clients (Go's crypto/tls included) match names against the SANs only, so every
    name and IP goes there; the common name is informational.
    """
    _check_days(days)
    if not identity.dns_names and not identity.ips:
        raise ValueError("a serving certificate needs at least one DNS name or IP")
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in identity.dns_names]
    sans += [x509.IPAddress(ip) for ip in identity.ips]
    public = key.public_key()
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                    x509.NameAttribute(NameOID.COMMON_NAME, identity.common_name),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


# --- judging what is on disk ---------------------------------------------------------


def ca_problem(ca_cert: x509.Certificate, ca_key: PrivateKey, now: dt.datetime) -> str | None:
    """Why this CA cannot keep signing (None when it can)."""
    if not _same_key(ca_cert, ca_key):
        return "ca.key does not match ca.crt"
    try:
        constraints = ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return "ca.crt is not a CA certificate"
    if not constraints.ca:
        return "ca.crt is not a CA certificate"
    if ca_cert.not_valid_before_utc > now:
        return "ca.crt is not valid yet"
    if ca_cert.not_valid_after_utc - now <= RENEW_BEFORE:
        return f"ca.crt expires within {RENEW_BEFORE.days} days"
    return None


def serving_problem(
    cert: x509.Certificate,
    key: PrivateKey,
    ca_cert: x509.Certificate,
    identity: Identity,
    now: dt.datetime,
) -> str | None:
    """Why the serving pair must be replaced (None when it is good as it is).

    Replaced when the key does not match, it was not signed by this CA, it is not
    valid yet, it expires within :data:`RENEW_BEFORE`, or its SANs miss a requested
    name or IP.
    """
    if not _same_key(cert, key):
        return "tls.key does not match tls.crt"
    if cert.issuer != ca_cert.subject or not signed_by(cert, ca_cert):
        return "tls.crt was not signed by the current CA"
    if cert.not_valid_before_utc > now:
        return "tls.crt is not valid yet"
    if cert.not_valid_after_utc - now <= RENEW_BEFORE:
        return f"tls.crt expires within {RENEW_BEFORE.days} days"
    missing = missing_names(cert, identity)
    if missing:
        return "tls.crt does not cover " + ", ".join(missing)
    return None


def missing_names(cert: x509.Certificate, identity: Identity) -> list[str]:
    """The requested DNS names and IPs that the certificate's SANs do not list."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [*identity.dns_names, *map(str, identity.ips)]
    dns = {n.lower() for n in san.get_values_for_type(x509.DNSName)}
    ips = set(san.get_values_for_type(x509.IPAddress))
    missing = [n for n in identity.dns_names if n.lower() not in dns]
    missing += [str(ip) for ip in identity.ips if ip not in ips]
    return missing


def is_client_cert(cert: x509.Certificate) -> bool:
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return False
    return ExtendedKeyUsageOID.CLIENT_AUTH in usage


def signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


# --- PEM -------------------------------------------------------------------------------


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_key(data: bytes) -> PrivateKey:
    key = serialization.load_pem_private_key(data, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"expected an ECDSA private key, got {type(key).__name__}")
    return key


def _same_key(cert: x509.Certificate, key: PrivateKey) -> bool:
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    return cert.public_key().public_bytes(der, spki) == key.public_key().public_bytes(der, spki)


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Digital signature (ECDSA keys sign the handshake), and for a CA certificate and
    CRL signing too."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def _check_days(days: int) -> None:
    if days < 1:
        raise ValueError(f"validity must be at least one day, got {days}")


def _is_dns_label(value: str) -> bool:
    return (
        0 < len(value) <= 63
        and value[0].isalnum()
        and value[-1].isalnum()
        and all(c.isascii() and (c.isalnum() or c == "-") and not c.isupper() for c in value)
    )
