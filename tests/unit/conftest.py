"""Fixtures for the unit tests. Names are prefixed by component (webhook_, certs_)."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import CLI, ROOT, free_port, running, tail, wait_for, webhook_command

# --- certs / webhook ------------------------------------------------------------------

CERTS_SERVICE = "gpu-scheduler-webhook"
CERTS_NAMESPACE = "gpu-scheduler"


def certs_generate(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run ``gpu-scheduler certs generate`` for the test Service, 127.0.0.1 included."""
    cmd = [
        *CLI,
        "certs",
        "generate",
        "--out",
        str(out),
        "--service",
        CERTS_SERVICE,
        "--namespace",
        CERTS_NAMESPACE,
        "--ip",
        "127.0.0.1",
        *extra,
    ]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)


@pytest.fixture(scope="module")
def certs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with ca.crt, ca.key, tls.crt, tls.key made by the certs command."""
    out = tmp_path_factory.mktemp("certs")
    certs_generate(out)
    return out


@dataclass
class WebhookServer:
    url: str
    port: int
    cert_dir: Path
    log: Path
    proc: subprocess.Popen[bytes]

    def client_context(self, ca: Path | None = None) -> ssl.SSLContext:
        """A client context that trusts only the CA in the cert dir (or ``ca``)."""
        ctx = ssl.create_default_context(cafile=str(ca or self.cert_dir / "ca.crt"))
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx


@pytest.fixture(scope="module")
def webhook_server_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., WebhookServer]]:
    """Start ``gpu-scheduler webhook`` on a free 127.0.0.1 port; stopped at module end."""
    with ExitStack() as stack:

        def start(cert_dir: Path, *extra: str) -> WebhookServer:
            port = free_port()
            log = tmp_path_factory.mktemp("webhook") / "webhook.log"
            proc = stack.enter_context(running(webhook_command(port, cert_dir, *extra), log))
            server = WebhookServer(f"https://127.0.0.1:{port}", port, cert_dir, log, proc)
            ctx = server.client_context()

            def up() -> bool:
                import urllib.request

                with urllib.request.urlopen(server.url + "/readyz", context=ctx, timeout=2) as r:
                    return r.status == 200

            try:
                wait_for(up, 40, "the webhook", interval=0.2)
            except TimeoutError:
                raise AssertionError(tail(log)) from None
            return server

        yield start


@pytest.fixture(scope="module")
def webhook_server(
    webhook_server_factory: Callable[..., WebhookServer], certs_dir: Path
) -> WebhookServer:
    """One webhook over TLS for a test module (2 workers, default config)."""
    return webhook_server_factory(certs_dir)


# --- extender caches --------------------------------------------------------------------


@pytest.fixture(autouse=True, scope="module")
def reflectors_stop_with_their_module() -> Iterator[None]:
    """Every reflector a module's tests start (a cache over the fake API) is stopped
    when the module ends: left running, each would wake at its silence bound for the
    rest of the session, list again and log that the API server went silent."""
    from extender.reflector import Reflector
    from tests.fakeapi import FakeListWatch

    started: list[Reflector] = []
    start = Reflector.start

    def recorded(self: Reflector):
        started.append(self)
        return start(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Reflector, "start", recorded)
        yield
    for reflector in started:
        reflector.stop.set()
        if isinstance(reflector.list_func, FakeListWatch):
            reflector.list_func.end_watch()
