"""Our extender from several checkouts, side by side, call by call, on one cluster:
what a mechanism costs, measured by removing it in one tree and keeping it in another.

    git worktree add --detach /tmp/without-x HEAD   # ...and remove x there
    .venv/bin/python tests/bench/ab_extender.py --tree without-x=/tmp/without-x \
        [--tree NAME=DIR ...] [--against NAME] [--calls 300] [--sizes 500,5000] \
        [--nodes 5000] [--churn 20]

One control plane with ``--nodes`` GPU nodes and bound GPU pods (as
``extender_bench.py`` makes them), this checkout's extender (``head``) and one per
``--tree``, all in cluster mode with one worker as deploy/ runs them. For each size,
each extender in turn, call by call (a drift in the machine's speed falls on all
alike), is asked:

- ``pick``: filter for a pod with no preferences, which the filter answers with the
  node it picks (one round trip: most pods, as shipped);
- ``prefer``: filter then prioritize for a pod that prefers spot capacity (the filter
  passes every node; kube-scheduler asks prioritize).

Meanwhile ``--churn`` GPU pods a second are bound (created with their node set) and
deleted again, 50 alive at a time, as kube-scheduler's bindings and finished pods
change the cluster: every extender's watches deliver them, its cache and views change
between calls, and its request threads share the interpreter with its watch threads,
as in a busy cluster. Prints p50/p99 per verb and each tree's p50 over ``--against``'s
(``head``: this checkout).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gpu_scheduler import contract  # noqa: E402
from lab.processes import free_port  # noqa: E402
from lab.stack import bare_stack  # noqa: E402
from tests.bench.extender_bench import Client, cluster_nodes, percentile  # noqa: E402
from tests.factories import make_pod  # noqa: E402

VERBS = ("pick filter", "prefer filter", "prefer prioritize")


def trees(specs: list[str]) -> dict[str, Path]:
    out = {"head": ROOT}
    for spec in specs:
        name, _, path = spec.partition("=")
        tree = Path(path).resolve()
        if not name or not (tree / "gpu_scheduler" / "cli.py").is_file():
            raise SystemExit(f"--tree {spec}: want NAME=DIR, DIR a checkout of this project")
        out[name] = tree
    return out


def churn(core, names: list[str], rate: float, stop: threading.Event) -> None:
    """Bind a 1-GPU pod to one of ``names`` and delete the oldest past 50, ``rate``
    times a second, until ``stop``."""
    alive: deque[str] = deque()
    i = 0
    while not stop.wait(1.0 / rate):
        pod = make_pod(f"churn-{i}", 1, node=names[(i * 13) % len(names)])
        core.create_namespaced_pod("default", {k: v for k, v in pod.items() if k != "status"})
        alive.append(pod["metadata"]["name"])
        if len(alive) > 50:
            core.delete_namespaced_pod(alive.popleft(), "default", grace_period_seconds=0)
        i += 1


def measure(ports: dict[str, int], bodies: dict[str, bytes], calls: int) -> dict:
    clients = {name: Client(port) for name, port in ports.items()}
    times: dict[str, dict[str, list[float]]] = {n: {v: [] for v in VERBS} for n in ports}
    for round_ in range(calls + 10):  # the first 10: warm-up
        for name, client in clients.items():
            took = (
                client.post("/filter", bodies["pick"])[0],
                client.post("/filter", bodies["prefer"])[0],
                client.post("/prioritize", bodies["prefer"])[0],
            )
            if round_ >= 10:
                for verb, t in zip(VERBS, took, strict=True):
                    times[name][verb].append(t * 1000)
    return {
        name: {v: (statistics.median(t), percentile(t, 0.99)) for v, t in verbs.items()}
        for name, verbs in times.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], help="NAME=DIR, repeatable")
    parser.add_argument("--calls", type=int, default=300, help="calls per verb at 500")
    parser.add_argument("--sizes", default="500,5000")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--churn", type=float, default=20, help="bindings a second (0: none)")
    parser.add_argument("--against", default="head", help="the tree the ratios divide by")
    opts = parser.parse_args()
    checkouts = trees(opts.tree)
    sizes = [int(s) for s in opts.sizes.split(",")]
    nodes = cluster_nodes(opts.nodes)
    bound = [
        make_pod(f"run-{i}", 1 + i % 4, node=nodes[(i * 7) % len(nodes)]["metadata"]["name"])
        for i in range(opts.pods)
    ]
    rows = []
    with bare_stack("ab-extender-") as (stack, core):
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(core.create_node, nodes))
            strip = ({k: v for k, v in p.items() if k != "status"} for p in bound)
            list(pool.map(lambda p: core.create_namespaced_pod("default", p), strip))
        print(f"{len(nodes)} nodes, {len(bound)} pods in {time.monotonic() - started:.0f}s")
        ports = {name: free_port() for name in checkouts}
        for name, tree in checkouts.items():
            ops = free_port()
            stack.spawn_extender(
                f"extender-{name}", ports[name], extra=[f"--ops-port={ops}"], ops_port=ops,
                tree=tree,
            )  # fmt: skip
        stop = threading.Event()
        every = [n["metadata"]["name"] for n in nodes]
        if opts.churn > 0:
            threading.Thread(
                target=churn, args=(core, every, opts.churn, stop), daemon=True
            ).start()
        for size in sizes:
            names = every[:size]
            bodies = {
                kind: json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()
                for kind, pod in (
                    ("pick", make_pod("bench-pick", 2)),
                    ("prefer", make_pod("bench", 2, annotations={contract.ANN_SPOT: "prefer"})),
                )
            }
            calls = max(30, opts.calls // (10 if size >= 5000 else 1))
            rows.append((size, calls, measure(ports, bodies, calls)))
            print(f"  measured {size} candidates", flush=True)
        stop.set()
    print("\n| candidates | tree | " + " | ".join(f"{v} p50 / p99 ms" for v in VERBS) + " |")
    print("|---:|---|" + "---:|" * len(VERBS))
    for size, _, result in rows:
        for name, verbs in result.items():
            cells = " | ".join(f"{verbs[v][0]:.2f} / {verbs[v][1]:.2f}" for v in VERBS)
            print(f"| {size} | {name} | {cells} |")
    against = opts.against
    print("\n| candidates | tree | " + " | ".join(f"{v} p50 ÷ {against}" for v in VERBS) + " |")
    print("|---:|---|" + "---:|" * len(VERBS))
    for size, calls, result in rows:
        head = result[against]
        for name, verbs in result.items():
            if name != against:
                cells = " | ".join(f"{verbs[v][0] / head[v][0]:.2f}" for v in VERBS)
                print(f"| {size} | {name} | {cells} |")
        print(f"| {size} | ({calls} calls each) |" + " |" * len(VERBS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
