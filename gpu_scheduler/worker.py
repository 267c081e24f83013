"""A gunicorn worker whose threads only ever see whole requests.

gunicorn's ``gthread`` worker hands a connection to a thread as soon as it has some
data, and the thread then reads the rest of the request with blocking calls. A client
that sends a partial header, a partial TLS record or a stalled body keeps that thread
until it gives up; sixteen such clients stall every thread of a 4-thread, 4-worker
server, and with them kube-scheduler's extender calls or the API server's admission
calls.

:class:`BufferingWorker` keeps ``gthread``'s accept loop, thread pool and keep-alive
handling, and changes what happens between accept and the thread: the main loop
completes the TLS handshake and reads the request (head and body, ``Content-Length``
or chunked) with non-blocking calls into a buffer, and only a complete request is
handed to a thread, through a parser that reads from that buffer and so can never
wait on the socket. A slow client therefore costs a selector entry and its buffer,
never a thread. Each request must arrive whole within ``request_deadline`` seconds of
its first byte (of the connection, for a new one: the TLS handshake counts), its head
within :data:`MAX_HEAD` bytes and its body within ``max_body`` bytes; otherwise the
loop answers 408, 431 or 413 with a JSON body and closes. A response is written with a
socket timeout of ``request_deadline``, so a client that does not read cannot keep a
thread either. Errors gunicorn answers itself (bad framing) get a JSON body as well.

A server may listen on several ports of which only some are TLS (``plain_ports`` are
not: the extender serves its verbs over TLS and its metrics in the clear). The app
learns how a request came in from two environ keys the worker sets:
``gpu_scheduler.tls`` (bool) and ``gpu_scheduler.client_cert`` (the verified client
certificate as ``ssl.getpeercert()`` gives it, or None).

Not handled in the loop: ``Expect: 100-continue`` (clients that wait for the 100
send the body after their own timeout, about a second; Go's net/http, which
kube-scheduler and the API server use, does not send it), HTTP/2 (not enabled).
"""

from __future__ import annotations

import contextlib
import errno
import json
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from functools import partial
from typing import Any

from gunicorn import http, util
from gunicorn import sock as gsock
from gunicorn.workers.gthread import TConn, ThreadWorker

from gpu_scheduler.textclip import clip_text

#: Largest request head (request line and headers) read before it is refused.
MAX_HEAD = 64 << 10
_RECV = 256 << 10
_PIECE = 64 << 10
#: Seconds a refused connection is still read (and discarded) before it closes.
LINGER = 2.0
_REASONS = {
    408: "Request Timeout",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
}


def _metric() -> Any:
    from prometheus_client import Counter

    return Counter(
        "gpu_scheduler_http_connections_refused_total",
        "Connections the server closed before a thread saw them, by reason",
        ["reason"],
    )


_REFUSED: Any = None


def _refused(reason: str) -> None:
    global _REFUSED
    if _REFUSED is None:
        _REFUSED = _metric()
    _REFUSED.labels(reason).inc()


