"""The sharing ways on the control plane (``trace_replay.py --mode sample --sharing``):
every seed's draw, by GPUs of work, under every way, one after the other on one
cluster whose GPU nodes share; tables in GPUs of work. The pure parts, and what each
way and measure is: tests/bench/sharing_bench.py."""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import re
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpu_scheduler import contract
from lab.processes import free_port
from lab.stack import bare_stack
from tests.bench.sampling import FRAGMENTATION_AT, split_feasible
from tests.bench.sharing_bench import (
    Way,
    WorkResult,
    cluster_models,
    draw_by_work,
    gpu_book,
    parse_ways,
    share_classes,
    share_fragmentation,
    share_pod_manifest,
    share_units,
    work_milli,
)
from tests.bench.trace import Task, TraceNode, node_manifest, pod_manifest
from tests.bench.trace_reports import _spread, extender_call_stats, extender_calls
from tests.bench.trace_runners import (
    Contender,
    _LogTail,
    clear_pods,
    scheduler_configs,
    submit,
)

#: The arrival levels tabled.
TABLE_LEVELS = (0.5, 0.75, 0.9, 1.0, 1.1, 1.3)


def way_config(configs: dict[str, dict[str, Any]], way: Way) -> dict[str, Any]:
    """The way's KubeSchedulerConfiguration: its profile's; for a share way of ours
    (unless ``deployed``) whose extender lists ``managedResources``, also
    ``gpu-scheduler.io/gpu-memory`` there, so kube-scheduler sends it pods that ask only
    a share (it sends an extender that lists them only the pods asking one of them)."""
    config = copy.deepcopy(configs[way.scheduler])
    if way.scheduler != "gpu-scheduler" or way.deployed or not way.shares:
        return config
    for extender in config.get("extenders") or []:
        managed = extender.get("managedResources")
        if managed and all(m.get("name") != contract.RESOURCE_GPU_MEMORY for m in managed):
            managed.append({"name": contract.RESOURCE_GPU_MEMORY, "ignoredByScheduler": False})
    return config


def run_sharing(
    opts: argparse.Namespace, nodes: list[TraceNode], all_tasks: list[Task]
) -> list[WorkResult]:
    """Every seed's draw under every way, on one cluster, one after the other."""
    tasks, apart = split_feasible(all_tasks, nodes)
    models = cluster_models(nodes)
    classes = share_classes(tasks, models)
    total = sum(n.gpus for n in nodes)
    seeds = [int(x) for x in opts.seeds.split(",") if x.strip()]
    ways = parse_ways(opts.ways)
    print(
        f"{opts.pods}: {len(nodes)} nodes ({total} GPUs, models {', '.join(models)}), "
        f"{len(tasks)} feasible tasks ({len(apart)} set apart), mode sample --sharing, "
        f"share {opts.share:g} of the GPUs in work, seeds {seeds}, scale {opts.scale}, "
        f"ways {', '.join(w.name for w in ways)}",
        flush=True,
    )
    results: list[WorkResult] = []
    started_all = time.monotonic()
    with bare_stack("trace-sharing-") as (stack, core):
        cluster = stack.cluster
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: core.create_node(node_manifest(n, sharing=True)), nodes))
        stack.start_extender()
        configs = scheduler_configs(f"http://127.0.0.1:{stack.extender_port}")
        tail = _LogTail(cluster.workdir / "logs" / "extender.log")
        stale: list[dict[str, Any]] = []  # what each extender kept of deleted pods
        for seed in seeds:
            drawn = draw_by_work(tasks, total, opts.share, seed)
            gpu_drawn = [t for t in drawn if t.gpus]
            print(
                f"  seed {seed}: {len(gpu_drawn)} GPU tasks drawn "
                f"({sum(1 for t in gpu_drawn if t.sharing)} sharing), "
                f"{sum(map(work_milli, gpu_drawn)) / 1000:.1f} GPUs of work",
                flush=True,
            )
            for way in ways:
                if way.scheduler == "gpu-scheduler":
                    kept = fresh_extender(stack, way.extender)
                    stale.append({"before": way.label, "seed": seed, "pods_cached": kept})
                tail.read()  # what came before this run is not its
                started = time.monotonic()
                contender = Contender(cluster, core, way.label, way_config(configs, way))
                whole = whole_profile(stack, core, way, configs) if way.split else None
                result = run_way(contender, way, drawn, nodes, classes, seed, whole)
                if whole is not None:
                    cluster.stop_process("extender-whole")
                result.infeasible = len(apart)
                results.append(result)
                calls = extender_call_stats(extender_calls(tail.read()))
                print(way_line(way, seed, result, calls, started), flush=True)
                clear_pods(core, None)  # the next run of ours gets a fresh extender
    print(f"  all runs: {time.monotonic() - started_all:.0f}s", flush=True)
    report_ways(opts, ways, results, len(nodes), len(tasks), stale)
    return results


