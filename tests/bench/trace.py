"""The openb trace (Alibaba cluster-trace-gpu-v2023) as Kubernetes objects, and the
fill-mode bookkeeping. Pure functions: the driver (trace_replay.py) does the I/O.

Mapping (../shared/traces/openb/README.md): a node's model becomes the labels our agent
would publish (product = the model name, memory per GPU from the README's table, count,
present) and ``nvidia.com/gpu`` allocatable; GPU nodes carry the usual
``nvidia.com/gpu`` NoSchedule taint and GPU pods tolerate it (as our webhook or the
ExtendedResourceToleration admission plugin makes them), so CPU-only tasks stay on
CPU nodes under every scheduler and the comparison is about GPU placement. A task
asks for cpu, memory and whole GPUs: a GPU-sharing task (``gpu_milli`` < 1000) asks
for one whole GPU (in the sharing ways of tests/bench/sharing_bench.py it asks its share
of one GPU's memory instead; each task keeps its ``gpu_milli`` as ``milli``). ``gpu_spec``
(accepted models) becomes the
``gpu-scheduler.io/gpu-products`` annotation for our profile and the equivalent
required nodeAffinity for the others.
"""

from __future__ import annotations

import csv
import functools
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch

from gpu_scheduler import contract
from webhook.config import WebhookConfig
from webhook.mutate import decide

TRACE_DIR = Path(__file__).resolve().parents[3] / "shared" / "traces" / "openb"
# MiB per GPU, from the trace README. G1-G3 are undisclosed models: we assume 16 GiB
# (the trace's most common memory class); nothing in the trace asks for memory, so
# the assumption only shows in the labels.
MEMORY_MIB = {
    "V100M16": 16384,
    "V100M32": 32768,
    "P100": 16384,
    "T4": 15360,
    "A10": 23028,
    "G1": 16384,
    "G2": 16384,
    "G3": 16384,
}
GPU_TAINT = {"key": contract.RESOURCE_GPU, "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = dict(contract.GPU_TOLERATION)


@dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class Task:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int  # whole GPUs asked for (sharing tasks ask for one)
    models: tuple[str, ...]  # accepted GPU models; empty = any
    created: int
    deleted: int | None
    #: thousandths of a GPU the task asks: ``gpu_milli`` x ``num_gpu`` (< 1000 for a
    #: GPU-sharing task); -1 when not given: 1000 x ``gpus`` (a whole-GPU task)
    milli: int = -1

    def __post_init__(self) -> None:
        if self.milli < 0:
            object.__setattr__(self, "milli", 1000 * self.gpus)

    @property
    def sharing(self) -> bool:
        """A GPU-sharing task: it asks a fraction of one GPU (``gpu_milli`` < 1000)."""
        return self.gpus == 1 and 0 < self.milli < 1000


def find_trace_dir() -> Path:
    for candidate in (TRACE_DIR, Path.cwd().parent / "shared" / "traces" / "openb"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"openb trace not found at {TRACE_DIR}")


def load_nodes(path: Path) -> list[TraceNode]:
    with open(path, newline="") as handle:
        return [
            TraceNode(
                row["sn"],
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
                int(row["gpu"]),
                row["model"].strip(),
            )
            for row in csv.DictReader(handle)
        ]


def load_tasks(path: Path) -> list[Task]:
    """Tasks in arrival order. Files without times (multigpu20 has only the resource
    columns) keep their row order as the arrival order and have no departures."""
    tasks = []
    with open(path, newline="") as handle:
        for i, row in enumerate(csv.DictReader(handle)):
            spec = tuple(dict.fromkeys(m for m in (row.get("gpu_spec") or "").split("|") if m))
            created = row.get("creation_time") or ""
            deleted = row.get("deletion_time") or ""
            gpus = int(row["num_gpu"])
            milli = (row.get("gpu_milli") or "").strip()
            tasks.append(
                Task(
                    row["name"],
                    int(row["cpu_milli"]),
                    int(row["memory_mib"]),
                    gpus,
                    spec,
                    int(created) if created.isdigit() else i,
                    int(deleted) if deleted.isdigit() else None,
                    gpus * int(milli) if milli.isdigit() else -1,
                )
            )
    tasks.sort(key=lambda t: (t.created, t.name))
    return tasks


def sample(items: Sequence[Any], scale: float, seed: int, key=None) -> list[Any]:
    """A proportional sample, stratified by ``key`` (e.g. GPU model), order kept."""
    if scale >= 1:
        return list(items)
    rng = random.Random(seed)
    groups: dict[Any, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(key(item) if key else None, []).append(i)
    chosen: set[int] = set()
    for indices in groups.values():
        want = max(1, round(len(indices) * scale))
        chosen.update(rng.sample(indices, min(want, len(indices))))
    return [items[i] for i in sorted(chosen)]


def node_labels(node: TraceNode) -> dict[str, str]:
    if not node.gpus:
        return {}
    return {
        contract.LABEL_GPU_PRESENT: "true",
        contract.LABEL_GPU_COUNT: str(node.gpus),
        contract.LABEL_GPU_PRODUCT: node.model,
        contract.LABEL_GPU_MEMORY: str(MEMORY_MIB.get(node.model, 16384)),
    }


def node_manifest(node: TraceNode, *, sharing: bool = False) -> dict[str, Any]:
    """The node as its kubelet registers it. ``sharing``: a GPU node also shares its
    GPUs as our device plugin serves them on a node labelled
    ``gpu-scheduler.io/gpu-sharing: mps``: that label, and ``gpu-scheduler.io/gpu-memory``
    capacity and allocatable of GPUs x the units of one GPU (besides ``nvidia.com/gpu``,
    which the plugin serves there too)."""
    from gpu_scheduler.sharing import gpu_units
    from lab.kubelet_shim import node_object

    labels = node_labels(node)
    sharing = sharing and node.gpus > 0
    if sharing:
        labels[contract.LABEL_GPU_SHARING] = "mps"
    manifest = node_object(
        node.name,
        labels=labels,
        gpus=node.gpus or None,
        cpu=f"{node.cpu_milli}m",
        memory=f"{node.memory_mib}Mi",
        taints=[GPU_TAINT] if node.gpus else [],
    )
    if sharing:
        units = str(node.gpus * gpu_units(MEMORY_MIB.get(node.model, 16384)))
        for key in ("capacity", "allocatable"):
            manifest["status"][key][contract.RESOURCE_GPU_MEMORY] = units
    return manifest


def pod_manifest(task: Task, scheduler: str, *, ours: bool) -> dict[str, Any]:
    resources: dict[str, Any] = {
        "requests": {"cpu": f"{task.cpu_milli}m", "memory": f"{task.memory_mib}Mi"}
    }
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {"name": "task", "image": "registry.k8s.io/pause:3.10", "resources": resources}
        ],
    }
    annotations: dict[str, str] = {}
    if task.gpus:
        resources["limits"] = {contract.RESOURCE_GPU: str(task.gpus)}
        spec["tolerations"] = [GPU_TOLERATION]
        if task.models:
            if ours:
                annotations[contract.ANN_GPU_PRODUCTS] = ",".join(task.models)
                return admitted(_pod(task, annotations, spec), scheduler)
            else:
                spec["affinity"] = {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": contract.LABEL_GPU_PRODUCT,
                                            "operator": "In",
                                            "values": list(task.models),
                                        }
                                    ]
                                }
                            ]
                        }
                    }
                }
    return _pod(task, annotations, spec)


