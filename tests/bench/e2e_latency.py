"""What the extender adds to one pod's scheduling, and how much of that is HTTP.

    .venv/bin/python tests/bench/e2e_latency.py [--pods 300]

On the openb trace's cluster (1,523 nodes; ../shared/traces/openb/), the real
kube-scheduler places 1-GPU pods one at a time (each created after the previous one
was seen bound), three ways in one run on one control plane:
  - without:  deploy/'s gpu-scheduler profile with the extender removed;
  - bare:     the same profile with a bare echo extender (Flask + gunicorn + orjson,
              every node passes, every score 0: the HTTP floor, no decision);
  - with:     deploy/'s profile as shipped, our extender (cluster mode).
Prints create-to-binding p50/p90 per variant and our extender's own handler time
(from its log) at the candidate counts kube-scheduler sent.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lab.processes import free_port  # noqa: E402
from lab.stack import bare_stack  # noqa: E402
from tests.bench.extender_bench import BARE_APP  # noqa: E402
from tests.bench.trace import (  # noqa: E402
    Task,
    find_trace_dir,
    load_nodes,
    load_tasks,
    node_manifest,
    pod_manifest,
)
from tests.bench.trace_reports import extender_call_stats, extender_calls  # noqa: E402
from tests.bench.trace_runners import (  # noqa: E402
    NAMESPACE,
    Contender,
    clear_pods,
    scheduler_configs,
)
from tests.helpers import running  # noqa: E402


def place_one_at_a_time(contender: Contender, tasks: list[Task]) -> list[float]:
    core, name, scheduler = contender.core, contender.name, contender.scheduler
    latencies = []
    with contender.watched() as outcomes:
        time.sleep(2)  # informers synced
        for task in tasks:
            manifest = pod_manifest(task, scheduler, ours=True)
            manifest["metadata"]["name"] = f"{name}-{task.name}"
            core.create_namespaced_pod(NAMESPACE, manifest)
            created = time.monotonic()
            kind, _, when = outcomes.wait(manifest["metadata"]["name"], 30)
            if kind != "bound":
                raise RuntimeError(f"{manifest['metadata']['name']}: {kind}")
            latencies.append((when - created) * 1000)
    return latencies


def handler_ms(log: Path, since: int) -> dict[str, tuple[float, float]]:
    """p50 handler ms and p50 candidate count per verb, from the extender's JSON log."""
    stats = extender_call_stats(extender_calls(log.read_text().splitlines()[since:]))
    return {verb: (s["p50_ms"], s["nodes_p50"]) for verb, s in stats.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=300)
    opts = parser.parse_args(argv)

    trace = find_trace_dir()
    nodes = load_nodes(trace / "openb_node_list_all_node.csv")
    tasks = [t for t in load_tasks(trace / "openb_pod_list_default.csv") if t.gpus == 1]
    tasks = tasks[: opts.pods]
    with bare_stack("e2e-latency-") as (stack, core):
        cluster, work = stack.cluster, stack.workdir
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: core.create_node(node_manifest(n)), nodes))
        stack.start_extender()
        ours = f"http://127.0.0.1:{stack.extender_port}"
        (work / "bare.py").write_text(BARE_APP)
        bare_port = free_port()
        bare_cmd = [sys.executable, "-m", "gunicorn", "--workers=1", "--threads=4"]
        bare_cmd += [f"--bind=127.0.0.1:{bare_port}", "--chdir", str(work), "bare:app"]
        results: dict[str, list[float]] = {}
        extender_log = work / "cluster" / "logs" / "extender.log"
        with running(bare_cmd, work / "bare.log"):
            time.sleep(2)
            variants = {
                "without": scheduler_configs(ours)["mostallocated"],
                "bare": scheduler_configs(f"http://127.0.0.1:{bare_port}")["gpu-scheduler"],
                "with": scheduler_configs(ours)["gpu-scheduler"],
            }
            for name, config in variants.items():
                mark = len(extender_log.read_text().splitlines())
                started = time.monotonic()
                contender = Contender(cluster, core, name, config)
                results[name] = place_one_at_a_time(contender, tasks)
                print(f"  {name}: {len(tasks)} pods in {time.monotonic() - started:.0f}s")
                clear_pods(core, stack.extender_port)
        handlers = handler_ms(extender_log, mark)  # the last variant: ours
    print()
    print("| variant | create-to-binding p50 ms | p90 ms | vs without (p50) |")
    print("|---|---:|---:|---:|")
    base = statistics.median(results["without"])
    for name, values in results.items():
        p50 = statistics.median(values)
        p90 = sorted(values)[int(0.9 * (len(values) - 1))]
        print(f"| {name} | {p50:.1f} | {p90:.1f} | +{p50 - base:.1f} |")
    print()
    for verb, (ms, count) in handlers.items():
        print(f"our extender's {verb} handler: p50 {ms:.2f} ms at {count:.0f} candidate nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
