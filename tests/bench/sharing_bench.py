"""GPU sharing in the trace bench: the ways it compares, what a sharing task asks, and
the bookkeeping in GPUs of work. Pure functions: tests/bench/sharing_runs.py drives
them on the control plane (``trace_replay.py --mode sample --sharing``).

- **The ways**, side by side on one cluster, each over the same draw: ``whole``, our
  profile with every task asking whole GPUs (a sharing task one GPU, as before);
  ``bestfit``, our profile with sharing tasks asking their share and the extender's
  ``fragmentation`` weight 0 (the ``gpu`` policy's best fit alone); ``full``, shares
  with the shipped weights (best fit and FGD on partial GPUs); ``default`` and
  ``mostallocated``, kube-scheduler without us, whole GPUs. Our profile is deploy/'s
  (lab.stack.scheduler_config); should it list extender ``managedResources`` without
  ``gpu-scheduler.io/gpu-memory`` (deploy/ did until 7b8fb31), kube-scheduler would
  never send a pod asking only a share to the extender, so the share ways add it there;
  ``full-deployed`` (run only when asked) is ``full`` with the profile as it is. Other
  weights: ``share[fragmentation=16,gpu=0]`` or ``whole[...]`` (:func:`parse_ways`).
  ``fgd-shares`` and ``fgd-whole`` split the pods between two profiles of ours (two
  kube-schedulers, two extenders, both watching the whole cluster): FGD (the shipped
  weights) for the share pods only, the whole pods with ``fragmentation=0``, or the
  other way round.
- **The cluster**: every GPU node shares (label ``gpu-scheduler.io/gpu-sharing: mps``,
  ``gpu-scheduler.io/gpu-memory`` capacity and allocatable = GPUs x the units of one
  GPU, :func:`gpu_scheduler.sharing.gpu_units` of its model's memory, beside
  ``nvidia.com/gpu``); whole-GPU pods do not ask for it, so the whole ways see the
  cluster they saw before.
- **A share**: a sharing task (``gpu_milli`` < 1000) asks
  ``units = ceil(gpu_milli / 1000 x U)`` of ``gpu-scheduler.io/gpu-memory``, where U is
  the units of one GPU of the smallest-memory model the task accepts (its
  ``gpu_spec``; without one, every GPU model of the cluster): the share never exceeds
  its fraction of the smallest GPU it may land on. Unrestricted tasks on the openb
  cluster: U = 15 (the T4's 15,360 MiB), so 500 milli asks 8 units.
- **GPUs of work**: a placed whole task counts ``num_gpu``, a placed sharing task
  ``gpu_milli / 1000``, in every way (also when it was given a whole GPU). Draws stop
  once the drawn tasks' work reaches ``--share`` x the cluster's GPUs (so every way
  draws the same tasks); arrival levels are arrived work (failed tasks included) over
  the cluster's GPUs; *unallocated GPUs* at a level = cluster GPUs - allocated work.
- **Per-GPU bookkeeping**: each bound pod is replayed on its node's GPUs with the one
  fit rule (:func:`gpu_scheduler.sharing.fit`, as the extender does for a node
  without the agent's report, in binding order): a share goes to one GPU by best fit,
  whole GPUs to wholly free ones. A binding the rule cannot place there is counted
  (``misfits``): kube-scheduler placed a share the per-GPU accounting would refuse.
- **Fragmentation at 90% arrived** (FGD on partial GPUs, Weng et al. ATC'23): with the
  file's GPU task classes c (share units or whole GPUs, CPU, memory, accepted models)
  weighted p_c by count, a node's free GPU capacity (each GPU's free units over its
  units) is fragmented for c, when c cannot run there at all (CPU, memory, model, or
  no GPU holds its share / too few wholly free GPUs), in full; else, for a share, on
  the GPUs with less free than it asks, for whole GPUs, on the partly used GPUs.
  ``F = sum_nodes sum_c p_c frag_c(node)``, in GPUs and as a share of the free GPU
  capacity. On whole-GPU bookkeeping (the whole ways) it equals the whole-GPU measure
  of tests/bench/sampling.py, so all ways are measured alike.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_scheduler import contract
from gpu_scheduler.sharing import Gpu, after, fit, gpu_units, node_state
from tests.bench.sampling import SampleResult, draw
from tests.bench.trace import GPU_TOLERATION, MEMORY_MIB, Task, TraceNode, _pod, admitted


@dataclass(frozen=True)
class Way:
    """One way of running the draw: a kube-scheduler profile, whether sharing tasks ask
    their share, and our extender's configuration (None: as shipped)."""

    name: str
    label: str  # the results' name
    scheduler: str  # default | mostallocated | gpu-scheduler
    shares: bool
    extender: dict[str, Any] | None = None
    deployed: bool = False  # our profile exactly as deploy/ (gpu-memory not managed)
    #: whole-GPU pods go to a second profile of ours, whose extender has this config
    #: (shares keep ``extender``): which pods FGD helps or hurts, one kind at a time
    split: bool = False
    whole_extender: dict[str, Any] | None = None


