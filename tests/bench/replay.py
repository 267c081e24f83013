"""Replay mode of the trace benchmark: the schedule and the bookkeeping. Pure; the
driver (trace_replay.py) does the I/O.

Why the load is scaled. The openb tasks are a sample of the cluster's pods, not all of
them: replayed at their own times they never ask for more than 71 GPUs at once (1.1%
of the 6,212), and every scheduler places every pod at once. So replay compresses the
*arrivals* (``compress``: arrival gaps divided by it) and keeps each task's *lifetime*
(deletion - creation) as the trace gives it; both are then divided by ``speedup`` to
get wall-clock seconds. The sparse first 1% of arrivals (the trace's first ~115 days
hold ~80 tasks, mostly long-running services) arrive at the start of the window.

Lifetimes run from binding, as a job's do: a task pending for a while still runs for
its whole lifetime once placed. A GPU pod that is not placed within a patience (given in
trace seconds, so a slower replay waits as long in trace terms) is withdrawn and
counted as failed (a job controller's start deadline).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.bench.trace import Task


@dataclass(frozen=True)
class Arrival:
    at: float  # wall seconds after the replay starts
    task: Task
    runtime: float  # wall seconds from binding to deletion


def window_start(tasks: Sequence[Task], quantile: float = 0.01) -> int:
    """The trace time the replay window opens at: the arrival time of the task at
    ``quantile`` of the arrival order (earlier tasks arrive at the opening)."""
    if not tasks:
        return 0
    times = sorted(t.created for t in tasks)
    return times[min(len(times) - 1, int(quantile * len(times)))]


def replay_schedule(
    tasks: Sequence[Task], compress: float, speedup: float, quantile: float = 0.01
) -> list[Arrival]:
    """Arrivals in trace order at compressed wall times, each with its wall runtime."""
    if compress <= 0 or speedup <= 0:
        raise ValueError("compress and speedup must be positive")
    start = window_start(tasks, quantile)
    arrivals = []
    for task in sorted(tasks, key=lambda t: (t.created, t.name)):
        # a task without a deletion time runs until the replay ends
        life = float("inf") if task.deleted is None else max(0, task.deleted - task.created)
        arrivals.append(
            Arrival(max(0, task.created - start) / (compress * speedup), task, life / speedup)
        )
    return arrivals


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class ReplayResult:
    """What one scheduler did with a replay: who waited, who ran, who gave up."""

    scheduler: str
    total_gpus: int
    pending: dict[str, Task] = field(default_factory=dict)  # name -> task, not yet bound
    running: dict[str, Task] = field(default_factory=dict)
    arrived_at: dict[str, float] = field(default_factory=dict)
    waits: dict[int, list[float]] = field(default_factory=dict)  # GPUs -> pending seconds
    failed_by_size: dict[int, int] = field(default_factory=dict)
    gpu_pods: int = 0
    gpu_placed: int = 0
    departed: int = 0  # pods that ran their lifetime and left
    constraint_violations: int = 0
    allocated: int = 0
    demand: int = 0  # GPUs asked for by pods pending or running
    samples: list[tuple[float, float, float]] = field(default_factory=list)  # t, alloc, demand
    infeasible: int = 0  # tasks set apart: they fit no node of the empty cluster

    def arrive(self, task: Task, now: float) -> None:
        self.pending[task.name] = task
        self.arrived_at[task.name] = now
        if task.gpus:
            self.gpu_pods += 1
            self.demand += task.gpus

    def bound(self, name: str, node_model: str | None, when: float) -> bool:
        """A pod was seen bound at ``when``; False if it was no longer waiting (withdrawn,
        or a repeat), so the caller schedules no departure for it."""
        task = self.pending.pop(name, None)
        if task is None:
            return False
        self.running[name] = task
        if task.gpus:
            self.gpu_placed += 1
            self.allocated += task.gpus
            self.waits.setdefault(task.gpus, []).append(max(0.0, when - self.arrived_at[name]))
            if task.models and node_model not in task.models:
                self.constraint_violations += 1
        return True

    def depart(self, name: str) -> bool:
        task = self.running.pop(name, None)
        if task is None:
            return False
        self.allocated -= task.gpus
        self.demand -= task.gpus
        self.departed += 1
        return True

    def withdraw(self, name: str) -> bool:
        """Patience ran out for a pod still pending: it fails and leaves."""
        task = self.pending.pop(name, None)
        if task is None:
            return False
        if task.gpus:
            self.failed_by_size[task.gpus] = self.failed_by_size.get(task.gpus, 0) + 1
            self.demand -= task.gpus
        return True

    def sample(self, now: float) -> None:
        total = self.total_gpus or 1
        self.samples.append((now, self.allocated / total, self.demand / total))

    @property
    def gpu_failed(self) -> int:
        return sum(self.failed_by_size.values())

    def mean_allocation(self, until: float | None = None) -> float:
        """Time-weighted mean share of the cluster's GPUs allocated, up to ``until``."""
        points = [s for s in self.samples if until is None or s[0] <= until]
        if len(points) < 2:
            return points[0][1] if points else 0.0
        span = points[-1][0] - points[0][0]
        if span <= 0:
            return statistics.mean(p[1] for p in points)
        area = sum((b[0] - a[0]) * a[1] for a, b in itertools.pairwise(points))
        return area / span

    @property
    def peak_allocation(self) -> float:
        return max((s[1] for s in self.samples), default=0.0)

    def wait_percentiles(self, sizes: Sequence[int], q: float) -> float | None:
        return percentile([w for s in sizes for w in self.waits.get(s, [])], q)
