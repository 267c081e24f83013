"""Legitimate latency with and without slow clients holding connections, both servers.

For the extender (its cache listed from a fake API holding the 20 nodes,
tests/fakeapi.py) and the webhook (TLS), started as deployed (extender: 1 worker, 4
threads; webhook: 2 workers, 4 threads), in one run:

1. ``--requests`` legitimate calls one after another on a keep-alive connection
   (a 20-node /filter; a GPU pod's AdmissionReview): p50/p99/max, without anything
   else connected;
2. the same with ``--slow`` (64) slow connections held open throughout: a third send
   a partial request head a byte at a time, a third a head and a stalled body, a
   third (webhook) a TLS record cut short or (extender) nothing at all after
   connecting. Each is re-opened as soon as the server closes it, so 64 stay open;
3. without again (the order would otherwise flatter whichever ran first).

``--compare-gthread`` repeats it with gunicorn's stock ``gthread`` worker, the one the
servers used before, whose threads read requests themselves.

    .venv/bin/python tests/bench/slow_clients.py [--requests 2000] [--slow 64] \
        [--compare-gthread]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.factories import make_node, make_pod  # noqa: E402
from tests.fuzz.servers import review_body  # noqa: E402
from tests.helpers import free_port, running, wait_for  # noqa: E402

SERVICE = "gpu-scheduler-webhook.gpu-scheduler.svc"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class SlowCrowd:
    """``count`` slow connections kept open until :meth:`stop`."""

    def __init__(self, port: int, count: int, tls: bool) -> None:
        self.port, self.count, self.tls = port, count, tls
        self.stop_event = threading.Event()
        self.opened = 0
        self.threads = [
            threading.Thread(target=self._hold, args=(i % 3,), daemon=True) for i in range(count)
        ]

    def start(self) -> SlowCrowd:
        for thread in self.threads:
            thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(5)

    def _hold(self, kind: int) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        while not self.stop_event.is_set():
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            except OSError:
                time.sleep(0.1)
                continue
            self.opened += 1
            try:
                self._trickle(sock, kind, ctx)
            except OSError:
                pass
            finally:
                sock.close()

    def _trickle(self, sock: socket.socket, kind: int, ctx: ssl.SSLContext) -> None:
        if kind == 2 and self.tls:
            sock.sendall(b"\x16\x03\x01\x02\x00\x01")  # a TLS record cut short
        elif self.tls:
            sock = ctx.wrap_socket(sock, server_hostname=SERVICE)
        head = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
        if kind == 1:
            sock.sendall(head + b"{")  # a stalled body
        sock.settimeout(1.0)
        i = 0
        while not self.stop_event.is_set():
            if kind == 0:
                sock.sendall(head[i % len(head) : i % len(head) + 1])  # a head, a byte a second
                i += 1
            try:
                if sock.recv(4096) == b"":
                    return  # the server closed it: open another
            except (TimeoutError, ssl.SSLWantReadError):
                continue


def measure(post: Any, count: int, timeout: float, seconds: float = 0) -> dict[str, float]:
    """``count`` calls, and more until ``seconds`` have passed."""
    latencies, failures = [], 0
    until = time.monotonic() + seconds
    done = 0
    while done < count or time.monotonic() < until:
        done += 1
        started = time.perf_counter()
        try:
            post(timeout)
        except (OSError, http.client.HTTPException):
            failures += 1
            continue
        latencies.append(time.perf_counter() - started)
    if not latencies:
        nan = float("nan")
        return {"p50": nan, "p99": nan, "max": nan, "fail": failures, "n": done}
    return {
        "n": done,
        "p50": statistics.median(latencies) * 1000,
        "p99": percentile(latencies, 0.99) * 1000,
        "max": max(latencies) * 1000,
        "fail": failures,
    }


class Client:
    """One keep-alive connection, re-opened after a failure."""

    def __init__(self, port: int, path: str, body: bytes, ca: str | None) -> None:
        self.port, self.path, self.body, self.ca = port, path, body, ca
        self.conn: http.client.HTTPConnection | None = None

    def __call__(self, timeout: float) -> None:
        if self.conn is None:
            if self.ca:
                ctx = ssl.create_default_context(cafile=self.ca)
                ctx.check_hostname = False
                self.conn = http.client.HTTPSConnection(
                    "127.0.0.1", self.port, context=ctx, timeout=timeout
                )
            else:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            self.conn.request("POST", self.path, self.body, {"Content-Type": "application/json"})
            response = self.conn.getresponse()
            response.read()
            if response.status != 200:
                raise http.client.HTTPException(f"status {response.status}")
        except Exception:
            self.conn.close()
            self.conn = None
            raise


@contextlib.contextmanager
def server(kind: str, worker: str, work: Path) -> Any:
    """(port, CA file or None) of a server started as deployed, with ``worker``."""
    port = free_port()
    runner = [sys.executable, __file__, "--serve", kind, "--worker", worker, "--port", str(port)]
    ca = None
    if kind == "webhook":
        from certs import build, store

        cert_dir = work / "certs"
        identity = build.service_identity("gpu-scheduler-webhook", "gpu-scheduler", ["127.0.0.1"])
        store.generate(cert_dir, identity)
        runner += ["--cert-dir", str(cert_dir)]
        ca = str(cert_dir / store.CA_CERT)
    log = work / f"{kind}-{worker}.log"
    with running(runner, log):
        scheme = "https" if ca else "http"
        ctx = ssl.create_default_context(cafile=ca) if ca else None
        if ctx:
            ctx.check_hostname = False

        def up() -> bool:
            import urllib.request

            with urllib.request.urlopen(
                f"{scheme}://127.0.0.1:{port}/healthz", timeout=1, context=ctx
            ) as r:
                return r.status == 200

        wait_for(up, 60, f"{kind} ({worker})", interval=0.2)
        yield port, ca


def bench_nodes() -> list[dict[str, Any]]:
    """The extender's cluster: 20 nodes of 8 GPUs, no pods."""
    h100 = {"product": "NVIDIA-H100-80GB-HBM3", "memory_mib": 81559}
    return [make_node(f"n{i}", 8, **h100) for i in range(20)]


