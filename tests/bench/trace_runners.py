"""The trace bench's runners: the three kube-schedulers' configurations, and one run of
each mode (fill, sample, replay) on a stack's cluster, pods submitted and watched."""

from __future__ import annotations

import contextlib
import copy
import heapq
import itertools
import queue
import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

from kubernetes.client.exceptions import ApiException  # noqa: E402
from urllib3.exceptions import ProtocolError  # noqa: E402

from gpu_scheduler.kube import watch_events  # noqa: E402
from lab.controlplane import LocalCluster  # noqa: E402
from lab.stack import DEFAULT_SCHEDULER_CONFIG, scheduler_config  # noqa: E402
from tests.bench.replay import Arrival, ReplayResult  # noqa: E402
from tests.bench.sampling import (  # noqa: E402
    FRAGMENTATION_AT,
    NodeState,
    SampleResult,
    fragmentation,
)
from tests.bench.trace import (  # noqa: E402
    FillResult,
    Task,
    TraceNode,
    fill_should_stop,
    pod_manifest,
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


@dataclass(frozen=True)
class Contender:
    """One scheduler under test: a kube-scheduler of its own with ``config`` on
    ``cluster``, whose pods are made through ``core``; ``name`` labels its results."""

    cluster: LocalCluster
    core: Any
    name: str
    config: dict[str, Any]

    @property
    def scheduler(self) -> str:
        """The schedulerName its pods carry."""
        return self.config["profiles"][0]["schedulerName"]

    @contextlib.contextmanager
    def watched(self) -> Iterator[Outcomes]:
        """Its kube-scheduler, and a watch on the pods that name it; both stopped on the
        way out."""
        outcomes = Outcomes(self.core, self.scheduler)
        proc = self.cluster.start_scheduler(f"scheduler-{self.name}", self.config)
        try:
            yield outcomes
        finally:
            outcomes.stop()
            self.cluster.stop_process(proc.name)


def submit(
    core: Any,
    outcomes: Outcomes,
    task: Task,
    scheduler: str,
    *,
    ours: bool,
    manifest: dict[str, Any] | None = None,
) -> tuple[str, Any, tuple[float, float]]:
    """One task's pod (``manifest``, else :func:`pod_manifest`'s) created and waited for
    (bound or unschedulable, 60 s at most); a pod that was not bound is deleted, so it
    leaves nothing behind. Returns the outcome, its detail (the node, when bound) and
    (create seconds, create-to-outcome seconds)."""
    t0 = time.monotonic()
    body = manifest if manifest is not None else pod_manifest(task, scheduler, ours=ours)
    core.create_namespaced_pod(NAMESPACE, body)
    t1 = time.monotonic()
    kind, detail, _ = outcomes.wait(task.name, 60)
    timing = (t1 - t0, time.monotonic() - t1)
    if kind != "bound":
        core.delete_namespaced_pod(task.name, NAMESPACE, grace_period_seconds=0)
    return kind, detail, timing


def run_fill(
    contender: Contender, tasks: list[Task], model_of: dict[str, str], total_gpus: int
) -> FillResult:
    core, name, scheduler = contender.core, contender.name, contender.scheduler
    result = FillResult(name, total_gpus)
    placed: list[bool] = []
    timings: list[tuple[float, float]] = []
    started = time.monotonic()
    with contender.watched() as outcomes:
        for i, task in enumerate(tasks):
            kind, detail, timing = submit(
                core, outcomes, task, scheduler, ours=name == "gpu-scheduler"
            )
            timings.append(timing)
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
    contender: Contender,
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
    core, name, scheduler = contender.core, contender.name, contender.scheduler
    total = sum(n.gpus for n in nodes)
    result = SampleResult(name, seed, total)
    states = {
        n.name: NodeState(n.model, n.gpus, n.cpu_milli, n.memory_mib) for n in nodes if n.gpus
    }
    started = time.monotonic()
    bound = 0
    with contender.watched() as outcomes:
        for i, task in enumerate(t for t in tasks if t.gpus):
            result.bound_before[task.name] = bound
            kind, detail, _ = submit(core, outcomes, task, scheduler, ours=ours)
            model = None
            bound += kind == "bound"
            if kind == "bound" and detail in states:
                states[detail].take(task)
                model = states[detail].model
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
    contender: Contender,
    arrivals: list[Arrival],
    model_of: dict[str, str],
    total_gpus: int,
    patience: float,
) -> ReplayResult:
    """Arrivals at their compressed times; each bound pod deleted after its runtime; a
    pod still pending after ``patience`` seconds withdrawn and counted as failed."""
    core, name, scheduler = contender.core, contender.name, contender.scheduler
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
        contender.watched() as outcomes,
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
