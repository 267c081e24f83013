"""TLS for gunicorn with certificate rotation: one cached SSL context, rebuilt on change.

Used by both servers: the webhook (serving certificate) and the extender (serving
certificate, and the CA bundle that client certificates must chain to).

gunicorn (>= 21) asks its ``ssl_context(config, default_ssl_context_factory)`` server
hook for a context for every accepted connection. :class:`CertReloader` answers with
a cached context and, at most every ``interval`` seconds, compares the ``stat`` of
``tls.crt`` and ``tls.key`` with what it loaded; when they changed (a Secret update
swaps the mounted files) it builds a new context for new connections. Connections
already open keep theirs. A pair that does not load (half-written, key and
certificate from different rotations) is logged and retried at the next check while
the old context keeps serving. TLS 1.2 is the minimum. With a ``client_ca`` file
the context also asks clients for a certificate (``CERT_OPTIONAL``: a presented one
must chain to a CA in the file; whether one is required is the app's to decide per
route) and the file is watched too, so a CA rollover reaches new connections.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("gpu_scheduler.tls")

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"

Factory = Callable[[], ssl.SSLContext]
_Signature = tuple[tuple[int, int, int, int], ...]


class CertReloader:
    def __init__(
        self,
        cert_dir: str | os.PathLike[str],
        interval: float = 10.0,
        client_ca: str | os.PathLike[str] | None = None,
    ) -> None:
        if interval < 0:
            raise ValueError("the reload interval must not be negative")
        self.cert_file = str(Path(cert_dir) / CERT_FILE)
        self.key_file = str(Path(cert_dir) / KEY_FILE)
        self.client_ca = str(client_ca) if client_ca else None
        self.interval = interval
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._signature: _Signature | None = None
        self._next_check = 0.0
        self._factory: Factory | None = None
        self.loads = 0
        self.error: str | None = None
        self.serving: dict[str, object] = {}

    # --- the gunicorn hook ---------------------------------------------------------

    def hook(self) -> Callable[[Any, Factory], ssl.SSLContext]:
        """The callable for gunicorn's ``ssl_context`` setting."""

        def ssl_context(config: Any, default_ssl_context_factory: Factory) -> ssl.SSLContext:
            return self.context(default_ssl_context_factory)

        return ssl_context

    def context(self, factory: Factory | None = None) -> ssl.SSLContext:
        """The current context; checks the files when the interval has passed."""
        ctx = self._context
        if ctx is not None and time.monotonic() < self._next_check:
            return ctx
        with self._lock:
            if factory is not None:
                self._factory = factory
            if self._context is None or time.monotonic() >= self._next_check:
                self._refresh()
            if self._context is None:
                raise ssl.SSLError(f"no serving certificate loaded: {self.error}")
            return self._context

    def ready(self) -> tuple[bool, str]:
        """For ``/readyz``: a certificate is loaded (loading it now if need be)."""
        try:
            self.context()
        except (ssl.SSLError, OSError):
            return False, f"serving certificate not loaded: {self.error}"
        detail = f"serving certificate loaded, notAfter {self.serving.get('not_after')}"
        if self.error:
            detail += f"; last reload failed: {self.error}"
        return True, detail

    # --- internals -----------------------------------------------------------------

    def _refresh(self) -> None:
        self._next_check = time.monotonic() + self.interval
        try:
            files = (self.cert_file, self.key_file, *([self.client_ca] if self.client_ca else []))
            signature = tuple(_stat(path) for path in files)
        except OSError as exc:
            self._failed(f"cannot stat the certificate files: {exc}")
            return
        if signature == self._signature and self._context is not None:
            return
        try:
            ctx = (self._factory or self._plain_factory)()
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            # The factory loaded the files; read them again only to describe them.
            facts = _describe(self.cert_file)
        except (OSError, ssl.SSLError, ValueError) as exc:
            self._failed(f"cannot load {self.cert_file} with {self.key_file}: {exc}")
            return
        first = self._context is None
        self._context = ctx
        self._signature = signature
        self.error = None
        self.serving = facts
        self.loads += 1
        _count("ok", facts)
        log.info(
            "serving certificate loaded" if first else "serving certificate reloaded",
            extra={"cert": self.cert_file, **facts},
        )

    def _failed(self, message: str) -> None:
        self.error = message
        _count("error", None)
        log.warning("serving certificate reload failed", extra={"error": message})

    def _plain_factory(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(certfile=self.cert_file, keyfile=self.key_file)
        if self.client_ca:
            ctx.load_verify_locations(cafile=self.client_ca)
            ctx.verify_mode = ssl.CERT_OPTIONAL
        return ctx

    def gunicorn_options(self) -> dict[str, Any]:
        """gunicorn's TLS settings for this reloader (its default factory then loads the
        client CA as we do)."""
        options: dict[str, Any] = {
            "certfile": self.cert_file,
            "keyfile": self.key_file,
            "ssl_context": self.hook(),
        }
        if self.client_ca:
            options |= {"ca_certs": self.client_ca, "cert_reqs": ssl.CERT_OPTIONAL}
        return options


def check_pair(cert_dir: str | os.PathLike[str]) -> str | None:
    """Why ``tls.crt``/``tls.key`` in ``cert_dir`` cannot serve (None when they can)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert, key = Path(cert_dir) / CERT_FILE, Path(cert_dir) / KEY_FILE
    try:
        ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
    except (OSError, ssl.SSLError) as exc:
        return f"cannot load {cert} with {key}: {exc}"
    return None


def _stat(path: str) -> tuple[int, int, int, int]:
    st = os.stat(path)  # follows the symlinks a mounted Secret is made of
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


def _describe(cert_file: str) -> dict[str, object]:
    from gpu_scheduler.certinfo import describe, load_cert

    with open(cert_file, "rb") as fh:
        return describe(load_cert(fh.read()))


_METRICS: dict[str, Any] = {}


def _metrics() -> dict[str, Any]:
    """Created on first use (prometheus_client must be imported after the server chose
    its multiprocess directory)."""
    if not _METRICS:
        from prometheus_client import Counter, Gauge

        _METRICS["reloads"] = Counter(
            "gpu_scheduler_tls_reloads_total",
            "Serving certificate (re)loads from disk, by result (ok, error)",
            ["result"],
        )
        _METRICS["expiry"] = Gauge(
            "gpu_scheduler_tls_certificate_expiry_timestamp_seconds",
            "notAfter of the newest serving certificate a live worker loaded (Unix time)",
            multiprocess_mode="livemax",
        )
    return _METRICS


def _count(result: str, facts: dict[str, object] | None) -> None:
    found = _metrics()
    found["reloads"].labels(result).inc()
    if facts and facts.get("not_after_ts") is not None:
        found["expiry"].set(float(facts["not_after_ts"]))  # type: ignore[arg-type]