def whole_profile(stack: Any, core: Any, way: Way, configs: dict[str, dict[str, Any]]) -> Contender:
    """A split way's second profile of ours, for its whole-GPU pods: a second extender
    (``way.whole_extender``; it watches the whole cluster, as the first does) and a
    kube-scheduler profile ``trace-gpu-scheduler-whole`` that calls it."""
    port, ops = free_port(), free_port()
    stack.spawn_extender(
        "extender-whole", port, way.whole_extender, extra=[f"--ops-port={ops}"], ops_port=ops
    )
    config = copy.deepcopy(configs["gpu-scheduler"])
    config["profiles"][0]["schedulerName"] = "trace-gpu-scheduler-whole"
    for extender in config.get("extenders") or []:
        extender["urlPrefix"] = f"http://127.0.0.1:{port}"
    return Contender(stack.cluster, core, f"{way.label}-whole", config)


def cached_pods(port: int) -> int | None:
    """The pods the extender's cache holds (its /readyz), None if it cannot tell."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            found = re.search(r"(\d+) pods cached", json.loads(r.read())["detail"])
    except (OSError, ValueError, KeyError):
        return None
    return int(found[1]) if found else None


def fresh_extender(stack: Any, config: dict[str, Any] | None, wait: float = 20.0) -> int | None:
    """Our extender restarted with ``config``, so each run of ours starts from a cache
    listed on the empty cluster. Returns the pods the old one still cached (up to
    ``wait`` seconds after the API server had none: 0 unless it missed deletions;
    None when none ran)."""
    kept = None
    if stack.extender_port:
        deadline = time.monotonic() + wait
        while (kept := cached_pods(stack.extender_port)) and time.monotonic() < deadline:
            time.sleep(1)
        if kept:
            print(f"  (the extender still caches {kept} pods of an empty cluster)", flush=True)
        stack.cluster.stop_process("extender")
    stack.start_extender(config)
    return kept


def run_way(
    contender: Contender,
    way: Way,
    tasks: list[Task],
    nodes: list[TraceNode],
    classes: list[Any],
    seed: int,
    whole: Contender | None = None,
) -> WorkResult:
    """The drawn GPU tasks in order, each waited for (bound or unschedulable; a failed
    pod is deleted), none leaving; each binding replayed on the per-GPU bookkeeping.
    ``whole``: the profile whole-GPU pods go to (a split way), else ``contender``'s."""
    core = contender.core
    total = sum(n.gpus for n in nodes)
    models = cluster_models(nodes)
    result = WorkResult(contender.name, seed, total, shares=way.shares)
    book = gpu_book(nodes)
    ours = way.scheduler == "gpu-scheduler"
    started = time.monotonic()
    with contextlib.ExitStack() as watching:
        outcomes = watching.enter_context(contender.watched())
        other = (whole, watching.enter_context(whole.watched())) if whole else None
        for i, task in enumerate(t for t in tasks if t.gpus):
            units = share_units(task, models) if way.shares else None
            scheduler, seen = (contender.scheduler, outcomes)
            if other is not None and not units:
                scheduler, seen = other[0].scheduler, other[1]
            manifest = (
                share_pod_manifest(task, units, scheduler)
                if units
                else pod_manifest(task, scheduler, ours=ours)
            )
            kind, detail, _ = submit(core, seen, task, scheduler, ours=ours, manifest=manifest)
            model = None
            if kind != "bound":
                result.refused(task, detail)
            if kind == "bound" and detail in book:
                model = book[detail].model
                if not book[detail].take(task, units):
                    result.misfits += 1
            result.record(task, model)
            if result.fragmentation is None and result.arrived >= FRAGMENTATION_AT * total:
                result.fragmentation = share_fragmentation(book.values(), classes)
            if (i + 1) % 1000 == 0:
                print(
                    f"  {contender.name} seed {seed}: {i + 1} GPU tasks, "
                    f"{result.arrived / total:.0%} arrived, {result.allocated / total:.1%} "
                    f"allocated, {result.gpu_failed} failed, {time.monotonic() - started:.0f}s",
                    flush=True,
                )
    return result


def way_line(
    way: Way, seed: int, r: WorkResult, calls: dict[str, dict[str, float]], started: float
) -> str:
    """One run's progress line."""
    at = {lv: r.at_level(lv) for lv in (0.5, 0.75, 0.9, 1.0)}
    line = (
        f"  {way.label} seed {seed}: work allocated at 50/75/90/100% arrived "
        + " / ".join(f"{v:.1%}" if v is not None else "-" for v in at.values())
        + f", first failure {r.first_failure_or_end:.1%}, unallocated at 100% "
        f"{r.unallocated_at(1.0) or 0:.1f} GPUs, {r.gpu_failed} failed "
        f"({r.failed_by_size.get(0, 0)} shares), {r.constraint_violations} violations, "
        f"{r.misfits} misfits"
    )
    if r.fragmentation:
        line += f", fragmented at 90% {r.fragmentation[0]:.1f} GPUs ({r.fragmentation[1]:.0%})"
    line += f", {r.gpu_pods} GPU pods in {time.monotonic() - started:.0f}s"
    for verb, v in calls.items():
        line += f"; {verb} p50 {v['p50_ms']:.2f} ms at {v['nodes_p50']:.0f} nodes"
    return line


