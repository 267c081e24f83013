"""Placement quality on the openb production trace: three schedulers side by side.

    .venv/bin/python tests/bench/trace_replay.py --pods openb_pod_list_default.csv \\
        [--mode fill|replay|sample] [--scale 1.0] [--seed 7] [--write-docs]
        [--compress 5000] [--speedup 2] [--patience 120]    # replay only
        [--seeds 42,43,44] [--share 1.3] [--variants NAME:WEIGHTS;...]  # sample only
        [--percentages default,50,100]                                 # sample only
        [--sharing] [--ways whole,bestfit,full,default,mostallocated] [--results F.json]

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
        "binpack:gpu=3,scarcity=6;fgd:fragmentation=10,gpu=0,scarcity=0"; a pair
        filterChooses=false sets that switch: "picks:;both:filterChooses=false").
        --percentages runs our profile once per kube-scheduler
        percentageOfNodesToScore (set on the profile; "default": unset, i.e. adaptive,
        50 - nodes/125 %, at least 5% and 100 nodes), labelled
        gpu-scheduler[pct=N]; with both, every weight set at every percentage. Our
        extender's per-call handler time and candidate-node count (from its log) are
        tabled per variant. --sharing runs the sharing ways instead, side by side on
        one cluster whose GPU nodes share (tests/bench/sharing_bench.py): a sharing
        task asks its share of one GPU's memory in the share ways; draws, arrival
        levels and allocation are in GPUs of work (a sharing task counts gpu_milli).

In every mode, tasks that fit no node type of the empty cluster are set apart up
front: never submitted, never a failure (tests/bench/sampling.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


from lab.stack import bare_stack  # noqa: E402
from tests.bench.replay import Arrival, replay_schedule  # noqa: E402
from tests.bench.sampling import (  # noqa: E402
    SampleResult,
    draw,
    split_feasible,
    task_classes,
)
from tests.bench.sharing_runs import run_sharing  # noqa: E402
from tests.bench.trace import (  # noqa: E402
    Task,
    TraceNode,
    find_trace_dir,
    load_nodes,
    load_tasks,
    median_run,
    node_manifest,
    sample,
)
from tests.bench.trace_options import (  # noqa: E402, F401  (re-exported: the tests' names)
    SWITCHES,
    parse_args,
    parse_percentages,
    parse_variants,
    variant_label,
)
from tests.bench.trace_reports import (  # noqa: E402
    extender_call_stats,
    extender_calls,
    fill_table,
    latency_table,
    plot_fill,
    plot_replay,
    plot_sample,
    repeat_row,
    replay_table,
    sample_table,
    view_lag,
    write_docs,
)
from tests.bench.trace_runners import (  # noqa: E402
    SCHEDULERS,
    Contender,
    _LogTail,
    clear_pods,
    nodes_to_find,
    run_fill,
    run_replay,
    run_sample,
    scheduler_configs,
    with_percentage,
)


def main(argv: list[str] | None = None) -> int:
    return 0 if run(parse_args(argv)) else 1


def run(opts: argparse.Namespace) -> list[Any]:

    trace = find_trace_dir()
    nodes: list[TraceNode] = sample(
        load_nodes(trace / opts.nodes), opts.scale, opts.seed, key=lambda n: n.model
    )
    if opts.sharing and opts.mode != "sample":
        raise SystemExit("--sharing is for sample mode")
    if opts.mode == "sample":
        runner = run_sharing if opts.sharing else run_samples
        return runner(opts, nodes, load_tasks(trace / opts.pods))
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
                contender = Contender(cluster, core, name, configs[name])
                result = run_fill(contender, tasks, model_of, total_gpus)
                print(
                    f"  {name}: first failure at {result.first_failure_share or 0:.1%}, "
                    f"end {result.final_share:.1%}, {time.monotonic() - started:.0f}s",
                    flush=True,
                )
            else:
                result = run_replay(
                    Contender(cluster, core, name, configs[name]),
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
    size = (
        f"{len(nodes)} nodes, {total_gpus} GPUs, {len(tasks)} tasks "
        f"({len(apart)} more set apart as infeasible)"
    )
    if opts.mode == "fill":
        report_fill(opts, names, results, size)
    else:
        report_replay(opts, results, arrivals, size)
    return results


def report_fill(opts: argparse.Namespace, names: list[str], results: list[Any], size: str) -> None:
    """Fill mode's table (the median run per scheduler), and its docs section and plot."""
    stem = Path(opts.pods).stem.replace("openb_pod_list_", "")
    when = time.strftime("%Y-%m-%d %H:%M")
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


