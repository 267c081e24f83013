"""The buffering worker: request framing (pure), and slow clients against real servers."""

from __future__ import annotations

import json
import socket
import ssl
import statistics
import time
from contextlib import ExitStack

import pytest
import requests

from gpu_scheduler.worker import MAX_HEAD, RequestFraming
from tests.factories import make_node, make_pod
from tests.fuzz.harness import cpu_ns, worker_pids
from tests.fuzz.servers import extender_fake_cluster

SERVICE = "gpu-scheduler-webhook.gpu-scheduler.svc"
GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def feed_in_pieces(
    data: bytes, max_body: int = 1 << 20, step: int = 7
) -> tuple[int | None, RequestFraming]:
    framing, buf, end = RequestFraming(max_body), bytearray(), None
    for i in range(0, len(data), step):
        buf += data[i : i + step]
        end = framing.feed(buf)
        if end is not None or framing.refusal or framing.undecidable:
            break
    return end, framing


def test_a_request_without_body_ends_after_its_head():
    end, _ = feed_in_pieces(GET + b"GET /next")
    assert end == len(GET)


def test_content_length_body():
    req = b"POST /filter HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
    end, _ = feed_in_pieces(req + b"POST /next")
    assert end == len(req)
    end, framing = feed_in_pieces(req[:-1], step=1000)
    assert end is None and not framing.refusal


def test_chunked_body_with_extensions_and_trailers():
    head = b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
    body = b"5;ext=1\r\nhello\r\n3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n"
    end, _ = feed_in_pieces(head.replace(b"gzip, ", b"") + body + b"tail", step=3)
    assert end == len(head) - len(b"gzip, ") + len(body)
    plain = b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n"
    assert feed_in_pieces(plain, step=1)[0] == len(plain)


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"POST / HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n", 413),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nfffff\r\n" + b"x" * 10, 413),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD + 10), 431),
    ],
)
def test_too_large_is_refused(data, status):
    _, framing = feed_in_pieces(data, step=100_000)
    assert framing.refusal == status


@pytest.mark.parametrize(
    "head",
    [
        b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
def test_framing_it_does_not_judge_is_left_to_gunicorn(head):
    _, framing = feed_in_pieces(head, step=1000)
    assert framing.undecidable


# --- real servers ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def extender_server(tmp_path_factory):
    work = tmp_path_factory.mktemp("slow")
    args = ("--threads=2", "--request-deadline=1s")
    with extender_fake_cluster(work, 1, *args, nodes=[make_node("a", 8)]) as (url, pid, _):
        yield int(url.rsplit(":", 1)[1]), pid


@pytest.fixture
def extender(extender_server):
    return extender_server[0]


def filter_once(port: int) -> float:
    body = {"Pod": make_pod(gpus=1), "NodeNames": ["a"]}
    started = time.monotonic()
    r = requests.post(f"http://127.0.0.1:{port}/filter", json=body, timeout=5)
    assert r.status_code == 200
    return time.monotonic() - started


def test_slow_clients_do_not_hold_the_threads(extender):
    with ExitStack() as stack:
        slow = []
        for i in range(16):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", extender)))
            if i % 2:
                sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Le")  # partial head
            else:
                sock.sendall(b"POST /filter HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")  # stalled
            slow.append(sock)
        # 16 stalled connections, 2 threads: a legitimate call is still answered at once.
        assert max(filter_once(extender) for _ in range(5)) < 0.5
        # Past the deadline each slow one is answered 408 in JSON and closed.
        for sock in slow:
            sock.settimeout(5)
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
            assert data.startswith(b"HTTP/1.1 408"), data[:80]
            assert "did not arrive whole" in json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]


def test_a_pipelined_request_is_answered_too(extender):
    """Two requests in one send: two answers on the same connection (a server that
    closed after the first would end the read early, and the count would say so)."""
    with socket.create_connection(("127.0.0.1", extender), timeout=5) as sock:
        sock.sendall(GET + GET)
        data = b""
        while data.count(b"HTTP/1.1 200") < 2 and (chunk := sock.recv(4096)):
            data += chunk
    assert data.count(b"HTTP/1.1 200") == 2, data[:200]


def test_bad_framing_gets_a_json_answer(extender):
    with socket.create_connection(("127.0.0.1", extender), timeout=5) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        data = sock.recv(4096)
    assert data.startswith(b"HTTP/1.1 400")
    assert b"Content-Type: application/json" in data
    assert "error" in json.loads(data.split(b"\r\n\r\n", 1)[1])


def test_slow_tls_handshakes_do_not_hold_the_webhook(webhook_server_factory, certs_dir):
    server = webhook_server_factory(
        certs_dir, "--workers=1", "--threads=2", "--request-deadline=1s"
    )
    ctx = server.client_context()
    with ExitStack() as stack:
        for i in range(16):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", server.port)))
            if i % 2:
                sock.sendall(b"\x16\x03\x01\x02\x00\x01")  # a TLS record cut short
            else:
                tls = ctx.wrap_socket(sock, server_hostname=SERVICE)
                tls.sendall(b"POST /mutate HTTP/1.1\r\nContent-Length: 50\r\n\r\n{")
        for _ in range(5):
            started = time.monotonic()
            r = requests.get(server.url + "/healthz", verify=str(certs_dir / "ca.crt"), timeout=5)
            assert r.status_code == 200 and time.monotonic() - started < 0.5
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        raw.sendall(b"\x16\x03\x01")
        assert raw.recv(10) == b""  # dropped after the deadline, without a thread
    with pytest.raises(ssl.SSLError):
        ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port)), server_hostname="x")


def test_a_big_body_nobody_reads_costs_little(extender_server):
    """gunicorn's unreader copies what it holds beyond each read: handing it a 4 MiB
    request in one piece, then draining the unread body 8 KiB at a time, cost 1.2 s of
    CPU per request. It must cost about what reading it costs."""
    port, master = extender_server
    pids = worker_pids(master)
    session = requests.Session()
    body = b'{"x": "' + b"x" * (4 << 20) + b'"}'
    costs = []
    for _ in range(4):
        before = cpu_ns(pids)
        r = session.post(f"http://127.0.0.1:{port}/nothing-here", data=body, timeout=10)
        assert r.status_code == 404
        time.sleep(0.2)  # what the worker does after answering counts too
        costs.append((cpu_ns(pids) - before) / 1e6)
    # The fault cost 1.2 s a request. Reading costs 25-30 ms here, and one request in
    # a few takes ~55 ms when the machine is busy (seen in CI): the median holds to
    # the reading cost, and no request may come near the fault.
    assert statistics.median(costs) < 50 and max(costs) < 250, costs
