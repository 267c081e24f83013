"""Placement quality on the openb production trace: three schedulers side by side.

    .venv/bin/python tests/bench/trace_replay.py --pods openb_pod_list_default.csv \\
        [--mode fill|replay] [--scale 1.0] [--seed 7] [--speedup 20000] [--write-docs]

Builds the trace's cluster (1,523 nodes, 6,212 GPUs at full scale) as Node objects in
the local control plane, then, in one invocation and on that same cluster, replays the
tasks with each of three kube-schedulers (v1.37.2), one after the other:
  - default:        kube-scheduler's default profile, as shipped;
  - mostallocated:  NodeResourcesFit MostAllocated weighted on nvidia.com/gpu (deploy/'s
                    profile without the extender: the best a user can do without us);
  - gpu-scheduler:  deploy/'s profile with our extender (cluster mode).

fill:   tasks in arrival order, none leaving, each waited for (bound or unschedulable),
        until 50 GPU pods in a row fail; reports the share of the cluster's GPUs
        allocated at the first GPU failure and at the end, and GPU pods that failed
        while enough GPUs were free in total (fragmentation failures).
replay: arrivals and departures in trace order, time divided by --speedup; reports GPU
        allocation over time, pending time of GPU pods (p50/p99), failed pods by size.
        NOT YET VALIDATED: the trace spans ~150 days, so a speedup that replays it in
        minutes compresses most task lifetimes below the scheduling latency and counts
        them as failed (scale 0.05 at 200000x: 300 of 349 GPU pods "failed" under every
        scheduler). It needs a time window or a lifetime floor before its numbers mean
        anything; fill mode is the measured one.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gpu_scheduler.kube import watch_events  # noqa: E402
from gpu_scheduler.localcluster import LocalCluster, start_control_plane  # noqa: E402
from gpu_scheduler.stack import DEFAULT_SCHEDULER_CONFIG, Stack, scheduler_config  # noqa: E402
from tests.bench.trace import (  # noqa: E402
    FillResult,
    Task,
    TraceNode,
    fill_should_stop,
    find_trace_dir,
    load_nodes,
    load_tasks,
    node_manifest,
    pod_manifest,
    sample,
)

NAMESPACE = "default"
SCHEDULERS = ("default", "mostallocated", "gpu-scheduler")


def scheduler_configs(extender_url: str) -> dict[str, dict[str, Any]]:
    ours = scheduler_config(extender_url)
    most = copy.deepcopy(ours)
    most.pop("extenders", None)
    default = copy.deepcopy(DEFAULT_SCHEDULER_CONFIG)
    configs = {"default": default, "mostallocated": most, "gpu-scheduler": ours}
    for name, cfg in configs.items():
        cfg["profiles"][0]["schedulerName"] = f"trace-{name}"
    return configs


class Outcomes:
    """Watches one scheduler's pods; tells when each is bound or found unschedulable."""

    def __init__(self, core: Any, scheduler: str) -> None:
        self.core = core
        self.scheduler = scheduler
        self.state: dict[str, tuple[str, str, float]] = {}  # name -> (kind, detail, when)
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        time.sleep(0.5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for _, pod in watch_events(
                    lambda **kw: self.core.list_namespaced_pod(NAMESPACE, **kw),
                    timeout_seconds=120,
                    field_selector=f"spec.schedulerName={self.scheduler}",
                ):
                    self._see(pod)
                    if self._stop.is_set():
                        return
            except Exception as exc:  # relisting is not needed: waits time out
                print(f"  (watch restarted: {exc!r})", flush=True)

    def _see(self, pod: dict[str, Any]) -> None:
        name = (pod.get("metadata") or {}).get("name")
        if not name:  # a bookmark
            return
        node = pod["spec"].get("nodeName")
        outcome = None
        if node:
            outcome = ("bound", node)
        else:
            for cond in (pod.get("status") or {}).get("conditions") or []:
                if (
                    cond.get("type") == "PodScheduled"
                    and cond.get("status") == "False"
                    and cond.get("reason") == "Unschedulable"
                ):
                    outcome = ("failed", cond.get("message", ""))
        if outcome is not None:
            with self.cond:
                if name not in self.state or self.state[name][0] != outcome[0]:
                    self.state[name] = (*outcome, time.monotonic())
                    self.cond.notify_all()

    def wait(self, name: str, timeout: float) -> tuple[str, str, float]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while name not in self.state:
                left = deadline - time.monotonic()
                if left <= 0:
                    return ("timeout", "", time.monotonic())
                self.cond.wait(left)
            return self.state[name]

    def stop(self) -> None:
        self._stop.set()


def clear_pods(core: Any, extender_port: int | None) -> None:
    core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
    deadline = time.monotonic() + 300
    while core.list_namespaced_pod(NAMESPACE, limit=1).items and time.monotonic() < deadline:
        time.sleep(0.5)
    if extender_port:  # the extender's cache must have seen them go, too
        import json
        import urllib.request

        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{extender_port}/readyz") as r:
                if " 0 pods cached" in json.loads(r.read())["detail"]:
                    return
            time.sleep(0.5)


def run_fill(
    cluster: LocalCluster,
    core: Any,
    name: str,
    config: dict[str, Any],
    tasks: list[Task],
    model_of: dict[str, str],
    total_gpus: int,
) -> FillResult:
    scheduler = f"trace-{name}"
    outcomes = Outcomes(core, scheduler)
    proc = cluster.start_scheduler(f"scheduler-{name}", config)
    result = FillResult(name, total_gpus)
    placed: list[bool] = []
    timings: list[tuple[float, float]] = []
    started = time.monotonic()
    try:
        for i, task in enumerate(tasks):
            t0 = time.monotonic()
            core.create_namespaced_pod(
                NAMESPACE, pod_manifest(task, scheduler, ours=name == "gpu-scheduler")
            )
            t1 = time.monotonic()
            kind, detail, _ = outcomes.wait(task.name, 60)
            timings.append((t1 - t0, time.monotonic() - t1))
            if kind != "bound":
                core.delete_namespaced_pod(task.name, NAMESPACE, grace_period_seconds=0)
            result.record(task, model_of.get(detail) if kind == "bound" else None)
            if task.gpus:
                placed.append(kind == "bound")
                if fill_should_stop(placed):
                    result.stopped_early = True
                    break
            if (i + 1) % 500 == 0:
                print(
                    f"  {name}: {i + 1} tasks, {result.final_share:.1%} of GPUs allocated, "
                    f"{result.gpu_failed} GPU pods failed, {time.monotonic() - started:.0f}s",
                    flush=True,
                )
    finally:
        outcomes.stop()
        cluster.stop_process(proc.name)
    if timings:
        create = statistics.median(t for t, _ in timings) * 1000
        decide = statistics.median(d for _, d in timings) * 1000
        print(f"  {name}: median create {create:.1f} ms, create-to-outcome {decide:.1f} ms")
    return result


def run_replay(
    cluster: LocalCluster,
    core: Any,
    name: str,
    config: dict[str, Any],
    tasks: list[Task],
    total_gpus: int,
    speedup: float,
) -> dict[str, Any]:
    """Arrivals and departures in trace order, time compressed by ``speedup``."""
    scheduler = f"trace-{name}"
    outcomes = Outcomes(core, scheduler)
    proc = cluster.start_scheduler(f"scheduler-{name}", config)
    events: list[tuple[int, int, Task]] = []
    for task in tasks:
        events.append((task.created, 1, task))
        if task.deleted is not None and task.deleted > task.created:
            events.append((task.deleted, 0, task))
    events.sort(key=lambda e: (e[0], e[1]))
    origin = events[0][0] if events else 0
    created_at: dict[str, float] = {}
    live: dict[str, Task] = {}
    failed_by_size: dict[int, int] = {}
    utilisation: list[tuple[float, float]] = []
    start = time.monotonic()
    pool = ThreadPoolExecutor(4)

    def allocated_now() -> int:
        with outcomes.cond:
            bound = {n for n, (k, _, _) in outcomes.state.items() if k == "bound"}
        return sum(t.gpus for n, t in live.items() if n in bound)

    try:
        for at, kind, task in events:
            due = start + (at - origin) / speedup
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if kind == 1:
                created_at[task.name] = time.monotonic()
                live[task.name] = task
                pool.submit(
                    core.create_namespaced_pod,
                    NAMESPACE,
                    pod_manifest(task, scheduler, ours=name == "gpu-scheduler"),
                )
            elif task.name in live:
                state = outcomes.state.get(task.name)
                if task.gpus and (state is None or state[0] != "bound"):
                    failed_by_size[task.gpus] = failed_by_size.get(task.gpus, 0) + 1
                del live[task.name]
                pool.submit(
                    core.delete_namespaced_pod, task.name, NAMESPACE, grace_period_seconds=0
                )
            if not utilisation or time.monotonic() - start - utilisation[-1][0] >= 1:
                utilisation.append((time.monotonic() - start, allocated_now() / total_gpus))
        time.sleep(2)
        for pod_name, task in live.items():
            state = outcomes.state.get(pod_name)
            if task.gpus and (state is None or state[0] != "bound"):
                failed_by_size[task.gpus] = failed_by_size.get(task.gpus, 0) + 1
        gpu_names = {t.name for t in tasks if t.gpus}
        pending = sorted(
            outcomes.state[n][2] - created_at[n]
            for n in created_at
            if n in gpu_names and outcomes.state.get(n, ("",))[0] == "bound"
        )
    finally:
        pool.shutdown(wait=True)
        outcomes.stop()
        cluster.stop_process(proc.name)
    return {
        "scheduler": name,
        "pending_p50": statistics.median(pending) if pending else 0.0,
        "pending_p99": pending[min(len(pending) - 1, round(0.99 * (len(pending) - 1)))]
        if pending
        else 0.0,
        "failed_by_size": failed_by_size,
        "mean_utilisation": statistics.mean(u for _, u in utilisation) if utilisation else 0.0,
        "utilisation": utilisation,
    }


def fill_table(results: list[FillResult]) -> str:
    head = "| | " + " | ".join(r.scheduler for r in results) + " |"
    rows = [head, "|---|" + "---:|" * len(results)]

    def row(label: str, values: list[str]) -> None:
        rows.append(f"| {label} | " + " | ".join(values) + " |")

    row(
        "GPUs allocated at first GPU failure",
        [
            f"{r.first_failure_share:.1%}" if r.first_failure_share is not None else "none failed"
            for r in results
        ],
    )
    row("GPUs allocated at the end", [f"{r.final_share:.1%}" for r in results])
    row("tasks submitted", [str(r.submitted) for r in results])
    row(
        "GPU pods placed / submitted",
        [f"{r.gpu_pods - r.gpu_failed} / {r.gpu_pods}" for r in results],
    )
    row("fragmentation failures", [str(r.fragmentation_failures) for r in results])
    row(
        "failed GPU pods by size (1/2/4/8)",
        ["/".join(str(r.failed_by_size.get(s, 0)) for s in (1, 2, 4, 8)) for r in results],
    )
    row("model-constraint violations", [str(r.constraint_violations) for r in results])
    return "\n".join(rows)


def plot_fill(results: list[FillResult], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for r in results:
        xs = [x for x, _ in r.curve]
        ys = [100 * y for _, y in r.curve]
        ax.plot(xs, ys, label=r.scheduler, linewidth=1.6)
        if r.first_failure_share is not None:
            first = next((x for x, y in r.curve if abs(y - r.first_failure_share) < 1e-12), None)
            if first is not None:
                ax.scatter([first], [100 * r.first_failure_share], s=18)
    ax.set_xlabel("pods submitted (arrival order)")
    ax.set_ylabel("cluster GPUs allocated (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def write_docs(section: str, key: str) -> None:
    docs = ROOT / "docs" / "BENCHMARKS.md"
    text = docs.read_text()
    begin, end = f"<!-- trace:{key} -->", f"<!-- /trace:{key} -->"
    block = f"{begin}\n{section.strip()}\n{end}"
    if begin in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        anchor = "## Placement quality on the openb trace"
        if anchor not in text:
            text = text.rstrip() + f"\n\n{anchor}\n"
        text = text.rstrip() + "\n\n" + block + "\n"
    docs.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", default="openb_pod_list_default.csv", help="trace task file")
    parser.add_argument("--nodes", default="openb_node_list_all_node.csv", help="trace node file")
    parser.add_argument("--mode", choices=("fill", "replay"), default="fill")
    parser.add_argument("--scale", type=float, default=1.0, help="sample nodes and tasks")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--speedup", type=float, default=20000.0, help="replay time divisor")
    parser.add_argument("--schedulers", default=",".join(SCHEDULERS))
    parser.add_argument("--write-docs", action="store_true", help="table + plot into docs/")
    opts = parser.parse_args(argv)
    results = run(opts)
    return 0 if results else 1


def run(opts: argparse.Namespace) -> list[Any]:
    from kubernetes import client

    trace = find_trace_dir()
    nodes: list[TraceNode] = sample(
        load_nodes(trace / opts.nodes), opts.scale, opts.seed, key=lambda n: n.model
    )
    tasks: list[Task] = sample(load_tasks(trace / opts.pods), opts.scale, opts.seed)
    total_gpus = sum(n.gpus for n in nodes)
    model_of = {n.name: n.model for n in nodes if n.gpus}
    names = [s for s in opts.schedulers.split(",") if s]
    print(
        f"{opts.pods}: {len(nodes)} nodes ({total_gpus} GPUs), {len(tasks)} tasks "
        f"({sum(1 for t in tasks if t.gpus)} GPU), mode {opts.mode}, scale {opts.scale}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="trace-replay-") as tmp:
        work = Path(tmp)
        cluster = start_control_plane(work / "cluster")
        stack = Stack(cluster, work)
        results: list[Any] = []
        try:
            stack.api = cluster.api_client()
            core = client.CoreV1Api(stack.api)
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda n: core.create_node(node_manifest(n)), nodes))
            stack.start_extender()
            configs = scheduler_configs(f"http://127.0.0.1:{stack.extender_port}")
            for name in names:
                started = time.monotonic()
                if opts.mode == "fill":
                    result = run_fill(
                        cluster, core, name, configs[name], tasks, model_of, total_gpus
                    )
                    print(
                        f"  {name}: first failure at {result.first_failure_share or 0:.1%}, "
                        f"end {result.final_share:.1%}, {time.monotonic() - started:.0f}s",
                        flush=True,
                    )
                else:
                    result = run_replay(
                        cluster, core, name, configs[name], tasks, total_gpus, opts.speedup
                    )
                    print(f"  {name}: mean GPU allocation {result['mean_utilisation']:.1%}")
                results.append(result)
                clear_pods(core, stack.extender_port)
        finally:
            stack.stop()
    stem = Path(opts.pods).stem.replace("openb_pod_list_", "")
    if opts.mode == "fill":
        table = fill_table(results)
        print()
        print(table)
        if opts.write_docs:
            png = ROOT / "docs" / f"trace-fill-{stem}.png"
            plot_fill(results, f"openb {stem}, fill mode, scale {opts.scale}", png)
            command = (
                f"python tests/bench/trace_replay.py --pods {opts.pods} --mode fill "
                f"--scale {opts.scale} --seed {opts.seed} --write-docs"
            )
            write_docs(
                f"### {stem}, fill, scale {opts.scale}\n\n```sh\n{command}\n```\n\n"
                f"{len(nodes)} nodes, {total_gpus} GPUs, {len(tasks)} tasks; "
                f"run {time.strftime('%Y-%m-%d %H:%M')}.\n\n{table}\n\n"
                f"![GPU allocation against pods submitted]({png.name})\n",
                f"fill-{stem}",
            )
    else:
        print()
        print("| scheduler | mean GPU allocation | GPU pending p50 s | p99 s | failed 1/2/4/8 |")
        print("|---|---:|---:|---:|---|")
        for r in results:
            sizes = "/".join(str(r["failed_by_size"].get(s, 0)) for s in (1, 2, 4, 8))
            print(
                f"| {r['scheduler']} | {r['mean_utilisation']:.1%} | {r['pending_p50']:.2f} | "
                f"{r['pending_p99']:.2f} | {sizes} |"
            )
    return results


if __name__ == "__main__":
    sys.exit(main())
