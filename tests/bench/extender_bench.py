"""Extender latency through HTTP against gunicorn, beside the floor of HTTP + JSON.

    .venv/bin/python tests/bench/extender_bench.py [--calls 300] [--sizes 100,500,5000] \
        [--gap-ms 0]

Starts the local control plane, creates 5,000 Node objects (the cluster mode cache
lists and watches them) and a few hundred bound GPU pods, then runs in one process:
  - a bare Flask app that parses the same body and echoes every candidate back in the
    same shape (the floor: HTTP + JSON both ways at the same sizes), twice: on stock
    gunicorn (gthread) and on the extender's own server (gpu_scheduler.serving, which
    reads each request whole before a thread sees it: the slow-client defence), so
    the second floor and ours differ only in the decision,
  - our extender (node names; facts from its cache),
and reports filter and prioritize latency p50/p99 for 100, 500 and 5,000 candidates,
our p50 over each floor's, and the cache's memory
per node at 5,000 nodes (tracemalloc over the same Node objects fed through the
cache's own code).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from extender.cache import ClusterCache  # noqa: E402
from gpu_scheduler import contract  # noqa: E402
from lab.controlplane import start_control_plane  # noqa: E402
from lab.kubelet_shim import node_object  # noqa: E402
from lab.processes import free_port  # noqa: E402
from lab.stack import CLI  # noqa: E402
from tests.factories import make_pod  # noqa: E402

MODELS = [("NVIDIA-H100-80GB-HBM3", 81559), ("NVIDIA-A100-SXM4-40GB", 40960), ("NVIDIA-L4", 23034)]
BARE_APP = """
# The floor: HTTP + JSON both ways at the same sizes (orjson, as the extender uses),
# echoing every candidate back with no decision at all.
import orjson
from flask import Flask, Response, request
app = Flask("bare")
@app.post("/filter")
def filter_():
    names = orjson.loads(request.get_data())["NodeNames"]
    body = {"NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
    return Response(orjson.dumps(body), mimetype="application/json")
@app.post("/filter-first")
def filter_first():  # the floor of a filter that picks: the first candidate alone
    names = orjson.loads(request.get_data())["NodeNames"][:1]
    body = {"NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
    return Response(orjson.dumps(body), mimetype="application/json")
@app.post("/prioritize")
def prioritize():
    names = orjson.loads(request.get_data())["NodeNames"]
    return Response(orjson.dumps([{"Host": n, "Score": 0} for n in names]),
                    mimetype="application/json")
"""
# The same app under the extender's own server (gpu_scheduler.serving: our gunicorn
# worker, the same body limit), so that floor and ours differ only in the decision.
BARE_ON_OUR_SERVER = """
if __name__ == "__main__":
    import sys
    from extender.config import ExtenderConfig
    from gpu_scheduler.serving import serve
    serve(lambda: app, host="127.0.0.1", port=int(sys.argv[1]), workers=1,
          threads=int(sys.argv[2]), max_body=ExtenderConfig().max_body_bytes)
"""
FLOORS = ("bare (names)", "bare, our server")
#: The rows of each size, in the order printed.
MODES = (*FLOORS, "cluster")


def cluster_nodes(count: int) -> list[dict]:
    nodes = []
    for i in range(count):
        product, memory = MODELS[i % len(MODELS)]
        labels = {
            contract.LABEL_GPU_PRESENT: "true",
            contract.LABEL_GPU_COUNT: "8",
            contract.LABEL_GPU_PRODUCT: product,
            contract.LABEL_GPU_MEMORY: str(memory),
            contract.LABEL_ZONE: f"zone-{i % 3}",
            contract.LABEL_EKS_CAPACITY_TYPE: "SPOT" if i % 4 == 0 else "ON_DEMAND",
            "node.kubernetes.io/instance-type": "p5.48xlarge",
            "topology.kubernetes.io/region": "us-east-1",
        }
        nodes.append(node_object(f"node-{i:05d}", labels=labels, gpus=8, cpu="192", memory="2Ti"))
    return nodes


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Client:
    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def post(self, path: str, body: bytes) -> tuple[float, bytes]:
        started = time.perf_counter()
        self.conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = self.conn.getresponse()
        data = response.read()
        elapsed = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"{path}: {response.status} {data[:300]!r}")
        return elapsed, data


def measure_interleaved(
    ports: dict[str, int], body: bytes, calls: int, gap: float = 0.0
) -> dict[str, dict[str, float]]:
    """Filter then prioritize, ``calls`` times, on each server in turn call by call
    (so a drift in the machine's speed falls on all alike), each prioritize sent
    ``gap`` seconds after filter's answer was read (kube-scheduler runs its own
    score plugins there; 0: at once)."""
    clients = {name: Client(port) for name, port in ports.items()}
    for client in clients.values():
        for _ in range(min(20, calls)):  # warm up
            client.post("/filter", body)
            client.post("/prioritize", body)
    filt: dict[str, list[float]] = {name: [] for name in ports}
    prio: dict[str, list[float]] = {name: [] for name in ports}
    for _ in range(calls):
        for name, client in clients.items():
            filt[name].append(client.post("/filter", body)[0])
            if gap:
                time.sleep(gap)
            prio[name].append(client.post("/prioritize", body)[0])
    ms = 1000.0
    return {
        name: {
            "filter_p50": statistics.median(filt[name]) * ms,
            "filter_p99": percentile(filt[name], 0.99) * ms,
            "prio_p50": statistics.median(prio[name]) * ms,
            "prio_p99": percentile(prio[name], 0.99) * ms,
        }
        for name in ports
    }


def wait_ready(port: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"port {port} not ready")


def cache_bytes_per_node(nodes: list[dict], pods: list[dict]) -> float:
    # Serialise and re-parse so the objects are fresh (as off the wire), then measure
    # only what the cache keeps after the raw objects are dropped.
    raw_nodes = json.dumps(nodes)
    raw_pods = json.dumps(pods)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    cache = ClusterCache()
    parsed = json.loads(raw_nodes)
    cache.replace_nodes(parsed)
    del parsed
    parsed_pods = json.loads(raw_pods)
    cache.replace_pods(parsed_pods)
    del parsed_pods
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(cache.view().nodes) == len(nodes)
    return (after - before) / len(nodes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per verb and size")
    parser.add_argument("--sizes", default="100,500,5000")
    parser.add_argument("--nodes", type=int, default=5000, help="nodes in the cluster")
    parser.add_argument("--pods", type=int, default=500, help="bound GPU pods in the cluster")
    parser.add_argument(
        "--threads", type=int, default=4, help="gunicorn threads per worker, all servers"
    )
    parser.add_argument(
        "--gap-ms",
        type=float,
        default=0.0,
        help="pause between filter's answer and prioritize, as kube-scheduler's own "
        "score plugins make (0: prioritize at once)",
    )
    opts = parser.parse_args()
    sizes = [int(s) for s in opts.sizes.split(",")]

    from kubernetes import client as kclient

    from tests.helpers import running

    nodes = cluster_nodes(opts.nodes)
    bound = [
        make_pod(f"run-{i}", 1 + i % 4, node=nodes[(i * 7) % len(nodes)]["metadata"]["name"])
        for i in range(opts.pods)
    ]
    per_node = cache_bytes_per_node(nodes, bound)
    print(f"cache memory per node at {opts.nodes} nodes: {per_node:.0f} bytes", flush=True)

    with tempfile.TemporaryDirectory(prefix="extender-bench-") as tmp:
        work = Path(tmp)
        started = time.monotonic()
        cluster = start_control_plane(work / "cluster")
        try:
            core = kclient.CoreV1Api(cluster.api_client())
            done = [0]
            lock = threading.Lock()

            def create(obj: dict, kind: str) -> None:
                if kind == "node":
                    core.create_node(obj)
                else:
                    obj = {k: v for k, v in obj.items() if k != "status"}
                    core.create_namespaced_pod("default", obj)
                with lock:
                    done[0] += 1
                    if done[0] % 1000 == 0:
                        print(f"  created {done[0]} objects", flush=True)

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda n: create(n, "node"), nodes))
                list(pool.map(lambda p: create(p, "pod"), bound))
            print(
                f"control plane with {len(nodes)} nodes, {len(bound)} pods in "
                f"{time.monotonic() - started:.0f}s",
                flush=True,
            )
            (work / "bare.py").write_text(BARE_APP + BARE_ON_OUR_SERVER)
            ports = {
                "bare": free_port(),
                "bare-ours": free_port(),
                "cluster": free_port(),
            }
            threads = f"--threads={opts.threads}"
            gunicorn = [sys.executable, "-m", "gunicorn", "--workers=1", threads]
            base = [*CLI, "extender", "--host=127.0.0.1", "--workers=1", threads]
            with (
                running(
                    [
                        *gunicorn,
                        f"--bind=127.0.0.1:{ports['bare']}",
                        "--chdir",
                        str(work),
                        "bare:app",
                    ],
                    work / "bare.log",
                ),
                running(
                    [
                        sys.executable,
                        str(work / "bare.py"),
                        str(ports["bare-ours"]),
                        str(opts.threads),
                    ],
                    work / "bare-ours.log",
                    env={"PYTHONPATH": str(ROOT)},
                ),
                running(
                    [
                        *base,
                        f"--port={ports['cluster']}",
                        f"--kubeconfig={cluster.kubeconfig}",
                    ],
                    work / "cluster.log",
                ),
            ):
                for port in ports.values():
                    wait_for_port(port)
                wait_ready(ports["cluster"])
                pod = make_pod("bench", 2, annotations={contract.ANN_SPOT: "prefer"})
                rows = []
                for size in sizes:
                    chosen = nodes[:size]
                    names = [n["metadata"]["name"] for n in chosen]
                    by_names = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()
                    calls = max(30, opts.calls // (10 if size >= 5000 else 1))
                    gap = opts.gap_ms / 1000
                    # the servers in turn, call by call
                    result = measure_interleaved(
                        {
                            "bare (names)": ports["bare"],
                            "bare, our server": ports["bare-ours"],
                            "cluster": ports["cluster"],
                        },
                        by_names,
                        calls,
                        gap,
                    )
                    rows.append((size, len(by_names), result))
                    print(f"  measured {size} candidates", flush=True)
        finally:
            cluster.stop()

    print()
    print(
        f"Extender latency, ms per call (client side, keep-alive, {opts.calls} calls/verb, "
        f"the servers taken in turn call by call; prioritize {opts.gap_ms:g} ms after filter)"
    )
    print(
        "| candidates | mode | body | filter p50 | filter p99 | prioritize p50 | prioritize p99 |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    for size, names_len, result in rows:
        for mode in MODES:
            r = result[mode]
            print(
                f"| {size} | {mode} | {names_len / 1024:.0f} KiB | {r['filter_p50']:.2f} | "
                f"{r['filter_p99']:.2f} | {r['prio_p50']:.2f} | {r['prio_p99']:.2f} |"
            )
    print()
    print(
        "| candidates | floor | cluster/floor p50 filter "
        "| cluster/floor p50 prioritize | cluster/floor p99 filter |"
    )
    print("|---:|---|---:|---:|---:|")
    for size, _, result in rows:
        ours = result["cluster"]
        for floor in FLOORS:
            bare = result[floor]
            filt, prio = (
                ours["filter_p50"] / bare["filter_p50"],
                ours["prio_p50"] / bare["prio_p50"],
            )
            tail = ours["filter_p99"] / bare["filter_p99"]
            print(f"| {size} | {floor} | {filt:.2f}x | {prio:.2f}x | {tail:.2f}x |")
    print()
    print(f"Cache memory per node at {opts.nodes} nodes (+{opts.pods} pods): {per_node:.0f} bytes")
    return 0


def wait_for_port(port: int, timeout: float = 60) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"port {port}")


if __name__ == "__main__":
    sys.exit(main())