def report_replay(
    opts: argparse.Namespace, results: list[Any], arrivals: list[Arrival], size: str
) -> None:
    """Replay mode's table, and its docs section and plot."""
    stem = Path(opts.pods).stem.replace("openb_pod_list_", "")
    when = time.strftime("%Y-%m-%d %H:%M")
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
    lags: dict[str, list[dict[str, float]]] = {}  # our variants' view lag, per seed
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
                        Contender(cluster, core, label, with_percentage(configs[name], pct)),
                        drawn,
                        nodes,
                        classes,
                        seed,
                        ours=name == "gpu-scheduler",
                    )
                    result.infeasible = len(apart)
                    results.append(result)
                    ours = None
                    if name == "gpu-scheduler":
                        lines = tail.read()
                        these = extender_calls(lines)
                        calls.setdefault(label, []).extend(these)
                        ours = extender_call_stats(these)
                        lag = view_lag(lines, result.bound_before)
                        lags.setdefault(label, []).append(lag)
                        ours["view lag"] = lag
                    print(sample_line(label, seed, result, ours, started), flush=True)
                    clear_pods(core, stack.extender_port)
    report_samples(opts, names, nodes, len(tasks), len(apart), results, calls, lags)
    return results


def sample_line(
    label: str,
    seed: int,
    result: SampleResult,
    calls: dict[str, dict[str, float]] | None,
    started: float,
) -> str:
    """One sample run's progress line (with our extender's per-verb figures)."""
    line = (
        f"  {label} seed {seed}: at 100% arrived {result.at_level(1.0) or 0:.1%}, "
        f"first failure {result.first_failure_or_end:.1%}, "
    )
    if result.fragmentation:
        line += (
            f"fragmented at 90% {result.fragmentation[0]:.0f} GPUs "
            f"({result.fragmentation[1]:.0%} of free), "
        )
    line += f"{result.gpu_failed} failed, {time.monotonic() - started:.0f}s"
    for verb, v in (calls or {}).items():
        if verb == "view lag":
            line += (
                f"; view behind the bindings on {v['share']:.1%} of scoring calls "
                f"(by {v['pods_behind_mean']:.1f} pods on average)"
            )
            continue
        line += (
            f"; {verb} p50 {v['p50_ms']:.2f} ms p99 {v['p99_ms']:.2f} ms "
            f"at {v['nodes_p50']:.0f} nodes"
        )
    return line


def report_samples(
    opts: argparse.Namespace,
    names: list[str],
    nodes: list[TraceNode],
    feasible: int,
    apart: int,
    results: list[SampleResult],
    calls: dict[str, list[tuple[str, float, int]]],
    lags: dict[str, list[dict[str, float]]],
) -> None:
    """Sample mode's tables (median and range over the seeds; our extender's calls and
    how often its view lagged the bindings), and its docs section and plot."""
    total_gpus = sum(n.gpus for n in nodes)
    runs: dict[str, list[SampleResult]] = {}
    for r in results:
        runs.setdefault(r.scheduler, []).append(r)
    table = sample_table(runs)
    latencies = latency_table({k: extender_call_stats(v) for k, v in calls.items()})
    lag_lines = "\n".join(
        f"- {label}: the view lagged the bindings on "
        + ", ".join(f"{lag['share']:.1%}" for lag in per_seed)
        + " of scoring calls (per seed; "
        + ", ".join(f"{lag['pods_behind_mean']:.1f}" for lag in per_seed)
        + " pods behind on average when it did)"
        for label, per_seed in lags.items()
    )
    print()
    print(table)
    print()
    print(latencies)
    print(lag_lines)
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
            f"{len(nodes)} nodes, {total_gpus} GPUs; {feasible} feasible tasks to draw "
            f"from ({apart} set apart as infeasible); run "
            f"{time.strftime('%Y-%m-%d %H:%M')}. Median over the seeds [range].\n\n"
            f"{table}\n\n"
            + (f"Our extender's calls:\n\n{latencies}\n\n" if calls else "")
            + (f"{lag_lines}\n\n" if lags else "")
            + f"![GPU allocation against GPUs arrived]({png.name})\n",
            f"sample-{stem}{variant}",
        )


if __name__ == "__main__":
    sys.exit(main())