WAYS = {
    way.name: way
    for way in (
        Way("whole", "gpu-scheduler", "gpu-scheduler", False),
        Way(
            "bestfit",
            "gpu-scheduler[share,fragmentation=0]",
            "gpu-scheduler",
            True,
            {"weights": {"fragmentation": 0}},
        ),
        Way("full", "gpu-scheduler[share]", "gpu-scheduler", True),
        Way("default", "default", "default", False),
        Way("mostallocated", "mostallocated", "mostallocated", False),
        Way("full-deployed", "gpu-scheduler[share,as-deployed]", "gpu-scheduler", True, None, True),
        Way(
            "fgd-shares",
            "gpu-scheduler[share,fragmentation on shares only]",
            "gpu-scheduler",
            True,
            None,
            split=True,
            whole_extender={"weights": {"fragmentation": 0}},
        ),
        Way(
            "fgd-whole",
            "gpu-scheduler[share,fragmentation on whole pods only]",
            "gpu-scheduler",
            True,
            {"weights": {"fragmentation": 0}},
            split=True,
        ),
    )
}
DEFAULT_WAYS = ("whole", "bestfit", "full", "default", "mostallocated")


def parse_ways(text: str) -> list[Way]:
    """``whole,full`` -> those ways, in that order; an unknown name is an error. Our
    profile with other extender weights: ``share[fragmentation=16,gpu=0]`` (shares)
    or ``whole[...]`` (whole GPUs), the weights merged over the shipped ones."""
    names = [n.strip() for n in re.split(r",(?![^\[]*\])", text) if n.strip()]
    ways = []
    for name in names:
        custom = re.fullmatch(r"(share|whole)\[([a-zA-Z]+=\d+(?:,[a-zA-Z]+=\d+)*)\]", name)
        if custom:
            weights = {k: int(v) for k, _, v in (p.partition("=") for p in custom[2].split(","))}
            label = f"gpu-scheduler[{'share,' if custom[1] == 'share' else ''}{custom[2]}]"
            ways.append(
                Way(name, label, "gpu-scheduler", custom[1] == "share", {"weights": weights})
            )
        elif name in WAYS:
            ways.append(WAYS[name])
        else:
            raise ValueError(
                f"ways: unknown {name!r}; known: {', '.join(WAYS)}, share[...], whole[...]"
            )
    if not ways:
        raise ValueError("ways: none given")
    return ways


def model_units(model: str) -> int:
    """Units of gpu-memory one GPU of ``model`` offers (the bench's memory table)."""
    return gpu_units(MEMORY_MIB.get(model, 16384))


def cluster_models(nodes: Iterable[TraceNode]) -> tuple[str, ...]:
    return tuple(sorted({n.model for n in nodes if n.gpus}))


def share_units(task: Task, models: Sequence[str]) -> int | None:
    """The units a sharing task asks (None for a whole-GPU or CPU task): its fraction of
    one GPU of the smallest model it accepts (``models``: the cluster's, for a task
    without a ``gpu_spec``), rounded up."""
    if not task.sharing:
        return None
    accepted = task.models or tuple(models)
    if not accepted:
        raise ValueError(f"{task.name}: no GPU model to size its share on")
    smallest = min(model_units(m) for m in accepted)
    return max(1, math.ceil(task.milli * smallest / 1000))