def _pod(task: Task, annotations: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": task.name, "annotations": annotations},
        "spec": spec,
    }


def admitted(pod: dict[str, Any], scheduler: str) -> dict[str, Any]:
    """``pod`` as our webhook (deploy/'s configuration, for ``scheduler``) lets it
    into the cluster: the webhook's own decision, its JSON patch applied. A pod
    restricted to GPU products gets the required node affinity the webhook writes, so
    kube-scheduler's own filters, and its node sampling, see only those products'
    nodes, as they do in a cluster where the webhook runs."""
    decision = decide(pod, _webhook_config(scheduler))
    return jsonpatch.apply_patch(pod, decision.patch) if decision.patch else pod


@functools.cache
def _webhook_config(scheduler: str) -> WebhookConfig:
    return WebhookConfig(scheduler_name=scheduler)


@dataclass
class FillResult:
    """What one scheduler did with the tasks of a fill run, in submission order."""

    scheduler: str
    total_gpus: int
    submitted: int = 0
    gpu_pods: int = 0
    gpu_failed: int = 0
    fragmentation_failures: int = 0  # GPU pods failed while enough GPUs were free in total
    constraint_violations: int = 0
    first_failure_share: float | None = None  # GPUs allocated at the first GPU failure
    failed_by_size: dict[int, int] = field(default_factory=dict)
    allocated: int = 0
    curve: list[tuple[int, float]] = field(default_factory=list)  # (submitted, share)
    stopped_early: bool = False
    infeasible: int = 0  # tasks set apart: they fit no node of the empty cluster

    @property
    def final_share(self) -> float:
        return self.allocated / self.total_gpus if self.total_gpus else 0.0

    def record(self, task: Task, node_model: str | None) -> None:
        """One task's outcome: ``node_model`` of the node it was bound to, None if failed."""
        self.submitted += 1
        if task.gpus:
            self.gpu_pods += 1
            if node_model is None:
                self.gpu_failed += 1
                self.failed_by_size[task.gpus] = self.failed_by_size.get(task.gpus, 0) + 1
                if self.first_failure_share is None:
                    self.first_failure_share = self.final_share
                if self.total_gpus - self.allocated >= task.gpus:
                    self.fragmentation_failures += 1
            else:
                self.allocated += task.gpus
                if task.models and node_model not in task.models:
                    self.constraint_violations += 1
        self.curve.append((self.submitted, self.final_share))


def fill_should_stop(recent_gpu_outcomes: Iterable[bool], window: int = 50) -> bool:
    """Fill mode ends once ``window`` GPU pods in a row failed (True = placed)."""
    outcomes = list(recent_gpu_outcomes)
    return len(outcomes) >= window and not any(outcomes[-window:])


def median_run(runs: Sequence[FillResult]) -> FillResult:
    """Of repeated fill runs of one scheduler (kube-scheduler breaks score ties at
    random), the one with the median first-failure share; a run that never failed
    ranks highest."""
    ordered = sorted(
        runs, key=lambda r: 1.0 if r.first_failure_share is None else r.first_failure_share
    )
    return ordered[(len(ordered) - 1) // 2]
