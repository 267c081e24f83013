"""CertReloader: one cached SSL context, rebuilt when tls.crt/tls.key change on disk."""

from __future__ import annotations

import os
import shutil
import ssl
import time
from pathlib import Path

import pytest

from gpu_scheduler.tls import CertReloader, check_pair
from tests.unit.conftest import certs_generate


@pytest.fixture
def webhook_pair(tmp_path: Path, certs_dir: Path) -> Path:
    out = tmp_path / "live"
    shutil.copytree(certs_dir, out)
    return out


def test_context_is_cached_within_the_interval(webhook_pair: Path) -> None:
    reloader = CertReloader(webhook_pair, interval=3600)
    first = reloader.context()
    assert first.minimum_version == ssl.TLSVersion.TLSv1_2
    assert reloader.context() is first and reloader.loads == 1
    # Files replaced, but the interval has not passed: still the cached context.
    os.utime(webhook_pair / "tls.crt", ns=(1, 1))
    assert reloader.context() is first


def test_context_is_rebuilt_when_files_change(webhook_pair: Path, tmp_path: Path) -> None:
    reloader = CertReloader(webhook_pair, interval=0)
    first = reloader.context()
    assert reloader.context() is first  # unchanged files: no rebuild
    fresh = tmp_path / "fresh"
    certs_generate(fresh, "--force")
    for name in ("tls.key", "tls.crt"):
        shutil.copy(fresh / name, webhook_pair / name)
    second = reloader.context()
    assert second is not first and reloader.loads == 2
    assert reloader.serving["sha256"] != ""
    ok, detail = reloader.ready()
    assert ok and "notAfter" in detail


def test_mismatched_pair_keeps_the_old_context(webhook_pair: Path, tmp_path: Path) -> None:
    reloader = CertReloader(webhook_pair, interval=0)
    first = reloader.context()
    fresh = tmp_path / "fresh"
    certs_generate(fresh)
    time.sleep(0.01)
    shutil.copy(fresh / "tls.crt", webhook_pair / "tls.crt")  # key not replaced yet
    assert reloader.context() is first
    assert reloader.error and "cannot load" in reloader.error
    ok, detail = reloader.ready()
    assert ok and "last reload failed" in detail
    shutil.copy(fresh / "tls.key", webhook_pair / "tls.key")  # the rest of the rotation
    assert reloader.context() is not first and reloader.error is None


def test_not_ready_without_certificates(tmp_path: Path) -> None:
    reloader = CertReloader(tmp_path, interval=0)
    ok, detail = reloader.ready()
    assert not ok and "not loaded" in detail
    with pytest.raises(ssl.SSLError):
        reloader.context()
    assert check_pair(tmp_path) is not None


def test_gunicorn_hook_uses_the_given_factory(webhook_pair: Path) -> None:
    calls = []

    def factory() -> ssl.SSLContext:
        calls.append(1)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(webhook_pair / "tls.crt"), str(webhook_pair / "tls.key"))
        return ctx

    hook = CertReloader(webhook_pair, interval=3600).hook()
    ctx = hook(object(), factory)
    assert hook(object(), factory) is ctx and calls == [1]
    assert check_pair(webhook_pair) is None


def test_negative_interval_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        CertReloader(tmp_path, interval=-1)
