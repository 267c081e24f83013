"""The certificate tool: pure builders, the files it writes, and the command."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from certs import build, store
from gpu_scheduler import certinfo
from tests.helpers import CLI, ROOT
from tests.unit.conftest import CERTS_NAMESPACE, CERTS_SERVICE, certs_generate

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
IDENTITY = build.service_identity("hook", "ns", ["127.0.0.1"])


def make_pair(now: dt.datetime = NOW, days: int = 365, identity=IDENTITY):
    ca_key = build.new_key()
    ca = build.build_ca(ca_key, now, 3650, "test CA")
    key = build.new_key()
    cert = build.build_serving_cert(key, identity, ca, ca_key, now, days)
    return ca, ca_key, cert, key


def test_service_identity_names() -> None:
    assert IDENTITY.dns_names == ("hook", "hook.ns", "hook.ns.svc", "hook.ns.svc.cluster.local")
    assert IDENTITY.ips == (ipaddress.ip_address("127.0.0.1"),)
    with pytest.raises(ValueError, match="DNS label"):
        build.service_identity("Hook_1", "ns")
    with pytest.raises(ValueError, match="IP"):
        build.service_identity("hook", "ns", ["localhost"])


def test_serving_certificate_contents() -> None:
    ca, _, cert, key = make_pair()
    assert build.signed_by(cert, ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == list(IDENTITY.dns_names)
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.not_valid_before_utc < NOW
    assert cert.not_valid_after_utc == NOW + dt.timedelta(days=365)
    assert build.serving_problem(cert, key, ca, IDENTITY, NOW) is None


def test_serving_problems() -> None:
    ca, ca_key, cert, key = make_pair()
    soon = NOW + dt.timedelta(days=340)
    assert "expires within 30 days" in build.serving_problem(cert, key, ca, IDENTITY, soon)
    wider = build.service_identity("hook", "ns", ["127.0.0.1", "10.0.0.1"])
    assert "10.0.0.1" in build.serving_problem(cert, key, ca, wider, NOW)
    other = build.service_identity("other", "ns")
    assert "other" in build.serving_problem(cert, key, ca, other, NOW)
    other_ca, _, _, _ = make_pair()
    assert "not signed" in build.serving_problem(cert, key, other_ca, IDENTITY, NOW)
    assert "does not match" in build.serving_problem(cert, build.new_key(), ca, IDENTITY, NOW)
    early = NOW - dt.timedelta(days=1)
    assert "not valid yet" in build.serving_problem(cert, key, ca, IDENTITY, early)
    assert build.ca_problem(ca, ca_key, NOW) is None
    assert "does not match" in build.ca_problem(ca, key, NOW)


def test_generate_writes_four_files_with_private_keys(tmp_path: Path) -> None:
    out = store.generate(tmp_path, IDENTITY, now=NOW)
    assert out.action == "created" and not out.ca_reused
    for name in ("ca.crt", "tls.crt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644
    for name in ("ca.key", "tls.key"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]


def test_generate_keeps_a_good_pair_and_renews_when_needed(tmp_path: Path) -> None:
    store.generate(tmp_path, IDENTITY, now=NOW)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    kept = store.generate(tmp_path, IDENTITY, now=NOW + dt.timedelta(days=300))
    assert kept.action == "kept"
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files

    # Within 30 days of expiry: a new serving pair, signed by the same CA.
    renewed = store.generate(tmp_path, IDENTITY, now=NOW + dt.timedelta(days=340))
    assert renewed.action == "renewed" and renewed.ca_reused
    assert "expires within" in renewed.reason
    assert (tmp_path / "ca.crt").read_bytes() == files["ca.crt"]
    assert (tmp_path / "tls.crt").read_bytes() != files["tls.crt"]

    # New names requested: renewed, the CA kept.
    wider = build.service_identity("hook", "ns", ["127.0.0.1", "::1"])
    out = store.generate(tmp_path, wider, now=NOW + dt.timedelta(days=340))
    assert out.action == "renewed" and "::1" in out.reason and out.ca_reused

    # --force: everything new, the CA too.
    forced = store.generate(tmp_path, wider, now=NOW + dt.timedelta(days=340), force=True)
    assert forced.action == "renewed" and not forced.ca_reused
    assert (tmp_path / "ca.crt").read_bytes() != files["ca.crt"]


def test_generate_replaces_a_broken_pair(tmp_path: Path) -> None:
    store.generate(tmp_path, IDENTITY, now=NOW)
    (tmp_path / "tls.key").write_text("garbage")
    out = store.generate(tmp_path, IDENTITY, now=NOW)
    assert out.action == "renewed" and "unreadable" in out.reason
    (tmp_path / "ca.key").write_text("garbage")
    out = store.generate(tmp_path, IDENTITY, now=NOW)
    assert out.action == "renewed" and not out.ca_reused


def test_ca_bundle_is_base64_of_the_pem(tmp_path: Path) -> None:
    store.generate(tmp_path, IDENTITY, now=NOW)
    bundle = store.ca_bundle(tmp_path)
    assert base64.b64decode(bundle) == (tmp_path / "ca.crt").read_bytes()


def test_cli_generate_and_ca_bundle(tmp_path: Path) -> None:
    proc = certs_generate(tmp_path, "--days", "90")
    report = json.loads(proc.stdout)
    assert report["action"] == "created"
    assert f"{CERTS_SERVICE}.{CERTS_NAMESPACE}.svc" in report["sans"]
    assert "127.0.0.1" in report["sans"]
    assert json.loads(certs_generate(tmp_path, "--days", "90").stdout)["action"] == "kept"
    bundle = subprocess.run(
        [*CLI, "certs", "ca-bundle", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert base64.b64decode(bundle) == (tmp_path / "ca.crt").read_bytes()


@pytest.mark.parametrize(
    "args",
    [
        ["certs", "ca-bundle", "/nonexistent-dir"],
        ["certs", "generate", "--out", "x", "--service", "Bad_Name", "--namespace", "ns"],
        ["certs", "generate", "--out", "x", "--service", "s", "--namespace", "n", "--days", "0"],
        ["certs", "generate", "--out", "x", "--service", "s", "--namespace", "n", "--ip", "nope"],
    ],
)
def test_cli_errors_exit_2(args: list[str], tmp_path: Path) -> None:
    proc = subprocess.run([*CLI, *args], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("gpu-scheduler certs")
    assert not (tmp_path / "x").exists()


# --- one CA for several leaves, client pairs, and a rollover without a gap ---------------


def pem_certs(data: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(data)


def test_leaves_share_a_ca_dir_and_carry_the_bundle(tmp_path: Path) -> None:
    ca_dir = tmp_path / "ca"
    hook = store.generate(tmp_path / "webhook", IDENTITY, ca_dir=ca_dir)
    client = store.generate(
        tmp_path / "sched", build.service_identity("sched", "ns"), ca_dir=ca_dir, client=True
    )
    assert hook.action == client.action == "created"
    ca = certinfo.load_cert((ca_dir / "ca.crt").read_bytes())
    for leaf in ("webhook", "sched"):
        cert = certinfo.load_cert((tmp_path / leaf / "tls.crt").read_bytes())
        assert build.signed_by(cert, ca)
        assert (tmp_path / leaf / "ca.crt").read_bytes() == (ca_dir / "ca.crt").read_bytes()
    usage = certinfo.load_cert((tmp_path / "sched" / "tls.crt").read_bytes()).extensions
    eku = usage.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    # asking for a serving pair where a client pair is: re-issued
    again = store.generate(tmp_path / "sched", build.service_identity("sched", "ns"), ca_dir=ca_dir)
    assert again.action == "renewed" and "serving pair is wanted" in again.reason


def test_ca_rollover_keeps_old_and_new_trusted_until_every_leaf_switched(tmp_path: Path):
    ca_dir, leaf = tmp_path / "ca", tmp_path / "webhook"
    store.generate(leaf, IDENTITY, ca_dir=ca_dir)
    old_ca = certinfo.load_cert((ca_dir / "ca.crt").read_bytes())
    old_leaf = certinfo.load_cert((leaf / "tls.crt").read_bytes())

    store.rotate_ca(ca_dir, "begin")
    bundle = pem_certs(store.trust_bundle(ca_dir))
    assert len(bundle) == 2 and bundle[0] == old_ca
    assert store.generate(leaf, IDENTITY, ca_dir=ca_dir).action == "kept"  # old CA still signs
    assert len(pem_certs((leaf / "ca.crt").read_bytes())) == 2  # but the bundle moved

    store.rotate_ca(ca_dir, "switch")
    new_ca = certinfo.load_cert((ca_dir / "ca.crt").read_bytes())
    assert new_ca != old_ca and build.signed_by(old_leaf, old_ca)
    trusted = pem_certs(store.trust_bundle(ca_dir))
    assert sorted(c.serial_number for c in trusted) == sorted(
        c.serial_number for c in (old_ca, new_ca)
    )
    renewed = store.generate(leaf, IDENTITY, ca_dir=ca_dir)
    assert renewed.action == "renewed" and "current CA" in renewed.reason
    assert build.signed_by(certinfo.load_cert((leaf / "tls.crt").read_bytes()), new_ca)

    store.rotate_ca(ca_dir, "finish")
    assert pem_certs(store.trust_bundle(ca_dir)) == [new_ca]
    store.rotate_ca(ca_dir, "begin")
    with pytest.raises(ValueError, match="switch first"):
        store.rotate_ca(ca_dir, "finish")