def serve_main(kind: str, worker: str, port: int, cert_dir: str | None) -> None:
    """The server process: ours, or the same with gunicorn's gthread worker."""
    from gpu_scheduler.serving import serve

    options: dict[str, Any] = {} if worker == "buffering" else {"worker_class": "gthread"}
    if kind == "extender":
        from extender.app import create_app
        from tests.fakeapi import synced_cache

        serve(
            lambda: create_app(cache=synced_cache(bench_nodes())),
            host="127.0.0.1",
            port=port,
            workers=1,
            threads=4,
            max_body=128 << 20,
            **options,
        )
    else:
        from gpu_scheduler.tls import CertReloader
        from webhook.app import create_app

        reloader = CertReloader(cert_dir or "", 10)
        serve(
            lambda: create_app(ready=reloader.ready),
            host="127.0.0.1",
            port=port,
            workers=2,
            threads=4,
            max_body=8 << 20,
            certfile=reloader.cert_file,
            keyfile=reloader.key_file,
            ssl_context=reloader.hook(),
            **options,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--slow", type=int, default=64)
    parser.add_argument("--compare-gthread", action="store_true")
    parser.add_argument(
        "--crowd-seconds",
        type=float,
        default=15,
        help="keep measuring with the slow clients at least this long (beyond the "
        "servers' 10s request deadline, so they are closed and re-opened meanwhile)",
    )
    parser.add_argument("--serve", choices=("extender", "webhook"), help=argparse.SUPPRESS)
    parser.add_argument("--worker", default="buffering", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cert-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_main(args.serve, args.worker, args.port, args.cert_dir)
        return 0
    names = [n["metadata"]["name"] for n in bench_nodes()]
    bodies = {
        "extender": ("/filter", json.dumps({"Pod": make_pod(gpus=2), "NodeNames": names})),
        "webhook": ("/mutate", json.dumps(review_body())),
    }
    workers = ["buffering", "gthread"] if args.compare_gthread else ["buffering"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="slow-") as tmp:
        for kind, (path, body) in bodies.items():
            for worker in workers:
                with server(kind, worker, Path(tmp)) as (port, ca):
                    client = Client(port, path, body.encode(), ca)
                    count = args.requests if worker == "buffering" else min(args.requests, 100)
                    measure(client, 50, 5)  # warm up
                    quiet1 = measure(client, count // 2, 5)
                    crowd = SlowCrowd(port, args.slow, ca is not None).start()
                    time.sleep(1.5)
                    crowded = measure(
                        client, count, 5 if worker == "buffering" else 2, args.crowd_seconds
                    )
                    crowd.stop()
                    quiet2 = measure(client, count // 2, 5)
                    quiet = {
                        "p50": (quiet1["p50"] + quiet2["p50"]) / 2,
                        "p99": max(quiet1["p99"], quiet2["p99"]),
                        "fail": quiet1["fail"] + quiet2["fail"],
                    }
                    rows.append((kind, worker, quiet, crowded, crowd.opened))
    print(
        f"| server | worker | p50 / p99 without (ms) | p50 / p99 / max with {args.slow} "
        "slow (ms) | requests / failed with | p99 ratio | slow connections opened |"
    )
    print("|---|---|---|---|---:|---:|---:|")
    for kind, worker, quiet, crowded, opened in rows:
        ratio = crowded["p99"] / quiet["p99"] if quiet["p99"] else float("nan")
        print(
            f"| {kind} | {worker} | {quiet['p50']:.2f} / {quiet['p99']:.2f} | "
            f"{crowded['p50']:.2f} / {crowded['p99']:.2f} / {crowded['max']:.1f} | "
            f"{crowded['n']} / {crowded['fail']} | {ratio:.2f} | {opened} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
