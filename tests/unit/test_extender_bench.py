"""The extender bench's client: the servers are taken in turn call by call, and
prioritize follows filter's answer after the gap asked for."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.bench.extender_bench import measure_interleaved


def test_servers_are_measured_call_by_call_in_turn_with_the_gap():
    seen: list[tuple[str, str, float]] = []

    def server(name: str) -> ThreadingHTTPServer:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                seen.append((name, self.path, time.monotonic()))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"[]")

            def log_message(self, *args: object) -> None:
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        return httpd

    a, b = server("a"), server("b")
    try:
        ports = {"a": a.server_address[1], "b": b.server_address[1]}
        result = measure_interleaved(ports, b"{}", calls=3, gap=0.02)
    finally:
        a.shutdown()
        b.shutdown()
    assert set(result) == {"a", "b"} and result["a"]["prio_p50"] > 0
    measured = seen[-12:]  # after each server's warm-up (3 pairs each)
    assert [(n, p) for n, p, _ in measured[:4]] == [
        ("a", "/filter"),
        ("a", "/prioritize"),
        ("b", "/filter"),
        ("b", "/prioritize"),
    ]
    gaps = [later[2] - first[2] for first, later in zip(measured[::2], measured[1::2], strict=True)]
    assert all(gap >= 0.02 for gap in gaps)


def test_the_decision_costs_bench_prints_a_row_per_size(capsys):
    from tests.bench.decision_costs import main

    assert main(["--nodes", "40", "--sizes", "8,40"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line[:3] in ("| 8", "| 4")]
    assert [r.split(" | ")[0] for r in rows] == ["| 8", "| 40"]
    assert all(float(cell) > 0 for r in rows for cell in r.strip("| ").split(" | ")[1:])
