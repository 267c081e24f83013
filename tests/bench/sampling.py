"""Sample mode's protocol and measures, as the FGD paper's simulator runs them
(hkust-adsl/kubernetes-scheduler-simulator; Weng et al., USENIX ATC'23), adapted to
whole GPUs. Pure functions: tests/bench/trace_replay.py does the I/O.

- **Infeasible tasks** fit no node type of the cluster even when it is empty (a GPU
  task: GPUs, CPU, memory and an allowed model on one GPU node type; a CPU-only task:
  CPU and memory on a node type without GPUs, as GPU nodes are tainted). They are set
  apart in every mode: never submitted, never a failure, never "first failure".
- **Drawing**: tasks are drawn at random with replacement (one seed, one
  ``random.Random``) from the feasible tasks of a file until the GPUs they ask for
  reach ``share`` (default 130%) of the cluster's GPUs; they arrive in that order, and
  none leaves. (The simulator first shuffles all original tasks and appends draws;
  the issue's protocol draws every task, which we follow.)
- **Allocation at an arrival level**: the share of the cluster's GPUs allocated just
  after the first GPU task with which the GPUs asked for by arrived tasks (failed ones
  included) reach that level of the cluster's GPUs.
- **Fragmentation** (the paper's, for whole GPUs): with task classes c (GPUs, CPU,
  memory, accepted models) weighted p_c by how many of the file's feasible GPU tasks
  have that shape, a node's free GPUs are fragmented for c when c cannot run there
  (too few free GPUs, too little free CPU or memory, a model c does not accept):
  ``F(node) = free GPUs x sum_c p_c [c does not fit]``. Reported as the cluster's sum
  (GPUs) and as a share of its free GPUs. Memory is in the fit test, unlike the
  paper's simulator, which leaves it out; CPU-only classes are left out (they cannot
  use a GPU node here), unlike the simulator, where they set a floor of p_cpu.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from tests.bench.trace import Task, TraceNode

LEVELS = (0.5, 0.75, 0.9, 1.0, 1.1, 1.3)
FRAGMENTATION_AT = 0.9
NodeType = tuple[int, int, int, str]  # cpu_milli, memory_mib, gpus, model


def node_types(nodes: Iterable[TraceNode]) -> set[NodeType]:
    return {(n.cpu_milli, n.memory_mib, n.gpus, n.model) for n in nodes}


def fits_type(task: Task, node_type: NodeType) -> bool:
    cpu, memory, gpus, model = node_type
    if task.cpu_milli > cpu or task.memory_mib > memory:
        return False
    if task.gpus == 0:
        return gpus == 0  # GPU nodes are tainted: CPU-only tasks run on CPU nodes
    return task.gpus <= gpus and (not task.models or model in task.models)


def feasible(task: Task, types: Iterable[NodeType]) -> bool:
    """Whether ``task`` fits some node type of an empty cluster."""
    return any(fits_type(task, t) for t in types)


def split_feasible(
    tasks: Sequence[Task], nodes: Sequence[TraceNode]
) -> tuple[list[Task], list[Task]]:
    types = node_types(nodes)
    verdicts = {}
    ok: list[Task] = []
    apart: list[Task] = []
    for task in tasks:
        key = (task.cpu_milli, task.memory_mib, task.gpus, task.models)
        if key not in verdicts:
            verdicts[key] = feasible(task, types)
        (ok if verdicts[key] else apart).append(task)
    return ok, apart


def draw(
    tasks: Sequence[Task],
    capacity: int,
    share: float,
    seed: int,
    *,
    weight: Callable[[Task], int] = lambda t: t.gpus,
) -> list[Task]:
    """Tasks drawn with replacement until their ``weight`` (the GPUs they ask for; the
    sharing ways: thousandths of a GPU of work, ``capacity`` in thousandths too) reaches
    ``share`` x ``capacity``; each draw is a copy with a unique name (``<name>-s<i>``)."""
    if not any(t.gpus for t in tasks):
        raise ValueError("no GPU task to draw from")
    rng = random.Random(seed)
    target = share * capacity
    drawn: list[Task] = []
    asked = 0
    while asked < target:
        task = tasks[rng.randrange(len(tasks))]
        drawn.append(replace(task, name=f"{task.name}-s{len(drawn)}", created=len(drawn)))
        asked += weight(task)
    return drawn


@dataclass
class SampleResult:
    """One scheduler's run over one seed's draw."""

    scheduler: str
    seed: int
    total_gpus: int
    infeasible: int = 0  # tasks of the file set apart
    gpu_pods: int = 0
    gpu_failed: int = 0
    constraint_violations: int = 0
    failed_by_size: dict[int, int] = field(default_factory=dict)
    arrived: int = 0  # GPUs asked for by arrived GPU tasks
    allocated: int = 0
    first_failure: float | None = None  # allocation share at the first failed GPU pod
    curve: list[tuple[float, float]] = field(default_factory=list)  # (arrived, allocated)
    fragmentation: tuple[float, float] | None = None  # (GPUs, share of free) at 90%
    #: pod name -> GPU pods bound when it was submitted (the view-lag measure)
    bound_before: dict[str, int] = field(default_factory=dict)

    def record(self, task: Task, node_model: str | None) -> None:
        if not task.gpus:
            return
        self.gpu_pods += 1
        self.arrived += task.gpus
        if node_model is None:
            self.gpu_failed += 1
            self.failed_by_size[task.gpus] = self.failed_by_size.get(task.gpus, 0) + 1
            if self.first_failure is None:
                self.first_failure = self.allocated / self.total_gpus
        else:
            self.allocated += task.gpus
            if task.models and node_model not in task.models:
                self.constraint_violations += 1
        self.curve.append((self.arrived / self.total_gpus, self.allocated / self.total_gpus))

    def at_level(self, level: float) -> float | None:
        """Allocation share when the arrived GPUs first reach ``level`` (None if never)."""
        for arrived, allocated in self.curve:
            if arrived >= level - 1e-12:
                return allocated
        return None

    @property
    def first_failure_or_end(self) -> float:
        return (
            self.first_failure
            if self.first_failure is not None
            else self.allocated / self.total_gpus
        )


@dataclass
class NodeState:
    """A node's free resources during a run (the benchmark's own bookkeeping)."""

    model: str
    gpus: int
    cpu_milli: int
    memory_mib: int

    def take(self, task: Task) -> None:
        self.gpus -= task.gpus
        self.cpu_milli -= task.cpu_milli
        self.memory_mib -= task.memory_mib


Shape = tuple[int, int, int, tuple[str, ...]]


def task_classes(tasks: Iterable[Task]) -> list[tuple[Shape, float]]:
    """The GPU tasks' shapes with their share by count (the p_c of the paper)."""
    counts = Counter((t.gpus, t.cpu_milli, t.memory_mib, t.models) for t in tasks if t.gpus)
    total = sum(counts.values())
    return [(shape, n / total) for shape, n in counts.most_common()]


def fragmentation(
    states: Iterable[NodeState], classes: Sequence[tuple[Shape, float]]
) -> tuple[float, float]:
    """(fragmented GPUs, their share of the free GPUs) over the GPU nodes."""
    memo: dict[tuple[int, int, int, str], float] = {}
    fragmented = 0.0
    free_total = 0
    for state in states:
        if state.gpus <= 0:
            continue
        key = (state.gpus, state.cpu_milli, state.memory_mib, state.model)
        if key not in memo:
            unfit = sum(
                p
                for (gpus, cpu, memory, models), p in classes
                if gpus > state.gpus
                or cpu > state.cpu_milli
                or memory > state.memory_mib
                or (models and state.model not in models)
            )
            memo[key] = state.gpus * unfit
        fragmented += memo[key]
        free_total += state.gpus
    return fragmented, (fragmented / free_total if free_total else 0.0)