def work_milli(task: Task) -> int:
    """The task's GPUs of work, in thousandths: ``num_gpu`` x 1000 or ``gpu_milli``."""
    return task.milli if task.gpus else 0


def draw_by_work(tasks: Sequence[Task], total_gpus: int, share: float, seed: int) -> list[Task]:
    """Tasks drawn with replacement until their work reaches ``share`` x the GPUs."""
    return draw(tasks, 1000 * total_gpus, share, seed, weight=work_milli)


@dataclass
class WorkResult(SampleResult):
    """One way's run over one seed's draw, in GPUs of work (``arrived`` and
    ``allocated`` in GPUs; ``failed_by_size[0]``: sharing tasks)."""

    shares: bool = False  # sharing tasks asked their share
    arrived_milli: int = 0
    allocated_milli: int = 0
    misfits: int = 0  # bindings the per-GPU bookkeeping could not place
    #: why pods failed: kube-scheduler's message, counts as N -> how many
    reasons: dict[str, int] = field(default_factory=dict)
    #: each failure: (arrived work before it / cluster GPUs, kind, models, reason)
    failures: list[tuple[float, str, str, str]] = field(default_factory=list)

    def refused(self, task: Task, message: str) -> None:
        """A failed pod's message, kept by kind (a share or N GPUs) and wording."""
        kind = "share" if task.sharing else f"{task.gpus} GPU"
        key = f"{kind}: {failure_reason(message)}"
        self.reasons[key] = self.reasons.get(key, 0) + 1
        at = self.arrived_milli / 1000 / self.total_gpus
        self.failures.append((round(at, 4), kind, ",".join(task.models), key))

    def record(self, task: Task, node_model: str | None) -> None:
        if not task.gpus:
            return
        self.gpu_pods += 1
        self.arrived_milli += work_milli(task)
        if node_model is None:
            self.gpu_failed += 1
            size = 0 if task.sharing else task.gpus
            self.failed_by_size[size] = self.failed_by_size.get(size, 0) + 1
            if self.first_failure is None:
                self.first_failure = self.allocated_milli / 1000 / self.total_gpus
        else:
            self.allocated_milli += work_milli(task)
            if task.models and node_model not in task.models:
                self.constraint_violations += 1
        self.arrived = self.arrived_milli / 1000  # type: ignore[assignment]
        self.allocated = self.allocated_milli / 1000  # type: ignore[assignment]
        self.curve.append((self.arrived / self.total_gpus, self.allocated / self.total_gpus))

    def unallocated_at(self, level: float) -> float | None:
        """Cluster GPUs less the allocated work when arrived work reaches ``level``."""
        share = self.at_level(level)
        return None if share is None else self.total_gpus * (1.0 - share)


def failure_reason(message: str) -> str:
    """The kinds of reason in kube-scheduler's Unschedulable message ("0/9 nodes are
    available: 3 Insufficient cpu, 6 ..."), each node count dropped, the text up to a
    colon, other numbers as N, each kind once, sorted: the same refusal on a fuller
    cluster reads the same."""
    if not message:
        return "(no message: timed out)"
    listed = message.partition("available: ")[2].partition(". preemption:")[0]
    kinds = {
        re.sub(r"\d+", "N", part.strip().partition(" ")[2].partition(":")[0])[:120]
        for part in listed.split(", ")
        if part.strip()
    }
    return "; ".join(sorted(kinds)) if kinds else re.sub(r"\d+", "N", message)[:200]


@dataclass
class NodeGpus:
    """A GPU node's free CPU, memory and GPUs (each GPU's free units) during a run."""

    model: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)

    def take(self, task: Task, units: int | None) -> bool:
        """The task bound here: its share (``units``) on one GPU or its whole GPUs by
        the fit rule, and its CPU and memory. False when the rule finds no place (the
        GPUs are left as they were)."""
        self.cpu_milli -= task.cpu_milli
        self.memory_mib -= task.memory_mib
        shares = (units,) if units else ()
        placement = fit(self.gpus, shares, 0 if units else task.gpus)
        if placement is None:
            return False
        self.gpus = after(self.gpus, placement, shares)
        return True


