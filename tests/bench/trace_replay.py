"""Placement quality on the openb production trace: three schedulers side by side.

    .venv/bin/python tests/bench/trace_replay.py --pods openb_pod_list_default.csv \\
        [--mode fill|replay|sample] [--scale 1.0] [--seed 7] [--write-docs]
        [--compress 5000] [--speedup 2] [--patience 120]    # replay only
        [--seeds 42,43,44] [--share 1.3] [--variants NAME:WEIGHTS;...]  # sample only
        [--percentages default,50,100]                                 # sample only

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
replay: arrivals in trace order with their gaps divided by --compress, each bound pod
        deleted after its trace lifetime, all divided by --speedup into wall seconds;
        a GPU pod pending longer than --patience (trace seconds, so also divided by
        --speedup) is withdrawn as failed. Reports GPU
        allocation over time, pending time of GPU pods (p50/p99), failed pods by size.
        The trace's own times carry ~1% of the cluster's GPUs, hence --compress; see
        tests/bench/replay.py. Files without times (multigpu20) run in fill mode only.
sample: the FGD paper's protocol (tests/bench/sampling.py): per seed, tasks drawn at
        random with replacement until they ask for --share of the cluster's GPUs,
        submitted in that order, each waited for, none leaving, a failed pod deleted;
        GPU allocation at 50/75/90/100/110/130% arrived, at the first failure,
        fragmentation at 90% arrived; median and range over the seeds. --variants
        runs our profile once per extender weight set (e.g.
        "binpack:gpu=3,scarcity=6;fgd:fragmentation=10,gpu=0,scarcity=0").
        --percentages runs our profile once per kube-scheduler
        percentageOfNodesToScore (set on the profile; "default": unset, i.e. adaptive,
        50 - nodes/125 %, at least 5% and 100 nodes), labelled
        gpu-scheduler[pct=N]; with both, every weight set at every percentage. Our
        extender's per-call handler time and candidate-node count (from its log) are
        tabled per variant.

In every mode, tasks that fit no node type of the empty cluster are set apart up
front: never submitted, never a failure (tests/bench/sampling.py).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import heapq
import itertools
import math
import queue
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kubernetes.client.exceptions import ApiException  # noqa: E402
from urllib3.exceptions import ProtocolError  # noqa: E402

from gpu_scheduler.kube import watch_events  # noqa: E402
from lab.controlplane import LocalCluster  # noqa: E402
from lab.stack import DEFAULT_SCHEDULER_CONFIG, bare_stack, scheduler_config  # noqa: E402
from tests.bench.replay import Arrival, ReplayResult, replay_schedule  # noqa: E402
from tests.bench.sampling import (  # noqa: E402
    FRAGMENTATION_AT,
    LEVELS,
    NodeState,
    SampleResult,
    draw,
    fragmentation,
    split_feasible,
    task_classes,
)
from tests.bench.trace import (  # noqa: E402
    FillResult,
    Task,
    TraceNode,
    fill_should_stop,
    find_trace_dir,
    load_nodes,
    load_tasks,
    median_run,
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


def with_percentage(config: dict[str, Any], percentage: int | None) -> dict[str, Any]:
    """A copy of a KubeSchedulerConfiguration with ``percentageOfNodesToScore`` set on
    every profile (kubescheduler.config.k8s.io/v1: the profile's value overrides the
    top-level one; per-profile since 1.27). None: unset, kube-scheduler's adaptive
    default; a top-level value the config already has is left as it is."""
    out = copy.deepcopy(config)
    if percentage is None:
        return out
    if not 0 <= percentage <= 100:
        raise ValueError(f"percentageOfNodesToScore must be 0..100, not {percentage}")
    for profile in out["profiles"]:
        profile["percentageOfNodesToScore"] = percentage
    return out


def nodes_to_find(num_nodes: int, percentage: int | None) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops filtering
    (``numFeasibleNodesToFind``, pkg/scheduler/schedule_one.go): all below 100 nodes;
    unset or 0 -> 50 - nodes/125 percent, at least 5; never fewer than 100."""
    if num_nodes < 100:
        return num_nodes
    pct = percentage or max(50 - num_nodes // 125, 5)
    return max(num_nodes * pct // 100, 100)


def parse_percentages(text: str) -> list[int | None]:
    """``default,50,100`` -> [None, 50, 100]; empty -> [None] (one run, unset)."""
    out: list[int | None] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        if item == "default":
            out.append(None)
            continue
        value = int(item)
        if not 0 <= value <= 100:
            raise ValueError(f"percentageOfNodesToScore must be 0..100, not {value}")
        out.append(value)
    return out or [None]


def variant_label(weights: str | None, percentage: int | None, percentages: int) -> str:
    """gpu-scheduler, gpu-scheduler[NAME], gpu-scheduler[pct=50],
    gpu-scheduler[NAME,pct=default]: the percentage named when one is set or more
    than one ran."""
    parts = [weights] if weights else []
    if percentages > 1 or percentage is not None:
        parts.append(f"pct={'default' if percentage is None else percentage}")
    return f"gpu-scheduler[{','.join(parts)}]" if parts else "gpu-scheduler"


def _quantile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q`` of the values at or below."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def extender_calls(lines: list[str]) -> list[tuple[str, float, int]]:
    """(verb, handler ms, candidate nodes) of each filter/prioritize call in our
    extender's JSON log lines (its access line per verb: msg, ms, nodes)."""
    import json

    out = []
    for line in lines:
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("msg") in ("filter", "prioritize") and "ms" in record:
            out.append((record["msg"], float(record["ms"]), int(record["nodes"])))
    return out


def extender_call_stats(calls: list[tuple[str, float, int]]) -> dict[str, dict[str, float]]:
    """Per verb: calls, handler ms p50/p99, candidate nodes p50/min/max."""
    out: dict[str, dict[str, float]] = {}
    for verb in ("filter", "prioritize"):
        ms = [m for v, m, _ in calls if v == verb]
        nodes = [float(n) for v, _, n in calls if v == verb]
        if not ms:
            continue
        out[verb] = {
            "calls": len(ms),
            "p50_ms": statistics.median(ms),
            "p99_ms": _quantile(ms, 0.99),
            "nodes_p50": statistics.median(nodes),
            "nodes_min": min(nodes),
            "nodes_max": max(nodes),
        }
    return out


def latency_table(stats: dict[str, dict[str, dict[str, float]]]) -> str:
    rows = [
        "| variant | verb | calls | handler p50 ms | p99 ms | candidate nodes p50 [min-max] |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for label, verbs in stats.items():
        for verb, s in verbs.items():
            rows.append(
                f"| {label} | {verb} | {s['calls']:.0f} | {s['p50_ms']:.2f} | "
                f"{s['p99_ms']:.2f} | {s['nodes_p50']:.0f} "
                f"[{s['nodes_min']:.0f}-{s['nodes_max']:.0f}] |"
            )
    return "\n".join(rows)


class _LogTail:
    """Lines appended to a log since the last read (from the start if it shrank)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def read(self) -> list[str]:
        if not self.path.exists():
            return []
        size = self.path.stat().st_size
        if size < self.offset:
            self.offset = 0
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        self.offset += len(data)
        return data.decode(errors="replace").splitlines()


class Outcomes:
    """Watches one scheduler's pods; tells when each is bound or found unschedulable."""

    def __init__(self, core: Any, scheduler: str) -> None:
        self.core = core
        self.scheduler = scheduler
        self.state: dict[str, tuple[str, str, float]] = {}  # name -> (kind, detail, when)
        self.cond = threading.Condition()
        self.bound_events: queue.SimpleQueue = queue.SimpleQueue()  # (pod, node, when)
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
                    now = time.monotonic()
                    self.state[name] = (*outcome, now)
                    if outcome[0] == "bound":
                        self.bound_events.put((name, node, now))
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
    deadline = time.monotonic() + 300
    while True:
        try:
            # Thousands of pods: on a loaded machine the API server may answer 504
            # while it goes on deleting; ask again until they are gone.
            # The answer lists every deleted pod (megabytes): the connection may also
            # break while it is read, with the deletion under way all the same.
            core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status not in (429, 500, 503, 504) or time.monotonic() > deadline:
                raise
        except (ProtocolError, ConnectionError) as exc:
            if time.monotonic() > deadline:
                raise
            print(f"  (deleting the pods: {exc!r}; asking again)", flush=True)
        if not core.list_namespaced_pod(NAMESPACE, limit=1).items:
            break
        if time.monotonic() > deadline:
            raise TimeoutError("pods of the last run still there after 300 s")
        time.sleep(0.5)
    if extender_port:  # the extender's cache must have seen them go, too
        import json
        import urllib.request

        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{extender_port}/readyz") as r:
                if " 0 pods cached" in json.loads(r.read())["detail"]:
                    return
            time.sleep(0.5)


@contextlib.contextmanager
def scheduler_watched(
    cluster: LocalCluster, core: Any, name: str, config: dict[str, Any]
) -> Iterator[Outcomes]:
    """A kube-scheduler with this config, and a watch on the pods that name it; both
    stopped on the way out."""
    outcomes = Outcomes(core, config["profiles"][0]["schedulerName"])
    proc = cluster.start_scheduler(f"scheduler-{name}", config)
    try:
        yield outcomes
    finally:
        outcomes.stop()
        cluster.stop_process(proc.name)


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
    result = FillResult(name, total_gpus)
    placed: list[bool] = []
    timings: list[tuple[float, float]] = []
    started = time.monotonic()
    with scheduler_watched(cluster, core, name, config) as outcomes:
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
    if timings:
        create = statistics.median(t for t, _ in timings) * 1000
        decide = statistics.median(d for _, d in timings) * 1000
        print(f"  {name}: median create {create:.1f} ms, create-to-outcome {decide:.1f} ms")
    return result


def run_sample(
    cluster: LocalCluster,
    core: Any,
    name: str,
    config: dict[str, Any],
    tasks: list[Task],
    nodes: list[TraceNode],
    classes: list[Any],
    seed: int,
    *,
    ours: bool,
) -> SampleResult:
    """The drawn tasks in order, each waited for (bound or unschedulable; a failed pod
    is deleted), none leaving. CPU-only draws are not submitted: GPU nodes are tainted,
    so they cannot touch a GPU node and change no GPU figure."""
    scheduler = config["profiles"][0]["schedulerName"]
    total = sum(n.gpus for n in nodes)
    result = SampleResult(name, seed, total)
    states = {
        n.name: NodeState(n.model, n.gpus, n.cpu_milli, n.memory_mib) for n in nodes if n.gpus
    }
    started = time.monotonic()
    with scheduler_watched(cluster, core, name, config) as outcomes:
        for i, task in enumerate(t for t in tasks if t.gpus):
            core.create_namespaced_pod(NAMESPACE, pod_manifest(task, scheduler, ours=ours))
            kind, detail, _ = outcomes.wait(task.name, 60)
            model = None
            if kind == "bound" and detail in states:
                states[detail].take(task)
                model = states[detail].model
            elif kind != "bound":
                core.delete_namespaced_pod(task.name, NAMESPACE, grace_period_seconds=0)
            result.record(task, model)
            if result.fragmentation is None and result.arrived >= FRAGMENTATION_AT * total:
                result.fragmentation = fragmentation(states.values(), classes)
            if (i + 1) % 1000 == 0:
                print(
                    f"  {name} seed {seed}: {i + 1} GPU tasks, "
                    f"{result.arrived / total:.0%} arrived, {result.allocated / total:.1%} "
                    f"allocated, {result.gpu_failed} failed, {time.monotonic() - started:.0f}s",
                    flush=True,
                )
    return result


def run_replay(
    cluster: LocalCluster,
    core: Any,
    name: str,
    config: dict[str, Any],
    arrivals: list[Arrival],
    model_of: dict[str, str],
    total_gpus: int,
    patience: float,
) -> ReplayResult:
    """Arrivals at their compressed times; each bound pod deleted after its runtime; a
    pod still pending after ``patience`` seconds withdrawn and counted as failed."""
    scheduler = f"trace-{name}"
    result = ReplayResult(name, total_gpus)
    by_name = {a.task.name: a for a in arrivals}
    # (due, order, kind, name): kind 0 departure, 1 withdrawal, 2 arrival; equal times
    # free GPUs before new pods ask for them
    due: list[tuple[float, int, int, str]] = []
    order = itertools.count()
    for arrival in arrivals:
        heapq.heappush(due, (arrival.at, next(order), 2, arrival.task.name))
    calls: list[Future] = []
    last_sample = -1.0
    last_progress = 0.0
    with (
        scheduler_watched(cluster, core, name, config) as outcomes,
        ThreadPoolExecutor(8) as pool,
    ):
        start = time.monotonic()
        while len(result.arrived_at) < len(arrivals) or result.pending:
            now = time.monotonic() - start
            while True:  # bindings the watch saw: their runtimes start now
                try:
                    pod, node, when = outcomes.bound_events.get_nowait()
                except queue.Empty:
                    break
                if result.bound(pod, model_of.get(node), when - start):
                    end = when - start + by_name[pod].runtime
                    if end != float("inf"):
                        heapq.heappush(due, (end, next(order), 0, pod))
            while due and due[0][0] <= now:
                _, _, kind, pod = heapq.heappop(due)
                if kind == 2:
                    task = by_name[pod].task
                    result.arrive(task, now)
                    manifest = pod_manifest(task, scheduler, ours=name == "gpu-scheduler")
                    calls.append(pool.submit(core.create_namespaced_pod, NAMESPACE, manifest))
                    heapq.heappush(due, (now + patience, next(order), 1, pod))
                elif (kind == 0 and result.depart(pod)) or (kind == 1 and result.withdraw(pod)):
                    calls.append(
                        pool.submit(
                            core.delete_namespaced_pod, pod, NAMESPACE, grace_period_seconds=0
                        )
                    )
            if now - last_sample >= 1.0:
                result.sample(now)
                last_sample = now
                calls = check_calls(calls)
            if now - last_progress >= 30:
                last_progress = now
                print(
                    f"  {name}: {now:.0f}s, {len(result.arrived_at)}/{len(arrivals)} arrived, "
                    f"{result.allocated / total_gpus:.1%} allocated, "
                    f"{sum(1 for t in result.pending.values() if t.gpus)} GPU pods pending, "
                    f"{result.gpu_failed} failed",
                    flush=True,
                )
            next_due = due[0][0] if due else now + 0.05
            time.sleep(min(0.05, max(0.0, next_due - (time.monotonic() - start))))
        result.sample(time.monotonic() - start)
    check_calls(calls)
    return result


def check_calls(calls: list[Future]) -> list[Future]:
    """Raises the error of a finished API call (a failed call is a broken run, not a
    data point); returns the calls still running."""
    running = []
    for call in calls:
        if call.done():
            call.result()
        else:
            running.append(call)
    return running


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
    row("tasks set apart as infeasible", [str(r.infeasible) for r in results])
    return "\n".join(rows)


def repeat_row(runs: dict[str, list[FillResult]]) -> str:
    def spread(rs: list[FillResult]) -> str:
        shares = sorted(r.first_failure_share or 1.0 for r in rs)
        return " / ".join(f"{s:.1%}" for s in shares)

    return (
        "| first failure, every run (low to high) | "
        + " | ".join(spread(rs) for rs in runs.values())
        + " |"
    )


def _finish(fig, ax, title: str, path: Path, legend_size: int | None = None) -> None:  # type: ignore[no-untyped-def]
    """Title, grid and legend; the figure written to ``path`` and closed."""
    import matplotlib.pyplot as plt

    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


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
    _finish(fig, ax, title, path)


def replay_table(results: list[ReplayResult], arrival_end: float) -> str:
    head = "| | " + " | ".join(r.scheduler for r in results) + " |"
    rows = [head, "|---|" + "---:|" * len(results)]

    def row(label: str, values: list[str]) -> None:
        rows.append(f"| {label} | " + " | ".join(values) + " |")

    def waits(r: ReplayResult, sizes: tuple[int, ...]) -> str:
        p50, p99 = r.wait_percentiles(sizes, 0.5), r.wait_percentiles(sizes, 0.99)
        return "none placed" if p50 is None or p99 is None else f"{p50:.2f} / {p99:.2f}"

    row(
        "mean GPU allocation while tasks arrive",
        [f"{r.mean_allocation(arrival_end):.1%}" for r in results],
    )
    row("peak GPU allocation", [f"{r.peak_allocation:.1%}" for r in results])
    row("GPU pods placed / submitted", [f"{r.gpu_placed} / {r.gpu_pods}" for r in results])
    row("pending s, 1-GPU pods (p50 / p99)", [waits(r, (1,)) for r in results])
    row("pending s, 2-8-GPU pods (p50 / p99)", [waits(r, (2, 4, 8)) for r in results])
    row(
        "failed GPU pods by size (1/2/4/8)",
        ["/".join(str(r.failed_by_size.get(s, 0)) for s in (1, 2, 4, 8)) for r in results],
    )
    row("model-constraint violations", [str(r.constraint_violations) for r in results])
    row("tasks set apart as infeasible", [str(r.infeasible) for r in results])
    return "\n".join(rows)


def plot_replay(results: list[ReplayResult], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for r in results:
        (line,) = ax.plot(
            [t for t, _, _ in r.samples],
            [100 * a for _, a, _ in r.samples],
            label=f"{r.scheduler}: allocated",
            linewidth=1.6,
        )
        ax.plot(
            [t for t, _, _ in r.samples],
            [100 * d for _, _, d in r.samples],
            linestyle=":",
            linewidth=1.0,
            color=line.get_color(),
            label=f"{r.scheduler}: asked for (running + pending)",
        )
    ax.set_xlabel("seconds into the replay")
    ax.set_ylabel("cluster GPUs (%)")
    _finish(fig, ax, title, path, legend_size=8)


def _spread(values: list[float], fmt: str = "{:.1%}") -> str:
    """median [min-max] of the seeds' values."""
    if not values:
        return "-"
    low, mid, high = min(values), statistics.median(values), max(values)
    if len(values) == 1:
        return fmt.format(mid)
    return f"{fmt.format(mid)} [{fmt.format(low)} to {fmt.format(high)}]"


def sample_table(runs: dict[str, list[SampleResult]]) -> str:
    names = list(runs)
    rows = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]

    def row(label: str, cell) -> None:  # type: ignore[no-untyped-def]
        rows.append(f"| {label} | " + " | ".join(cell(runs[n]) for n in names) + " |")

    for level in LEVELS:
        row(
            f"GPUs allocated at {level:.0%} arrived",
            lambda rs, lv=level: _spread([v for r in rs if (v := r.at_level(lv)) is not None]),
        )
    row(
        "GPUs allocated at the first failure",
        lambda rs: _spread([r.first_failure_or_end for r in rs]),
    )
    row(
        f"fragmented GPUs at {FRAGMENTATION_AT:.0%} arrived (% of free GPUs)",
        lambda rs: (
            _spread([r.fragmentation[0] for r in rs if r.fragmentation], "{:.0f}")
            + " ("
            + _spread([r.fragmentation[1] for r in rs if r.fragmentation], "{:.0%}")
            + ")"
        ),
    )
    row(
        "failed GPU pods by size (1/2/4/8), median",
        lambda rs: "/".join(
            f"{statistics.median(r.failed_by_size.get(s, 0) for r in rs):g}" for s in (1, 2, 4, 8)
        ),
    )
    row(
        "model-constraint violations, all seeds",
        lambda rs: str(sum(r.constraint_violations for r in rs)),
    )
    return "\n".join(rows)


def plot_sample(runs: dict[str, list[SampleResult]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [i / 100 for i in range(0, 131)]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for name, rs in runs.items():
        curves = [[100 * (r.at_level(x) or 0.0) for x in grid] for r in rs]
        median = [statistics.median(c[i] for c in curves) for i in range(len(grid))]
        (line,) = ax.plot([100 * x for x in grid], median, label=name, linewidth=1.6)
        if len(rs) > 1:
            ax.fill_between(
                [100 * x for x in grid],
                [min(c[i] for c in curves) for i in range(len(grid))],
                [max(c[i] for c in curves) for i in range(len(grid))],
                color=line.get_color(),
                alpha=0.15,
            )
    ax.plot([0, 100, 130], [0, 100, 100], color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("GPUs asked for by arrived tasks (% of the cluster's)")
    ax.set_ylabel("GPUs allocated (% of the cluster's)")
    ax.set_xlim(40, 130)
    ax.set_ylim(40, 101)
    _finish(fig, ax, title, path, legend_size=8)


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", default="openb_pod_list_default.csv", help="trace task file")
    parser.add_argument("--nodes", default="openb_node_list_all_node.csv", help="trace node file")
    parser.add_argument("--mode", choices=("fill", "replay", "sample"), default="fill")
    parser.add_argument("--scale", type=float, default=1.0, help="sample nodes and tasks")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--compress", type=float, default=5000.0, help="replay: arrival gaps divided by this"
    )
    parser.add_argument(
        "--speedup", type=float, default=2.0, help="replay: trace seconds per wall second"
    )
    parser.add_argument(
        "--patience",
        type=float,
        default=120.0,
        help="replay: seconds of (compressed) trace time a pod may pend, / --speedup in wall time",
    )
    parser.add_argument("--schedulers", default=",".join(SCHEDULERS))
    parser.add_argument(
        "--repeat", type=int, default=1, help="fill: run each scheduler N times (ties are random)"
    )
    parser.add_argument(
        "--seeds", default="42,43,44", help="sample: the seeds of the draws (comma list)"
    )
    parser.add_argument(
        "--share", type=float, default=1.3, help="sample: draw until tasks ask this x the GPUs"
    )
    parser.add_argument(
        "--variants",
        default="",
        help="sample: our profile once per extender weight set, NAME:policy=w,...;NAME:...",
    )
    parser.add_argument(
        "--percentages",
        default="",
        help="sample: our profile once per percentageOfNodesToScore, e.g. default,50,100",
    )
    parser.add_argument("--write-docs", action="store_true", help="table + plot into docs/")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return 0 if run(parse_args(argv)) else 1


def run(opts: argparse.Namespace) -> list[Any]:

    trace = find_trace_dir()
    nodes: list[TraceNode] = sample(
        load_nodes(trace / opts.nodes), opts.scale, opts.seed, key=lambda n: n.model
    )
    if opts.mode == "sample":
        return run_samples(opts, nodes, load_tasks(trace / opts.pods))
    tasks, apart = split_feasible(
        sample(load_tasks(trace / opts.pods), opts.scale, opts.seed), nodes
    )
    total_gpus = sum(n.gpus for n in nodes)
    model_of = {n.name: n.model for n in nodes if n.gpus}
    names = [s for s in opts.schedulers.split(",") if s]
    arrivals: list[Arrival] = []
    if opts.repeat < 1 or (opts.repeat > 1 and opts.mode != "fill"):
        raise SystemExit("--repeat N (N >= 1) is for fill mode")
    if opts.mode == "replay":
        if any(t.deleted is None for t in tasks):
            raise SystemExit(f"{opts.pods} has no arrival and departure times: fill mode only")
        arrivals = replay_schedule(tasks, opts.compress, opts.speedup)
    print(
        f"{opts.pods}: {len(nodes)} nodes ({total_gpus} GPUs), {len(tasks)} tasks "
        f"({sum(1 for t in tasks if t.gpus)} GPU; {len(apart)} infeasible set apart), "
        f"mode {opts.mode}, scale {opts.scale}"
        + (f", arrivals over {arrivals[-1].at:.0f}s" if arrivals else ""),
        flush=True,
    )
    with bare_stack("trace-replay-") as (stack, core):
        cluster = stack.cluster
        results: list[Any] = []
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: core.create_node(node_manifest(n)), nodes))
        stack.start_extender()
        configs = scheduler_configs(f"http://127.0.0.1:{stack.extender_port}")
        for name in [n for _ in range(opts.repeat) for n in names]:
            started = time.monotonic()
            if opts.mode == "fill":
                result = run_fill(cluster, core, name, configs[name], tasks, model_of, total_gpus)
                print(
                    f"  {name}: first failure at {result.first_failure_share or 0:.1%}, "
                    f"end {result.final_share:.1%}, {time.monotonic() - started:.0f}s",
                    flush=True,
                )
            else:
                result = run_replay(
                    cluster,
                    core,
                    name,
                    configs[name],
                    arrivals,
                    model_of,
                    total_gpus,
                    opts.patience / opts.speedup,
                )
                print(
                    f"  {name}: mean GPU allocation "
                    f"{result.mean_allocation(arrivals[-1].at):.1%}, "
                    f"{result.gpu_failed} GPU pods failed, "
                    f"{time.monotonic() - started:.0f}s",
                    flush=True,
                )
            result.infeasible = len(apart)
            results.append(result)
            clear_pods(core, stack.extender_port)
    stem = Path(opts.pods).stem.replace("openb_pod_list_", "")
    size = (
        f"{len(nodes)} nodes, {total_gpus} GPUs, {len(tasks)} tasks "
        f"({len(apart)} more set apart as infeasible)"
    )
    when = time.strftime("%Y-%m-%d %H:%M")
    if opts.mode == "fill":
        runs = {n: [r for r in results if r.scheduler == n] for n in names}
        table = fill_table([median_run(runs[n]) for n in names])
        if opts.repeat > 1:
            table += "\n" + repeat_row(runs)
        print()
        print(table)
        if opts.write_docs:
            variant = (
                ""
                if opts.repeat == 1 and names == list(SCHEDULERS)
                else (f"-{'-'.join(names)}-x{opts.repeat}")
            )
            png = ROOT / "docs" / f"trace-fill-{stem}{variant}.png"
            plot_fill(
                [median_run(runs[n]) for n in names],
                f"openb {stem}, fill mode, scale {opts.scale}",
                png,
            )
            command = (
                f"python tests/bench/trace_replay.py --pods {opts.pods} --mode fill "
                f"--scale {opts.scale} --seed {opts.seed}"
                + (f" --schedulers {','.join(names)} --repeat {opts.repeat}" if variant else "")
                + " --write-docs"
            )
            runs_note = f" {opts.repeat} runs each, the median one tabled;" if variant else ""
            write_docs(
                f"### {stem}, fill, scale {opts.scale}"
                + (f", {' and '.join(names)}, {opts.repeat} runs each" if variant else "")
                + f"\n\n```sh\n{command}\n```\n\n"
                f"{size};{runs_note} run {when}.\n\n{table}\n\n"
                f"![GPU allocation against pods submitted]({png.name})\n",
                f"fill-{stem}{variant}",
            )
    else:
        table = replay_table(results, arrivals[-1].at)
        print()
        print(table)
        if opts.write_docs:
            variant = f"{stem}-c{opts.compress:g}-s{opts.speedup:g}"
            png = ROOT / "docs" / f"trace-replay-{variant}.png"
            plot_replay(
                results,
                f"openb {stem}, replay, compress {opts.compress:g}, speedup {opts.speedup:g}",
                png,
            )
            command = (
                f"python tests/bench/trace_replay.py --pods {opts.pods} --mode replay "
                f"--scale {opts.scale} --seed {opts.seed} --compress {opts.compress:g} "
                f"--speedup {opts.speedup:g} --patience {opts.patience:g} --write-docs"
            )
            write_docs(
                f"### {stem}, replay, scale {opts.scale}, compress {opts.compress:g}, "
                f"speedup {opts.speedup:g}\n\n```sh\n{command}\n```\n\n"
                f"{size}; arrivals over {arrivals[-1].at:.0f} s; run {when}.\n\n"
                f"{table}\n\n![GPU allocation over the replay]({png.name})\n",
                f"replay-{variant}",
            )
    return results


def parse_variants(text: str) -> list[tuple[str, dict[str, Any] | None]]:
    """``NAME:policy=w,...;...`` -> [(label, extender config)]; none: our defaults."""
    if not text.strip():
        return [("gpu-scheduler", None)]
    variants = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        label, _, spec = item.partition(":")
        weights = {}
        for pair in filter(None, spec.split(",")):
            policy, _, weight = pair.partition("=")
            weights[policy.strip()] = int(weight)
        variants.append((f"gpu-scheduler[{label.strip()}]", {"weights": weights}))
    return variants


def run_samples(
    opts: argparse.Namespace, nodes: list[TraceNode], all_tasks: list[Task]
) -> list[SampleResult]:
    """Sample mode: every seed's draw under every scheduler (and variant of ours), on
    one cluster, one after the other; tables and plot over the seeds."""
    tasks, apart = split_feasible(all_tasks, nodes)
    classes = task_classes(tasks)
    total_gpus = sum(n.gpus for n in nodes)
    seeds = [int(x) for x in opts.seeds.split(",") if x.strip()]
    names = [s for s in opts.schedulers.split(",") if s]
    percentages = parse_percentages(opts.percentages)
    # (label, extender config, percentageOfNodesToScore) per run of our profile
    variants = [
        (
            variant_label(
                label[len("gpu-scheduler[") : -1] if extender else None, pct, len(percentages)
            ),
            extender,
            pct,
        )
        for label, extender in parse_variants(opts.variants)
        for pct in percentages
    ]
    print(
        f"{opts.pods}: {len(nodes)} nodes ({total_gpus} GPUs), {len(tasks)} feasible tasks "
        f"({len(apart)} set apart), mode sample, share {opts.share:g}, seeds {seeds}, "
        f"scale {opts.scale}"
        + (
            f", percentageOfNodesToScore {opts.percentages} (adaptive default: "
            f"{nodes_to_find(len(nodes), None)} of {len(nodes)} nodes)"
            if opts.percentages
            else ""
        ),
        flush=True,
    )
    results: list[SampleResult] = []
    calls: dict[str, list[tuple[str, float, int]]] = {}  # our variants' calls, all seeds
    with bare_stack("trace-sample-") as (stack, core):
        cluster = stack.cluster
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: core.create_node(node_manifest(n)), nodes))
        stack.start_extender()
        configs = scheduler_configs(f"http://127.0.0.1:{stack.extender_port}")
        tail = _LogTail(cluster.workdir / "logs" / "extender.log")
        current: dict[str, Any] | None = None
        for seed in seeds:
            drawn = draw(tasks, total_gpus, opts.share, seed)
            for name in names:
                runs_of = variants if name == "gpu-scheduler" else [(name, None, None)]
                for label, extender, pct in runs_of:
                    if name == "gpu-scheduler" and extender != current:
                        cluster.stop_process("extender")
                        stack.start_extender(extender)
                        current = extender
                    tail.read()  # what came before this run is not its
                    started = time.monotonic()
                    result = run_sample(
                        cluster,
                        core,
                        label,
                        with_percentage(configs[name], pct),
                        drawn,
                        nodes,
                        classes,
                        seed,
                        ours=name == "gpu-scheduler",
                    )
                    result.infeasible = len(apart)
                    results.append(result)
                    if name == "gpu-scheduler":
                        these = extender_calls(tail.read())
                        calls.setdefault(label, []).extend(these)
                        one = extender_call_stats(these)
                    print(
                        f"  {label} seed {seed}: at 100% arrived "
                        f"{result.at_level(1.0) or 0:.1%}, first failure "
                        f"{result.first_failure_or_end:.1%}, "
                        + (
                            f"fragmented at 90% {result.fragmentation[0]:.0f} GPUs "
                            f"({result.fragmentation[1]:.0%} of free), "
                            if result.fragmentation
                            else ""
                        )
                        + f"{result.gpu_failed} failed, {time.monotonic() - started:.0f}s"
                        + (
                            "".join(
                                f"; {verb} p50 {v['p50_ms']:.2f} ms p99 {v['p99_ms']:.2f} ms "
                                f"at {v['nodes_p50']:.0f} nodes"
                                for verb, v in one.items()
                            )
                            if name == "gpu-scheduler"
                            else ""
                        ),
                        flush=True,
                    )
                    clear_pods(core, stack.extender_port)
    runs: dict[str, list[SampleResult]] = {}
    for r in results:
        runs.setdefault(r.scheduler, []).append(r)
    table = sample_table(runs)
    latencies = latency_table({k: extender_call_stats(v) for k, v in calls.items()})
    print()
    print(table)
    print()
    print(latencies)
    if opts.write_docs:
        stem = Path(opts.pods).stem.replace("openb_pod_list_", "")
        variant = ("-variants" if opts.variants else "") + (
            "-percentages" if opts.percentages else ""
        )
        png = ROOT / "docs" / f"trace-sample-{stem}{variant}.png"
        plot_sample(runs, f"openb {stem}, sample mode, seeds {opts.seeds}", png)
        command = (
            f"python tests/bench/trace_replay.py --pods {opts.pods} --mode sample "
            f"--scale {opts.scale} --seeds {opts.seeds} --share {opts.share:g}"
            + (f" --schedulers {opts.schedulers}" if names != list(SCHEDULERS) else "")
            + (f' --variants "{opts.variants}"' if opts.variants else "")
            + (f" --percentages {opts.percentages}" if opts.percentages else "")
            + " --write-docs"
        )
        write_docs(
            f"### {stem}, sample, scale {opts.scale}, seeds {opts.seeds}"
            + (" (weight variants)" if opts.variants else "")
            + (" (percentageOfNodesToScore variants)" if opts.percentages else "")
            + f"\n\n```sh\n{command}\n```\n\n"
            f"{len(nodes)} nodes, {total_gpus} GPUs; {len(tasks)} feasible tasks to draw "
            f"from ({len(apart)} set apart as infeasible); run "
            f"{time.strftime('%Y-%m-%d %H:%M')}. Median over the seeds [range].\n\n"
            f"{table}\n\n"
            + (f"Our extender's calls:\n\n{latencies}\n\n" if calls else "")
            + f"![GPU allocation against GPUs arrived]({png.name})\n",
            f"sample-{stem}{variant}",
        )
    return results


if __name__ == "__main__":
    sys.exit(main())