def ways_table(runs: dict[str, list[WorkResult]]) -> str:
    """Median [range] over the seeds, one column per way."""
    names = list(runs)
    rows = ["| GPUs of work | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]

    def row(label: str, cell) -> None:  # type: ignore[no-untyped-def]
        rows.append(f"| {label} | " + " | ".join(cell(runs[n]) for n in names) + " |")

    for level in TABLE_LEVELS:
        row(
            f"allocated at {level:.0%} arrived",
            lambda rs, lv=level: _spread([v for r in rs if (v := r.at_level(lv)) is not None]),
        )
    row("allocated at the first failure", lambda rs: _spread([r.first_failure_or_end for r in rs]))
    row(
        "unallocated GPUs at 100% arrived",
        lambda rs: _spread([v for r in rs if (v := r.unallocated_at(1.0)) is not None], "{:.1f}"),
    )
    row(
        f"fragmented GPUs at {FRAGMENTATION_AT:.0%} arrived (% of free)",
        lambda rs: (
            _spread([r.fragmentation[0] for r in rs if r.fragmentation], "{:.1f}")
            + " ("
            + _spread([r.fragmentation[1] for r in rs if r.fragmentation], "{:.0%}")
            + ")"
        ),
    )
    row(
        "failed GPU pods (share/1/2/4/8), median",
        lambda rs: "/".join(
            f"{statistics.median(r.failed_by_size.get(s, 0) for r in rs):g}"
            for s in (0, 1, 2, 4, 8)
        ),
    )
    row(
        "model-constraint violations, all seeds",
        lambda rs: str(sum(r.constraint_violations for r in rs)),
    )
    row("bindings the per-GPU rule refuses, all seeds", lambda rs: str(sum(r.misfits for r in rs)))
    return "\n".join(rows)


def seeds_table(results: list[WorkResult]) -> str:
    """One row per way and seed: work allocated at 50/75/90/100% arrived and at the
    first failure, unallocated GPUs at 100%, violations, failed pods."""
    rows = [
        "| way | seed | 50% | 75% | 90% | 100% | first failure | unallocated GPUs at 100% "
        "| violations | failed (shares) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        at = [r.at_level(lv) for lv in TABLE_LEVELS[:4]]
        cells = [f"{v:.1%}" if v is not None else "-" for v in at]
        rows.append(
            f"| {r.scheduler} | {r.seed} | "
            + " | ".join(cells)
            + f" | {r.first_failure_or_end:.1%} "
            f"| {r.unallocated_at(1.0) or 0:.1f} | {r.constraint_violations} "
            f"| {r.gpu_failed} ({r.failed_by_size.get(0, 0)}) |"
        )
    return "\n".join(rows)


def reasons_lines(runs: dict[str, list[WorkResult]], top: int = 6) -> str:
    """Per way, its most frequent failure messages over all seeds."""
    lines = []
    for label, rs in runs.items():
        counts: dict[str, int] = {}
        for r in rs:
            for reason, n in r.reasons.items():
                counts[reason] = counts.get(reason, 0) + n
        lines.append(f"- {label}: why pods failed (all seeds)")
        for reason, n in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"    {n} x {reason}")
    return "\n".join(lines)


def result_record(r: WorkResult) -> dict[str, Any]:
    """A run's figures as JSON."""
    return {
        "way": r.scheduler,
        "seed": r.seed,
        "total_gpus": r.total_gpus,
        "levels": {f"{lv:g}": r.at_level(lv) for lv in TABLE_LEVELS},
        "first_failure": r.first_failure_or_end,
        "unallocated_at_100": r.unallocated_at(1.0),
        "fragmentation_at_90": list(r.fragmentation) if r.fragmentation else None,
        "gpu_pods": r.gpu_pods,
        "failed": r.gpu_failed,
        "failed_by_size": {str(k): v for k, v in sorted(r.failed_by_size.items())},
        "violations": r.constraint_violations,
        "misfits": r.misfits,
        "arrived_gpus": r.arrived,
        "allocated_gpus": r.allocated,
        "reasons": dict(sorted(r.reasons.items(), key=lambda kv: -kv[1])),
        "failures": r.failures,
    }


def report_ways(
    opts: argparse.Namespace,
    ways: list[Way],
    results: list[WorkResult],
    nodes: int,
    tasks: int,
    stale: list[dict[str, Any]] | None = None,
) -> None:
    """The tables (printed), and every run's figures into ``--results`` when given."""
    runs: dict[str, list[WorkResult]] = {w.label: [] for w in ways}
    for r in results:
        runs[r.scheduler].append(r)
    print()
    print(ways_table(runs))
    print()
    print(seeds_table(results))
    print()
    print(reasons_lines(runs))
    if opts.results:
        path = Path(opts.results)
        data = {
            "pods": opts.pods,
            "scale": opts.scale,
            "share": opts.share,
            "seeds": opts.seeds,
            "nodes": nodes,
            "feasible_tasks": tasks,
            "runs": [result_record(r) for r in results],
            "stale_extender_cache": stale or [],
        }
        path.write_text(json.dumps(data, indent=1))