def gpu_book(nodes: Iterable[TraceNode]) -> dict[str, NodeGpus]:
    """Every GPU node, nothing placed: GPUs named as the extender names a node's GPUs
    from its labels (``gpu-0``...)."""
    return {
        n.name: NodeGpus(
            n.model,
            n.cpu_milli,
            n.memory_mib,
            node_state(tuple((f"gpu-{i}", model_units(n.model), True) for i in range(n.gpus))),
        )
        for n in nodes
        if n.gpus
    }


#: (kind "share" | "whole", units or GPUs, cpu_milli, memory_mib, accepted models)
ShareShape = tuple[str, int, int, int, tuple[str, ...]]


def share_classes(tasks: Iterable[Task], models: Sequence[str]) -> list[tuple[ShareShape, float]]:
    """The GPU tasks' shapes as the share ways ask them, with their share by count."""
    counts: dict[ShareShape, int] = {}
    for t in tasks:
        if not t.gpus:
            continue
        units = share_units(t, models)
        shape = ("share", units, t.cpu_milli, t.memory_mib, t.models) if units else (
            "whole", t.gpus, t.cpu_milli, t.memory_mib, t.models
        )  # fmt: skip
        counts[shape] = counts.get(shape, 0) + 1
    total = sum(counts.values())
    ordered = sorted(counts.items(), key=lambda item: -item[1])
    return [(shape, n / total) for shape, n in ordered]


def node_fragments(node: NodeGpus, classes: Sequence[tuple[ShareShape, float]]) -> float:
    """The node's fragmented GPU capacity for the classes (module docstring), in GPUs."""
    frac = [g.free / g.capacity if g.capacity else 0.0 for g in node.gpus]
    free = sum(max(f, 0.0) for f in frac)
    if free <= 0:
        return 0.0
    wholly = sum(1 for g in node.gpus if g.whole_free)
    partial = sum(f for f, g in zip(frac, node.gpus, strict=True) if not g.whole_free and f > 0)
    out = 0.0
    for (kind, size, cpu, memory, models), p in classes:
        runs = cpu <= node.cpu_milli and memory <= node.memory_mib
        runs = runs and (not models or node.model in models)
        if kind == "share":
            if runs and any(g.free >= size for g in node.gpus):
                out += p * sum(f for f, g in zip(frac, node.gpus, strict=True) if g.free < size)
            else:
                out += p * free
        elif runs and wholly >= size:
            out += p * partial
        else:
            out += p * free
    return out


def share_fragmentation(
    nodes: Iterable[NodeGpus], classes: Sequence[tuple[ShareShape, float]]
) -> tuple[float, float]:
    """(fragmented GPU capacity in GPUs, its share of the free GPU capacity)."""
    memo: dict[tuple[Any, ...], float] = {}
    fragmented = free_total = 0.0
    for node in nodes:
        key = (node.model, node.cpu_milli, node.memory_mib, node.gpus)
        if key not in memo:
            memo[key] = node_fragments(node, classes)
        fragmented += memo[key]
        free_total += sum(max(g.free, 0) / g.capacity for g in node.gpus if g.capacity)
    return fragmented, (fragmented / free_total if free_total else 0.0)


def share_pod_manifest(task: Task, units: int, scheduler: str) -> dict[str, Any]:
    """A sharing task's pod for our profile: its share as ``gpu-scheduler.io/gpu-memory``,
    its accepted models as ``gpu-scheduler.io/gpu-products``, admitted by our webhook
    (which adds the GPU toleration and writes the models as node affinity)."""
    resources = {
        "requests": {"cpu": f"{task.cpu_milli}m", "memory": f"{task.memory_mib}Mi"},
        "limits": {contract.RESOURCE_GPU_MEMORY: str(units)},
    }
    spec = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {"name": "task", "image": "registry.k8s.io/pause:3.10", "resources": resources}
        ],
        "tolerations": [dict(GPU_TOLERATION)],
    }
    annotations = {contract.ANN_GPU_PRODUCTS: ",".join(task.models)} if task.models else {}
    return admitted(_pod(task, annotations, spec), scheduler)
