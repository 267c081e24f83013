"""The real kube-scheduler placing GPU pods: no extender, a bare echo extender, ours
(filter + prioritize) and ours prioritize-only, in one run on one control plane.

    .venv/bin/python tests/bench/e2e_throughput.py [--pods 1000] [--nodes 500] [--qps 2000]

One control plane, our extender (cluster mode, one worker, as deploy/ runs it) and a
bare echo extender (the same Flask app shape, served by the same gunicorn worker and
settings as ours, orjson both ways: every node passes, every score 0; the protocol's
floor on our server), and ``--nodes`` GPU nodes (8 GPUs each). For each variant the pods
are created first, for a scheduler that is not running yet; then that kube-scheduler
starts and we time the bindings (first to last, so informer start-up is not counted);
then the pods are deleted and our extender's cache is seen empty before the next (each
round runs the variants in turn, their order turned by one from the round before):
  - without:    deploy/'s gpu-scheduler profile with the extender removed;
  - bare:       the same profile with the bare echo extender (filter + prioritize);
  - bare-first: the same, the bare extender's filter answering the first candidate
                alone: the floor of a filter that picks (one round trip, and no
                scoring pass in kube-scheduler);
  - ours:       deploy/'s profile as shipped (filter, which picks where the pod asks
                for no preferences: extender/choice.py; prioritize where it does);
  - ours-prio:  deploy/'s profile with only the prioritize verb;
  - plugins:    the plugins path: our kube-scheduler (GPUScheduler, SpotScheduler,
                AZScheduler compiled in; tools/k8s/build.sh plugins) with
                deploy/scheduler/plugins/'s profile, no extender;
  - plugins-none: our kube-scheduler of the plugins path with the profile of
                ``without``: what the binary alone costs, none of our plugins run;
  - plugins-base: with ``--plugins-base BINARY``, the plugins path with another build
                of our kube-scheduler (an earlier commit's): before and after in one run;
  - ours-base:  with ``--base-tree DIR`` (a checkout of another commit, e.g. ``git
    worktree add /tmp/base HEAD~3``), deploy/'s profile with the extender of that
    tree, started beside ours: before and after in one run, round by round;
    ``--base-tree NAME=DIR`` (repeatable) names the variant ``ours-NAME``: several
    checkouts at once (an A/B of each of several mechanisms).
kube-scheduler's client rate limit (``clientConnection.qps``/``burst``, 50/100 by
default) caps a scheduler at about 50 bindings a second whatever the extender does, so
it is raised to ``--qps`` in every variant (``--qps 0`` keeps deploy/'s: 300/600).
``--split-cpus`` runs the control plane (etcd, the API server, the controller manager,
each kube-scheduler) on CPU 0 and both extenders on the other CPUs, so that the
extenders' CPU is not taken from kube-scheduler's (on a real control plane the
extender has cores of its own); by default everything shares every CPU.
Prints pods/s per variant and the ratios to bare and to without; per round, the
extender's own handler medians (from its log) and the CPU milliseconds a pod of
each component (tests/bench/proc_cpu.py), and at the end the CPU table.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import re
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gpu_scheduler import contract  # noqa: E402
from lab.controlplane import plugins_scheduler  # noqa: E402
from lab.kubelet_shim import node_object  # noqa: E402
from lab.processes import free_port  # noqa: E402
from lab.stack import (  # noqa: E402
    bare_stack,
    plugins_config,
    plugins_scheduler_flags,
    scheduler_config,
)
from tests.bench import proc_cpu  # noqa: E402
from tests.bench.extender_bench import BARE_APP, BARE_ON_OUR_SERVER  # noqa: E402
from tests.bench.trace_reports import call_records  # noqa: E402
from tests.bench.trace_runners import NAMESPACE, clear_pods  # noqa: E402
from tests.helpers import running  # noqa: E402

TAINT = {"key": contract.RESOURCE_GPU, "value": "present", "effect": "NoSchedule"}
VARIANTS = (
    "without",
    "bare",
    "bare-first",
    "ours",
    "ours-prio",
    "plugins",
    "plugins-base",
    "plugins-none",
    "ours-base",
)
SIZES = [1, 1, 2, 4, 1, 2, 8, 1]


def gpu_node(name: str) -> dict[str, Any]:
    labels = {
        contract.LABEL_GPU_PRESENT: "true",
        contract.LABEL_GPU_COUNT: "8",
        contract.LABEL_GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3",
        contract.LABEL_GPU_MEMORY: "81559",
        contract.LABEL_ZONE: f"zone-{sum(map(ord, name)) % 3}",
    }
    return node_object(name, labels=labels, gpus=8, cpu="192", memory="2Ti", taints=[TAINT])


def gpu_pod(name: str, variant: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": variant}},
        "spec": {
            "schedulerName": f"bench-{variant}",
            "tolerations": [
                {"key": contract.RESOURCE_GPU, "operator": "Exists", "effect": "NoSchedule"}
            ],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {contract.RESOURCE_GPU: str(gpus)},
                    },
                }
            ],
        },
    }


def variant_config(variant: str, ours: str, urls: dict[str, str], qps: int) -> dict[str, Any]:
    """deploy/'s KubeSchedulerConfiguration for one variant, its profile named
    ``bench-<variant>``, the client rate limit raised to ``qps`` (burst the same);
    ``urls``: the extender of a variant that is not served by ours (bare, ours-base)."""
    if variant in ("plugins", "plugins-base"):
        cfg = plugins_config(profile=f"bench-{variant}")
    else:
        cfg = scheduler_config(urls.get(variant, ours), profile=f"bench-{variant}")
    if variant == "bare-first":
        for extender in cfg["extenders"]:
            extender["filterVerb"] = "filter-first"
    if variant in ("without", "plugins-none"):
        cfg.pop("extenders")
    elif variant == "ours-prio":
        for extender in cfg["extenders"]:
            extender.pop("filterVerb")
    if qps:
        cfg["clientConnection"] = {"qps": qps, "burst": qps}
    return copy.deepcopy(cfg)


#: kube-scheduler's own record of a binding (klog at -v=2), with its time of day.
BOUND = re.compile(r"^I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*\"Successfully bound pod to node\"")


def binding_times(log: str) -> list[float]:
    """Seconds since midnight of each binding in a kube-scheduler log, in order."""
    times = []
    for line in log.splitlines():
        found = BOUND.match(line)
        if found:
            hours, minutes, seconds = found.groups()
            times.append(int(hours) * 3600 + int(minutes) * 60 + float(seconds))
    return times


def measure(
    cluster: Any,
    variant: str,
    config: dict[str, Any],
    pods: int,
    plugins: Path | None = None,
    pprof: Path | None = None,
) -> tuple[float, dict[str, float]]:
    """Bindings per second, first to last, of ``pods`` pods made for ``variant``, from
    kube-scheduler's own log (its timestamps; no watch of ours to fall behind), and
    the CPU each component spent from about the first binding to the last
    (tests/bench/proc_cpu.py; the log is read as it grows, every 50 ms). ``plugins``:
    our kube-scheduler of the plugins path, to run instead of the control plane's;
    ``pprof``: a folder where kube-scheduler's CPU profile from its first binding on
    (``/debug/pprof/profile``, PPROF_SECONDS) is written as ``<variant>.pprof``, and
    its ``/metrics`` once every pod is bound as ``<variant>.metrics`` (the batching's
    counters: how many pods took the node hint)."""
    args = [*(plugins_scheduler_flags(cluster.minor) if plugins else ())]
    if pprof:
        args.append(
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/debug/pprof/*,/metrics"
        )
    proc = cluster.start_scheduler(f"scheduler-{variant}", config, plugins, args)
    profiling: Future[None] | None = None
    deadline = time.monotonic() + 900
    seen, offset, tail = 0, 0, b""
    first: tuple[int, proc_cpu.Snapshot] | None = None
    last: tuple[int, proc_cpu.Snapshot] | None = None
    while time.monotonic() < deadline:
        with proc.log_path.open("rb") as log:
            log.seek(offset)
            chunk = log.read()
        offset += len(chunk)
        lines = (tail + chunk).split(b"\n")
        tail = lines.pop()
        seen += len(binding_times(b"\n".join(lines).decode(errors="replace")))
        if seen and first is None:
            first = (seen, proc_cpu.snapshot())
            if pprof:
                profiling = PROFILER.submit(profile, proc.args, pprof / f"{variant}.pprof")
        if seen >= pods:
            last = (seen, proc_cpu.snapshot())
            break
        time.sleep(0.05)
    try:
        if profiling:
            profiling.result()
        if pprof and last is not None:
            fetch(proc.args, "/metrics", pprof / f"{variant}.metrics")
    finally:
        cluster.stop_process(proc.name)
    times = binding_times(proc.log_path.read_text(errors="replace"))
    if len(times) < pods or first is None or last is None:
        raise RuntimeError(f"{variant}: only {len(times)} of {pods} pods bound")
    span = (times[-1] - times[0]) % 86400  # a run across midnight
    spent = proc_cpu.per_item_ms(last[1].minus(first[1]), max(1, last[0] - first[0]))
    return (len(times) - 1) / span, spent


#: How long a profile of kube-scheduler runs (``--pprof``): about 2,500 pods' worth.
PPROF_SECONDS = 8
PROFILER = ThreadPoolExecutor(1)


def profile(args: list[str], out: Path) -> None:
    """kube-scheduler's CPU profile over PPROF_SECONDS, written to ``out``."""
    fetch(args, f"/debug/pprof/profile?seconds={PPROF_SECONDS}", out)


