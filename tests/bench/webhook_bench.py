"""Webhook latency and throughput over TLS, side by side with a bare Flask+gunicorn app
and with the webhook whose node-affinity writing is off.

Starts, on 127.0.0.1 only, ``gpu-scheduler webhook`` and a bare Flask app under the
same gunicorn settings (workers, threads, TLS 1.2+, the same certificate) that reads
the body and returns a fixed tiny JSON. Clients hold keep-alive HTTPS connections
(verifying the chain and the Service DNS name) and POST a GPU pod's AdmissionReview.

* closed loop at concurrency 1, 16, 64: p50/p99 latency and requests/s, each level
  bounded by a request count and a time budget;
* paced at 100 requests/s on one connection: p50/p99/max; a request queued behind a
  slow answer counts its wait from the scheduled send time (no coordinated omission).

    .venv/bin/python tests/bench/webhook_bench.py [--requests 4000] [--seconds 8]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SERVICE, NAMESPACE = "gpu-scheduler-webhook", "gpu-scheduler"
HOSTNAME = f"{SERVICE}.{NAMESPACE}.svc"


def review_body() -> bytes:
    from tests.factories import admission_review

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "train-",
            "namespace": "ml",
            "labels": {"app": "train", "job": "llama-ft"},
            "annotations": {
                "gpu-scheduler.io/min-gpu-memory": "80G",
                "gpu-scheduler.io/gpu-products": "NVIDIA-H100-80GB-HBM3,NVIDIA-H200",
                "gpu-scheduler.io/spot": "forbid",
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "command": ["torchrun", "--nproc-per-node", "4", "train.py"],
                    "env": [{"name": f"VAR_{i}", "value": "x" * 20} for i in range(10)],
                    "resources": {
                        "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"},
                        "limits": {"memory": "64Gi", "nvidia.com/gpu": "4"},
                    },
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "initContainers": [{"name": "fetch", "image": "busybox", "command": ["true"]}],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
        },
    }
    review = admission_review(
        pod, namespace="ml", userInfo={"username": "alice", "groups": ["system:authenticated"]}
    )
    return json.dumps(review).encode()


# --- the bare app (run by this script as a server) ----------------------------------


def serve_bare(args: argparse.Namespace) -> int:
    from flask import Flask, Response, request

    from gpu_scheduler.serving import serve

    def factory() -> Flask:
        app = Flask("bare")
        tiny = b'{"ok":true}'

        @app.post("/mutate")
        def mutate() -> Response:
            request.get_data()
            return Response(tiny, mimetype="application/json")

        @app.get("/healthz")
        def healthz() -> Response:
            return Response(tiny, mimetype="application/json")

        return app

    def tls12(config: Any, default_factory: Any) -> ssl.SSLContext:
        ctx = default_factory()
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx

    cert_dir = Path(args.cert_dir)
    serve(
        factory,
        host="127.0.0.1",
        port=args.port,
        workers=args.workers,
        threads=args.threads,
        max_body=8 << 20,
        certfile=str(cert_dir / "tls.crt"),
        keyfile=str(cert_dir / "tls.key"),
        ssl_context=tls12,
    )
    return 0


# --- client -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Target:
    def __init__(self, name: str, port: int, ca: Path) -> None:
        self.name, self.port = name, port
        self.ctx = ssl.create_default_context(cafile=str(ca))

    def connect(self) -> http.client.HTTPSConnection:
        conn = http.client.HTTPSConnection(HOSTNAME, self.port, context=self.ctx, timeout=10)
        # Resolve the Service name to 127.0.0.1 while verifying against it (SNI + SAN).
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as http.client does
        conn.sock = self.ctx.wrap_socket(raw, server_hostname=HOSTNAME)
        return conn


HEADERS = {"Content-Type": "application/json", "Connection": "keep-alive"}


def one(conn: http.client.HTTPSConnection, body: bytes) -> None:
    conn.request("POST", "/mutate", body, HEADERS)
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")


def closed_loop(target: Target, body: bytes, concurrency: int, total: int, seconds: float):
    latencies: list[float] = []
    lock = threading.Lock()
    remaining = [total]
    barrier = threading.Barrier(concurrency + 1)
    deadline = [0.0]
    errors: list[str] = []

    def worker() -> None:
        conn = target.connect()
        one(conn, body)  # warm the connection (TLS handshake, first request)
        mine: list[float] = []
        barrier.wait()
        try:
            while time.perf_counter() < deadline[0]:
                with lock:
                    if remaining[0] <= 0:
                        break
                    remaining[0] -= 1
                t0 = time.perf_counter()
                one(conn, body)
                mine.append(time.perf_counter() - t0)
        except Exception as exc:
            errors.append(repr(exc))
        finally:
            conn.close()
            with lock:
                latencies.extend(mine)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    deadline[0] = time.perf_counter() + seconds + 30  # provisional, before the start
    barrier.wait()
    start = time.perf_counter()
    deadline[0] = start + seconds
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{target.name}: {len(errors)} client errors, first: {errors[0]}")
    return summarize(latencies, elapsed)


def paced(target: Target, body: bytes, rate: float, seconds: float):
    conn = target.connect()
    for _ in range(20):
        one(conn, body)
    n = int(rate * seconds)
    interval = 1.0 / rate
    latencies: list[float] = []
    late = 0
    start = prev_end = time.perf_counter()
    for i in range(n):
        scheduled = start + i * interval
        now = time.perf_counter()
        if now < scheduled:
            time.sleep(scheduled - now)
        t0 = time.perf_counter()
        # Queued behind a slow previous answer: count from the scheduled time (no
        # coordinated omission). Merely woken late by the OS: count from the send.
        ref = scheduled if prev_end > scheduled else t0
        late += prev_end > scheduled
        one(conn, body)
        prev_end = time.perf_counter()
        latencies.append(prev_end - ref)
    elapsed = time.perf_counter() - start
    conn.close()
    out = summarize(latencies, elapsed)
    out["late"] = late
    return out


def summarize(latencies: list[float], elapsed: float) -> dict[str, float]:
    lat = sorted(latencies)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000

    return {
        "n": len(lat),
        "rps": len(lat) / elapsed if elapsed else 0.0,
        "p50": pct(0.50),
        "p99": pct(0.99),
        "max": lat[-1] * 1000,
        "mean": statistics.fmean(lat) * 1000,
    }


def wait_up(target: Target, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{target.name} exited:\n{log.read_text()[-3000:]}")
        try:
            conn = target.connect()
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                conn.close()
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{target.name} did not come up:\n{log.read_text()[-3000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000, help="per level (default 4000)")
    parser.add_argument("--seconds", type=float, default=8.0, help="per level (default 8)")
    parser.add_argument("--levels", default="1,16,64")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--paced-seconds", type=float, default=10.0)
    parser.add_argument(
        "--webhook-log-level", default="INFO", help="INFO logs one JSON line per review"
    )
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cert-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        return serve_bare(args)

    from certs.build import service_identity
    from certs.store import generate
    from tests.helpers import webhook_command

    levels = [int(x) for x in args.levels.split(",")]
    body = review_body()
    with tempfile.TemporaryDirectory(prefix="webhook-bench-") as tmp:
        tmpdir = Path(tmp)
        generate(tmpdir / "certs", service_identity(SERVICE, NAMESPACE, ["127.0.0.1"]))
        ca = tmpdir / "certs" / "ca.crt"
        common = ["--workers", str(args.workers), "--threads", str(args.threads)]
        wport, bport, oport = free_port(), free_port(), free_port()
        off_config = tmpdir / "affinity-off.yaml"
        off_config.write_text("nodeAffinity: {enabled: false}\n")

        def webhook(port: int, *extra: str) -> list[str]:
            certs, level = tmpdir / "certs", args.webhook_log_level
            return webhook_command(port, certs, *extra, *common, log_level=level)

        cmds = {
            "webhook": webhook(wport),
            "webhook-affinity-off": webhook(oport, "--config", str(off_config)),
            "bare": [
                sys.executable,
                __file__,
                "--serve-bare",
                "--port",
                str(bport),
                "--cert-dir",
                str(tmpdir / "certs"),
                *common,
            ],
        }
        targets = {
            "webhook": Target("webhook", wport, ca),
            "webhook-affinity-off": Target("webhook-affinity-off", oport, ca),
            "bare": Target("bare", bport, ca),
        }
        servers = ("bare", "webhook-affinity-off", "webhook")
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for name, cmd in cmds.items():
                log = tmpdir / f"{name}.log"
                procs[name] = subprocess.Popen(
                    cmd,
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=open(log, "wb"),  # noqa: SIM115
                    start_new_session=True,
                )
                wait_up(targets[name], procs[name], log)
            print(
                f"# {os.cpu_count()} CPUs, gunicorn gthread {args.workers} workers x "
                f"{args.threads} threads, TLS (ECDSA P-256), keep-alive, body {len(body)} B"
            )
            print("| load | server | requests | req/s | p50 ms | p99 ms | max ms |")
            print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
            results: dict[tuple[str, str], dict[str, float]] = {}
            for c in levels:
                for name in servers:  # alternate: drift hits all alike
                    r = closed_loop(targets[name], body, c, args.requests, args.seconds)
                    results[(f"c={c}", name)] = r
                    row(f"concurrency {c}", name, r)
            for name in servers:
                r = paced(targets[name], body, args.rate, args.paced_seconds)
                results[("paced", name)] = r
                row(f"paced {args.rate:g}/s", name, r, late=int(r["late"]))
            loads = [f"c={c}" for c in levels] + ["paced"]
            ratios(results, loads, "webhook", "bare", "webhook/bare")
            ratios(results, loads, "webhook", "webhook-affinity-off", "affinity on/off")
            p99 = results[("paced", "webhook")]["p99"]
            verdict = "meets" if p99 <= 3.0 else "misses"
            print(f"\nwebhook p99 at {args.rate:g} req/s: {p99:.2f} ms ({verdict} the 3 ms target)")
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(15)
                    except subprocess.TimeoutExpired:
                        proc.kill()
    return 0


def ratios(results: dict, loads: list[str], top: str, bottom: str, title: str) -> None:
    print()
    print(f"| load | {title} req/s | {title} p50 | {title} p99 |")
    print("| --- | ---: | ---: | ---: |")
    for load in loads:
        a, b = results[(load, top)], results[(load, bottom)]
        print(
            f"| {load} | {a['rps'] / b['rps']:.2f} | {a['p50'] / b['p50']:.2f} "
            f"| {a['p99'] / b['p99']:.2f} |"
        )


def row(load: str, name: str, r: dict[str, float], late: int | None = None) -> None:
    extra = f" ({late} late)" if late else ""
    print(
        f"| {load} | {name}{extra} | {int(r['n'])} | {r['rps']:.0f} | {r['p50']:.2f} "
        f"| {r['p99']:.2f} | {r['max']:.2f} |",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