class RequestFraming:
    """Where the first request in a byte buffer ends (HTTP/1.1 framing), found
    incrementally as bytes arrive. :meth:`feed` returns the request's length once it
    is whole, ``None`` while more is needed; :attr:`refusal` is set when the request
    must be refused (too large) and :attr:`undecidable` when the framing is one the
    loop does not judge (gunicorn's parser then answers 400 from the bytes so far)."""

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self.head_end: int | None = None
        self.length: int | None = None  # Content-Length
        self.chunked = False
        self.pos = 0  # chunked: where the next chunk-size line starts
        self.refusal: int | None = None
        self.undecidable = False

    def feed(self, buf: bytearray) -> int | None:
        if self.head_end is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self.refusal = 431
                return None
            self.head_end = end + 4
            if self.head_end > MAX_HEAD:
                self.refusal = 431
                return None
            self._read_head(bytes(buf[:end]))
            if self.refusal or self.undecidable:
                return None
            self.pos = self.head_end
        if self.chunked:
            return self._chunked(buf)
        end = self.head_end + (self.length or 0)
        return end if len(buf) >= end else None

    def _read_head(self, head: bytes) -> None:
        lengths, codings = [], []
        for line in head.split(b"\r\n")[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            name = name.strip().lower()
            if name == b"content-length":
                lengths.append(value.strip())
            elif name == b"transfer-encoding":
                codings += [c.strip().lower() for c in value.split(b",")]
        if codings:
            if lengths or codings[-1] != b"chunked":
                self.undecidable = True
            self.chunked = True
            return
        if not lengths:
            return
        if len(set(lengths)) != 1 or not lengths[0].isdigit() or len(lengths[0]) > 18:
            self.undecidable = True
            return
        self.length = int(lengths[0])
        if self.length > self.max_body:
            self.refusal = 413

    def _chunked(self, buf: bytearray) -> int | None:
        assert self.head_end is not None
        while True:
            line_end = buf.find(b"\r\n", self.pos)
            if line_end < 0:
                if len(buf) - self.pos > 1024:
                    self.undecidable = True  # no sane chunk-size line is that long
                return None
            size_text = bytes(buf[self.pos : line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16) if size_text else -1
            except ValueError:
                size = -1
            if size < 0 or len(size_text) > 16:
                self.undecidable = True
                return None
            if size == 0:
                trailer_end = buf.find(b"\r\n\r\n", line_end)
                if buf[line_end : line_end + 4] == b"\r\n\r\n":
                    return line_end + 4
                return trailer_end + 4 if trailer_end >= 0 else None
            if line_end + 2 + size - self.head_end > self.max_body:
                self.refusal = 413
                return None
            chunk_end = line_end + 2 + size + 2
            if len(buf) < chunk_end:
                return None
            self.pos = chunk_end


_connection = threading.local()
TLS_KEY = "gpu_scheduler.tls"
CLIENT_CERT_KEY = "gpu_scheduler.client_cert"


def with_connection_info(app: Any) -> Any:
    """WSGI middleware: put the serving thread's connection facts into the environ."""

    def wrapped(environ: dict[str, Any], start_response: Any) -> Any:
        environ[TLS_KEY] = getattr(_connection, "tls", False)
        environ[CLIENT_CERT_KEY] = getattr(_connection, "client_cert", None)
        return app(environ, start_response)

    return wrapped


class _Conn(TConn):
    """A connection being read by the main loop, then served by a thread."""

    def __init__(
        self, cfg: Any, sock: Any, client: Any, server: Any, max_body: int, tls: bool
    ) -> None:
        super().__init__(cfg, sock, client, server)
        self.max_body = max_body
        self.buf = bytearray()
        self.framing = RequestFraming(max_body)
        self.tls = tls
        self.handshaken = not tls
        self.deadline = 0.0
        self.initialized = True  # TConn.init() (blocking TLS wrap) never runs

    def start_request(self, deadline: float) -> None:
        self.deadline = deadline
        self.framing = RequestFraming(self.max_body)

    def take_request(self, end: int) -> None:
        """Give the first ``end`` bytes to a fresh parser; keep the rest.

        The parser reads them in pieces: gunicorn's unreader copies what it holds
        beyond each read, so one 4 MiB piece read 8 KiB at a time would cost 2 GB of
        copying."""
        request, self.buf = bytes(self.buf[:end]), self.buf[end:]
        pieces = [request[i : i + _PIECE] for i in range(0, len(request), _PIECE)]
        self.parser = http.get_parser(self.cfg, iter(pieces), self.client)


class BufferingWorker(ThreadWorker):
    """``gthread`` with requests read whole by the main loop (see the module)."""

    #: Seconds a request may take to arrive, from its first byte.
    request_deadline = 10.0
    #: Largest body; set per server by :func:`worker_class`.
    max_body = 8 << 20
    #: Listening ports served in the clear even when the server has a certificate.
    plain_ports: frozenset[int] = frozenset()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reading: deque[_Conn] = deque()
        self.lingering: deque[_Conn] = deque()

    def init_process(self) -> None:
        util.write_error = write_json_error  # gunicorn's own 4xx answers, as JSON
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        self.wsgi = with_connection_info(self.wsgi)

    # --- accept and read in the main loop ------------------------------------------
    def accept(self, listener: socket.socket) -> None:
        try:
            client, addr = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        client.setblocking(False)
        tls = self.cfg.is_ssl and listener.getsockname()[1] not in self.plain_ports
        if tls:
            try:
                client = gsock.ssl_context(self.cfg).wrap_socket(
                    client,
                    server_side=True,
                    do_handshake_on_connect=False,
                    suppress_ragged_eofs=True,
                )
            except (OSError, ssl.SSLError):
                self.nr_conns -= 1
                util.close(client)
                return
        conn = _Conn(self.cfg, client, addr, listener.getsockname(), self.max_body, tls)
        self._read_next(conn, time.monotonic() + self.request_deadline)

    def on_client_socket_readable(self, conn: _Conn, client: Any) -> None:
        """A kept-alive connection has its next request coming."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._read_next(conn, time.monotonic() + self.request_deadline)

    def _read_next(self, conn: _Conn, deadline: float) -> None:
        conn.start_request(deadline)
        self.reading.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))
        if conn.buf or (conn.handshaken and self._pending_tls(conn)):
            self._on_readable(conn, conn.sock)  # bytes already here (pipelined)

    @staticmethod
    def _pending_tls(conn: _Conn) -> bool:
        return isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending() > 0

    def _on_readable(self, conn: _Conn, _sock: Any) -> None:
        try:
            if not conn.handshaken:
                conn.sock.do_handshake()
                conn.handshaken = True
            while True:
                data = conn.sock.recv(_RECV)
                if not data:
                    self._drop(conn)  # the client went away
                    return
                conn.buf += data
                if not self._pending_tls(conn) and len(data) < _RECV:
                    break
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            pass
        except (OSError, ValueError):
            self._drop(conn, None if conn.handshaken else "tls-handshake")
            return
        if not conn.handshaken:
            return
        end = conn.framing.feed(conn.buf)
        if conn.framing.refusal:
            self._refuse(conn, conn.framing.refusal)
        elif end is not None or conn.framing.undecidable:
            self._dispatch(conn, end if end is not None else len(conn.buf))

    def _dispatch(self, conn: _Conn, end: int) -> None:
        self._forget(conn)
        conn.take_request(end)
        self.enqueue_req(conn)

    def _forget(self, conn: _Conn, held: deque[_Conn] | None = None) -> None:
        """Stop watching ``conn``'s socket and take it out of ``held`` (None:
        ``reading``)."""
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)
        with contextlib.suppress(ValueError):
            (self.reading if held is None else held).remove(conn)

    def _drop(
        self, conn: _Conn, reason: str | None = None, held: deque[_Conn] | None = None
    ) -> None:
        """Close ``conn`` for good (see :meth:`_forget` for ``held``); ``reason``: the
        refusal to count, if it was refused."""
        self._forget(conn, held)
        self.nr_conns -= 1
        if reason:
            _refused(reason)
        util.close(conn.sock)

    def _refuse(self, conn: _Conn, status: int) -> None:
        """Answer ``status`` and close, after reading (and discarding) what the client
        still sends for up to :data:`LINGER` seconds: closing with unread bytes would
        reset the connection before the client reads the answer."""
        self._forget(conn)
        _refused({408: "deadline", 413: "body-too-large", 431: "head-too-large"}[status])
        with contextlib.suppress(OSError, ValueError):
            conn.sock.send(_json_error_bytes(status, _REASONS[status], _refusal_text(status, self)))
        conn.buf = bytearray()
        conn.deadline = time.monotonic() + LINGER
        self.lingering.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_linger, conn))

    def _on_linger(self, conn: _Conn, _sock: Any) -> None:
        try:
            while conn.sock.recv(_RECV):
                pass
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            return
        except (OSError, ValueError):
            pass
        self._drop(conn, held=self.lingering)

    def murder_pending(self) -> None:
        super().murder_pending()
        now = time.monotonic()
        while self.reading and self.reading[0].deadline <= now:
            conn = self.reading[0]
            if conn.handshaken and conn.buf:
                self._refuse(conn, 408)
            else:
                self._drop(conn, "deadline")
        while self.lingering and self.lingering[0].deadline <= now:
            self._drop(self.lingering[0], held=self.lingering)

    # --- in a thread: the request is whole -----------------------------------------
    def handle(self, conn: _Conn) -> Any:
        req = None
        try:
            conn.sock.setblocking(True)
            conn.sock.settimeout(self.request_deadline)  # a client that does not read
            _connection.tls = conn.tls
            _connection.client_cert = conn.sock.getpeercert() if conn.tls else None
            req = next(conn.parser)
            if not req:
                return False
            # No finish_body(): whatever the app left unread is in this request's
            # pieces only (the next request has its own parser), so there is
            # nothing to drain from the socket.
            return self.handle_request(req, conn)
        except (http.errors.NoMoreData, StopIteration):
            pass
        except (TimeoutError, ssl.SSLError, OSError) as exc:
            self.log.debug("connection ended while answering: %r", exc)
        except Exception as exc:
            self.handle_error(req, conn.sock, conn.client, exc)
        return False

    def finish_request(self, conn: _Conn, fs: Any) -> None:
        if fs.cancelled() or fs.exception() is not None or not fs.result() or not self.alive:
            self.nr_conns -= 1
            conn.close()
            return
        conn.sock.setblocking(False)
        if conn.buf:  # the client pipelined its next request
            self._read_next(conn, time.monotonic() + self.request_deadline)
            return
        conn.set_timeout()
        self.keepalived_conns.append(conn)
        self.poller.register(
            conn.sock, selectors.EVENT_READ, partial(self.on_client_socket_readable, conn)
        )


def _refusal_text(status: int, worker: BufferingWorker) -> str:
    if status == 408:
        return f"the request did not arrive whole within {worker.request_deadline:g}s"
    if status == 413:
        return f"request body is over the limit of {worker.max_body} bytes"
    return f"request head is over the limit of {MAX_HEAD} bytes"


def _json_error_bytes(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": clip_text(message, 1024)}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


def write_json_error(sock: Any, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's ``util.write_error``, answering in JSON like the rest of our API."""
    payload = _json_error_bytes(status_int, reason, mesg or reason)
    with contextlib.suppress(OSError, ValueError):
        util.write_nonblock(sock, payload)


def worker_class(
    max_body: int, request_deadline: float = 10.0, plain_ports: frozenset[int] = frozenset()
) -> type[BufferingWorker]:
    """A :class:`BufferingWorker` class with this server's limits (gunicorn takes a
    class for ``worker_class``)."""
    return type(
        "BufferingWorker",
        (BufferingWorker,),
        {"max_body": max_body, "request_deadline": request_deadline, "plain_ports": plain_ports},
    )