def fetch(args: list[str], path: str, out: Path) -> None:
    """``path`` from the secure port in kube-scheduler's ``args``, written to ``out``."""
    import ssl
    import urllib.request

    port = next(a.split("=", 1)[1] for a in args if a.startswith("--secure-port="))
    insecure = ssl._create_unverified_context()  # the lab's self-signed serving cert
    url = f"https://127.0.0.1:{port}{path}"
    with urllib.request.urlopen(url, timeout=PPROF_SECONDS + 30, context=insecure) as r:
        out.write_bytes(r.read())


#: The extender's counter of what became of prioritize's prepared answers (trees
#: with extender/prepared.py; absent from the others).
PREPARED = "gpu_scheduler_extender_prepared_answers_total"


def prepared_in(text: str) -> dict[str, float]:
    """The prepared-answer counters in a /metrics text, by outcome; {} where the
    extender has no such counter (a tree without extender/prepared.py)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == PREPARED
    }


def prepared_counts(ops_port: int) -> dict[str, float]:
    """The extender's prepared-answer counters, read from its ops port."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{ops_port}/metrics", timeout=10) as r:
        return prepared_in(r.read().decode())


#: Fields of the extender's per-call log line whose medians a round reports.
TIMINGS = ("ms", "prepared_after_ms", "prepared_wait_ms", "prepared_ms")


def handler_timings(lines: list[str]) -> dict[str, dict[str, float]]:
    """Per verb, the medians of the handler's own timings in the extender's JSON log
    lines (``ms``: the call's time in the handler; for a prepared prioritize answer,
    how long after filter's answer the call came, how long it waited for the
    preparation, and how long the preparation took)."""
    seen: dict[str, dict[str, list[float]]] = {}
    for verb, record in call_records(lines):
        for key in TIMINGS:
            if isinstance(record.get(key), int | float):
                seen.setdefault(verb, {}).setdefault(key, []).append(record[key])
    return {
        verb: {key: statistics.median(values) for key, values in fields.items()}
        for verb, fields in seen.items()
    }


def handler_line(log: Path, offset: int) -> str:
    """The round's handler timings (what the extender logged since ``offset``), as a
    line of the bench's output, or nothing where the extender was not asked."""
    with log.open("rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    timings = handler_timings(lines)
    if not timings:
        return ""
    return "\n    handler medians, ms: " + "; ".join(
        f"{verb} " + ", ".join(f"{k} {v:.3f}" for k, v in fields.items())
        for verb, fields in timings.items()
    )


def wait_answering(url: str, timeout: float) -> None:
    """Until something answers HTTP at ``url`` (any status)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def table(results: dict[str, float], nodes: int, pods: int, qps: int) -> str:
    rows = [
        f"{pods} GPU pods over {nodes} nodes (8 GPUs each), client qps/burst {qps or 'as deploy/'}",
        "",
        "| variant | pods/s | ÷ bare | ÷ bare-first | ÷ without |",
        "|---|---:|---:|---:|---:|",
    ]
    for variant, rate in results.items():
        ratios = [f"{rate / results[base]:.2f}" if results.get(base) else "" for base in BASES]
        rows.append(f"| {variant} | {rate:.1f} | " + " | ".join(ratios) + " |")
    return "\n".join(rows)


#: What each rate is divided by, where that variant ran.
BASES = ("bare", "bare-first", "without")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--qps", type=int, default=2000, help="kube-scheduler client qps=burst")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the variants this many times, interleaved (each round turns their order by one)",
    )
    parser.add_argument(
        "--split-cpus",
        action="store_true",
        help="the control plane on CPU 0, both extenders on the others (as where the "
        "extender does not share kube-scheduler's and the API server's cores)",
    )
    parser.add_argument(
        "--pprof",
        type=Path,
        help="a folder for kube-scheduler's CPU profile of each variant and round",
    )
    parser.add_argument(
        "--base-tree",
        action="append",
        default=[],
        help="a checkout of another commit (DIR: variant ours-base; NAME=DIR: ours-NAME); "
        "repeatable",
    )
    parser.add_argument(
        "--plugins-base",
        type=Path,
        help="another build of our kube-scheduler (variant plugins-base), e.g. the "
        "cached build of an earlier commit: the plugins before and after in one run",
    )
    opts = parser.parse_args(argv)
    variants = [v for v in opts.variants.split(",") if v]
    bases = base_trees(opts.base_tree)
    variants += [v for v in bases if v not in variants]
    unknown = set(variants) - set(VARIANTS) - set(bases)
    if unknown:
        parser.error(f"unknown variants: {sorted(unknown)}")
    if "ours-base" in variants and "ours-base" not in bases:
        parser.error("ours-base needs --base-tree")
    if ("plugins-base" in variants) != bool(opts.plugins_base):
        parser.error("plugins-base and --plugins-base go together")

    plane, extenders = _cpus(opts.split_cpus)
    os.sched_setaffinity(0, plane)  # what this process starts runs there
    with bare_stack("e2e-throughput-") as (stack, core):
        cluster, work = stack.cluster, stack.workdir
        # Found once: a checkout edited while the bench runs must not change it.
        ours_built = {"plugins", "plugins-none"} & set(variants)
        binary = plugins_scheduler(cluster.minor) if ours_built else None
        schedulers = {"plugins": binary, "plugins-none": binary, "plugins-base": opts.plugins_base}
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: core.create_node(gpu_node(f"n-{i:05d}")), range(opts.nodes)))
        print(f"created {opts.nodes} nodes in {time.monotonic() - started:.0f} s", flush=True)
        os.sched_setaffinity(0, extenders)
        extender_log = stack.start_extender().log_path
        (work / "bare.py").write_text(BARE_APP + BARE_ON_OUR_SERVER)
        bare_port = free_port()
        bare_cmd = [sys.executable, str(work / "bare.py"), str(bare_port), "4"]
        ours = f"http://127.0.0.1:{stack.extender_port}"
        urls = {v: f"http://127.0.0.1:{bare_port}" for v in ("bare", "bare-first")}
        # (ops port, log) of the extender that answers each variant
        served = {v: (stack.extender_ops_port, extender_log) for v in variants}
        runs: dict[str, list[float]] = {v: [] for v in variants}
        cpu: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
        with contextlib.ExitStack() as others:
            others.enter_context(
                running(bare_cmd, work / "bare.log", env={"PYTHONPATH": str(ROOT)})
            )
            for variant, tree in bases.items():
                urls[variant], *base = others.enter_context(base_extender(stack, tree, variant))
                served[variant] = (base[0], base[1])
            os.sched_setaffinity(0, plane)  # the kube-schedulers, one a round
            wait_answering(f"http://127.0.0.1:{bare_port}/", 30)
            for round_, variant in (
                (r, v) for r in range(opts.rounds) for v in round_order(variants, r)
            ):
                config = variant_config(variant, ours, urls, opts.qps)
                ops_port, log_path = served[variant]
                with ThreadPoolExecutor(16) as pool:
                    list(
                        pool.map(
                            lambda i, v=variant: core.create_namespaced_pod(
                                NAMESPACE, gpu_pod(f"{v}-{i:05d}", v, SIZES[i % len(SIZES)])
                            ),
                            range(opts.pods),
                        )
                    )
                name = f"{variant}-{round_}"
                before = prepared_counts(ops_port)
                log_offset = log_path.stat().st_size
                plugins = schedulers.get(variant)
                if opts.pprof:
                    opts.pprof.mkdir(parents=True, exist_ok=True)
                rate, spent = measure(cluster, name, config, opts.pods, plugins, opts.pprof)
                runs[variant].append(rate)
                cpu[variant].append(spent)
                after = prepared_counts(ops_port)
                moved = {k: int(v - before.get(k, 0)) for k, v in after.items()}
                moved = {k: v for k, v in moved.items() if v}
                print(
                    f"  {variant} (round {round_ + 1}): {rate:.1f} pods/s"
                    + f" ({unstolen(rate, spent):.1f} adjusted for steal)"
                    + (f"; prioritize's prepared answers: {moved}" if moved else "")
                    + handler_line(log_path, log_offset)
                    + "\n    CPU ms a pod: "
                    + ", ".join(
                        f"{k} {v:.0%}" if k in proc_cpu.SHARES else f"{k} {v:.2f}"
                        for k, v in spent.items()
                    ),
                    flush=True,
                )
                clear_pods(core, stack.extender_port)
    results = {v: statistics.median(rates) for v, rates in runs.items()}
    print()
    print(table(results, opts.nodes, opts.pods, opts.qps))
    if opts.rounds > 1:
        print(
            "\nevery round (pods/s): "
            + "; ".join(f"{v} {', '.join(f'{r:.1f}' for r in rates)}" for v, rates in runs.items())
        )
        adjusted = {v: [unstolen(r, c) for r, c in zip(runs[v], cpu[v], strict=True)] for v in runs}
        for base in ("bare", "bare-first"):
            if runs.get(base):
                print(paired(runs, base))
                print(paired(adjusted, base, " (each rate adjusted for steal)"))
    print()
    print(cpu_table(cpu))
    return 0


def base_trees(specs: list[str]) -> dict[str, Path]:
    """``--base-tree`` values as {variant: checkout}: DIR is ``ours-base``, NAME=DIR
    is ``ours-NAME``."""
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        out[f"ours-{name}" if sep else "ours-base"] = Path(path if sep else spec)
    return out


@contextlib.contextmanager
def base_extender(
    stack: Any, tree: Path, variant: str = "ours-base"
) -> Iterator[tuple[str, int, Path]]:
    """The extender of another checkout (``tree``), started as the stack starts ours
    (cluster mode, the same API server and heartbeat namespace) but from that tree,
    and marked for the CPU accounting: (its URL, its ops port, its log)."""
    tree = tree.resolve()
    if not (tree / "gpu_scheduler" / "cli.py").is_file():
        raise SystemExit(f"--base-tree {tree}: not a checkout of this project")
    port, ops = free_port(), free_port()
    cli = [sys.executable, "-X", proc_cpu.BASE_MARK, "-m", "gpu_scheduler.cli"]
    proc = stack.spawn_extender(
        f"extender-{variant}", port, extra=[f"--ops-port={ops}"], ops_port=ops, cli=cli, tree=tree
    )
    try:
        yield f"http://127.0.0.1:{port}", ops, proc.log_path
    finally:
        stack.cluster.stop_process(proc.name)


def _cpus(split: bool) -> tuple[set[int], set[int]]:
    """(the control plane's CPUs, the extenders'): all for both, or split: CPU 0 for
    the control plane (its Go processes size themselves to it), the rest for the two
    extenders."""
    every = os.sched_getaffinity(0)
    if not split:
        return every, every
    if len(every) < 2:
        raise SystemExit("--split-cpus needs two CPUs or more")
    first = min(every)
    return {first}, every - {first}


def cpu_table(cpu: dict[str, list[dict[str, float]]]) -> str:
    """CPU milliseconds a pod by component and variant (medians of the rounds), and
    how busy the machine was: what each variant's pods cost the shared cores."""
    seen = {k for rounds in cpu.values() for r in rounds for k in r}
    components = sorted(seen - set(proc_cpu.SHARES))
    rows = [
        "CPU ms a pod, first binding to last (medians of the rounds)",
        "",
        "| variant | " + " | ".join(components) + " | all of these | machine busy | stolen |",
        "|---|" + "---:|" * (len(components) + 3),
    ]
    for variant, rounds in cpu.items():
        if not rounds:
            continue
        cells = [statistics.median(r.get(k, 0.0) for r in rounds) for k in components]
        busy, stolen = (statistics.median(r.get(k, 0.0) for r in rounds) for k in proc_cpu.SHARES)
        rows.append(
            f"| {variant} | "
            + " | ".join(f"{c:.2f}" for c in cells)
            + f" | {sum(cells):.2f} | {busy:.0%} | {stolen:.0%} |"
        )
    return "\n".join(rows)


def unstolen(rate: float, spent: dict[str, float]) -> float:
    """A round's rate had the hypervisor not taken part of the cores: the rate times
    busy / (busy - stolen). An estimate, for a run that is bound by CPU: this VM's
    steal went from 1% to 46% of the cores within minutes, and moved a variant's
    rate twofold from one round to the next."""
    busy, stolen = (spent.get(k, 0.0) for k in proc_cpu.SHARES)
    return rate * busy / (busy - stolen) if busy > stolen > 0 else rate


def round_order(variants: list[str], round_: int) -> list[str]:
    """The variants in the order round ``round_`` runs them: turned by one each round,
    so that none is always first or last (etcd's database grows through a round with
    each variant's pods and Events until the API server compacts it, and the VM's
    speed drifts within minutes: a fixed order would give one variant the same place
    in every round)."""
    turn = round_ % len(variants) if variants else 0
    return variants[turn:] + variants[:turn]


def paired(runs: dict[str, list[float]], base: str, label: str = "") -> str:
    """Each variant's rate over ``base``'s in the same round (the rounds interleave the
    variants, so a pair ran minutes apart at most), and the median of those: on a VM
    whose hypervisor takes a varying share of the cores, steadier than the ratio of
    the medians."""
    lines = []
    for variant, rates in runs.items():
        if variant == base or not runs.get(base):
            continue
        ratios = [rate / b for rate, b in zip(rates, runs[base], strict=False) if b]
        if ratios:
            each = ", ".join(f"{r:.2f}" for r in ratios)
            middle = statistics.median(ratios)
            lines.append(f"{variant} ÷ {base}{label}, round by round: {each}; median {middle:.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
