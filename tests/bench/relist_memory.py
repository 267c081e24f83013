"""The extender's memory while it lists a big cluster: before and after, in one run.

    .venv/bin/python tests/bench/relist_memory.py --nodes 5000 --pods 50000 \\
        --tree before=/tmp/before --tree after=.

One control plane, filled by :mod:`tests.bench.scale_lab` (or an existing one:
``--kubeconfig``, e.g. a lab kept up by ``scale_lab.py --keep``). For each source tree
in turn, the extender in cluster mode (``--workers 1``: gunicorn's master and one
worker, the worker holding the cache) is started from that tree (its directory first
on the path, this checkout's .venv for the dependencies), and the RSS and VmHWM of
its processes (the master and its descendants) are read from /proc/PID/status every
``--interval`` seconds, from start until ``--after-ready`` seconds after its ops port's
/readyz answers 200, when it is stopped. The first list at start is the relist that
is measured: it reads every node and every bound pod, a page at a time.

Reported per process and summed over the tree:
  - peak RSS: the highest sampled RSS (summed: the highest sum in one sample);
  - VmHWM: the kernel's high-water mark of RSS (catches a peak between samples;
    summed: the sum of the processes' marks, an upper bound);
  - steady RSS: the mean over the last ``--steady`` seconds;
  - steady PSS (summed only): proportional set size from smaps_rollup, which counts
    the pages master and worker still share after the fork once; what a container's
    memory limit sees is close to it.
``--out FILE`` writes every sample and the summary as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MIB = 1024 * 1024
_KB_LINE = re.compile(r"^(\w+):\s+(\d+)\s+kB$", re.MULTILINE)


# --- /proc --------------------------------------------------------------------------
def parse_kb_fields(text: str) -> dict[str, int]:
    """``Name:  123 kB`` lines of /proc/PID/status or smaps_rollup, in bytes."""
    return {name: int(value) * 1024 for name, value in _KB_LINE.findall(text)}


def parse_ppid(stat: str) -> int:
    """The parent pid from /proc/PID/stat (the command, in parentheses, may hold
    spaces and parentheses itself: read from the last ')')."""
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def descendants(root: int, parents: Mapping[int, int]) -> list[int]:
    """``root`` and every process under it, root first, given pid -> ppid."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        tree.append(pid)
        todo.extend(sorted(children.get(pid, ())))
    return tree


def process_parents() -> dict[int, int]:
    parents = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError), open(f"/proc/{entry.name}/stat") as f:
                parents[int(entry.name)] = parse_ppid(f.read())
    return parents


def read_memory(pid: int, pss: bool) -> dict[str, int] | None:
    """VmRSS and VmHWM (and Pss when asked) of ``pid`` in bytes; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            fields = parse_kb_fields(handle.read())
        if pss:
            with open(f"/proc/{pid}/smaps_rollup") as handle:
                fields["Pss"] = parse_kb_fields(handle.read()).get("Pss", 0)
    except OSError:
        return None
    if "VmRSS" not in fields:  # a zombie
        return None
    return {k: fields.get(k, 0) for k in ("VmRSS", "VmHWM", "Pss")}


# --- samples and their summary ------------------------------------------------------
@dataclass
class Sample:
    t: float  # seconds since the extender was started
    memory: dict[int, dict[str, int]]  # pid -> VmRSS, VmHWM, Pss (bytes)


@dataclass
class ProcessFigures:
    peak_rss: int
    hwm: int
    steady_rss: int
    steady_pss: int


@dataclass
class Summary:
    tree: str
    ready_s: float | None
    processes: dict[str, ProcessFigures]
    total: ProcessFigures
    lists: list[dict[str, Any]] = field(default_factory=list)

    def rows(self) -> list[tuple[str, ProcessFigures]]:
        return [*self.processes.items(), ("master+worker", self.total)]


def summarize(
    tree: str,
    samples: Sequence[Sample],
    labels: Mapping[int, str],
    ready_s: float | None,
    steady_s: float = 5.0,
) -> Summary:
    """Per process (named by ``labels``) and summed: peak RSS, the last VmHWM seen,
    and the mean RSS and PSS over the last ``steady_s`` seconds of samples."""
    if not samples:
        raise ValueError("no samples")
    end = samples[-1].t
    steady = [s for s in samples if s.t >= end - steady_s] or [samples[-1]]

    def mean(values: Iterable[int]) -> int:
        values = list(values)
        return round(sum(values) / len(values)) if values else 0

    processes: dict[str, ProcessFigures] = {}
    for pid, label in labels.items():
        seen = [s.memory[pid] for s in samples if pid in s.memory]
        if not seen:
            continue
        last = [s.memory[pid] for s in steady if pid in s.memory]
        processes[label] = ProcessFigures(
            peak_rss=max(m["VmRSS"] for m in seen),
            hwm=max(m["VmHWM"] for m in seen),
            steady_rss=mean(m["VmRSS"] for m in last),
            steady_pss=mean(m["Pss"] for m in last),
        )
    total = ProcessFigures(
        peak_rss=max(sum(m["VmRSS"] for m in s.memory.values()) for s in samples),
        hwm=sum(p.hwm for p in processes.values()),
        steady_rss=mean(sum(m["VmRSS"] for m in s.memory.values()) for s in steady),
        steady_pss=mean(sum(m["Pss"] for m in s.memory.values()) for s in steady),
    )
    return Summary(tree, ready_s, processes, total)


def table(summaries: Sequence[Summary], label: str = "") -> str:
    """A Markdown table of every summary's rows, in MiB."""
    lines = [
        "| tree | cluster | process | ready s | peak RSS | VmHWM | steady RSS | steady PSS "
        "| peak/steady |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for summary in summaries:
        for name, fig in summary.rows():
            ratio = fig.peak_rss / fig.steady_rss if fig.steady_rss else 0.0
            ready = "" if summary.ready_s is None else f"{summary.ready_s:.1f}"
            lines.append(
                f"| {summary.tree} | {label} | {name} | {ready} | {fig.peak_rss / MIB:.0f} "
                f"| {fig.hwm / MIB:.0f} | {fig.steady_rss / MIB:.0f} "
                f"| {fig.steady_pss / MIB:.0f} | {ratio:.2f} |"
            )
    return "\n".join(lines)


def listed_lines(log_text: str) -> list[dict[str, Any]]:
    """The extender's ``cache listed`` log lines (kind, count, seconds)."""
    found = []
    for line in log_text.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("msg") == "cache listed":
                found.append({k: record.get(k) for k in ("kind", "count", "seconds")})
    return found


# --- one extender, measured ------------------------------------------------------------
def extender_command(kubeconfig: Path, port: int, ops_port: int, tree: Path) -> list[str]:
    """As lab.stack spawns it, with one worker."""
    from lab.stack import older_extender_args

    return [
        sys.executable,
        "-m",
        "gpu_scheduler.cli",
        "extender",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--ops-port={ops_port}",
        f"--kubeconfig={kubeconfig}",
        "--workers=1",
        *older_extender_args(tree),
    ]


def measure(
    name: str,
    tree: Path,
    kubeconfig: Path,
    log_dir: Path,
    *,
    interval: float = 0.05,
    after_ready: float = 15.0,
    steady_s: float = 5.0,
    timeout: float = 600.0,
    pss: bool = True,
) -> tuple[Summary, list[Sample]]:
    from lab.processes import clean_env, free_port

    port, ops_port = free_port(), free_port()
    env = {**clean_env(), "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    log_path = log_dir / f"extender-{name}.log"
    with open(log_path, "wb") as handle:
        popen = subprocess.Popen(
            extender_command(kubeconfig, port, ops_port, tree),
            cwd=tree,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    started = time.monotonic()
    ready_at: list[float] = []
    stop = threading.Event()

    def poll_ready() -> None:
        url = f"http://127.0.0.1:{ops_port}/readyz"
        while not stop.is_set():
            with (
                contextlib.suppress(Exception),
                urllib.request.urlopen(url, timeout=2) as response,
            ):
                if response.status == 200:
                    ready_at.append(time.monotonic() - started)
                    return
            stop.wait(0.05)

    poller = threading.Thread(target=poll_ready, daemon=True)
    poller.start()
    samples: list[Sample] = []
    labels: dict[int, str] = {popen.pid: "master"}
    tree_pids = [popen.pid]
    last_scan = 0.0
    try:
        while True:
            now = time.monotonic()
            if popen.poll() is not None:
                raise RuntimeError(f"{name}: the extender exited; see {log_path}")
            if now - last_scan > 0.5:  # new children are rare: a worker, once
                tree_pids = descendants(popen.pid, process_parents())
                last_scan = now
                for pid in tree_pids[1:]:
                    labels.setdefault(pid, "worker" if len(labels) == 1 else f"worker-{pid}")
            memory = {pid: m for pid in tree_pids if (m := read_memory(pid, pss)) is not None}
            samples.append(Sample(round(now - started, 3), memory))
            if ready_at and now - started >= ready_at[0] + after_ready:
                break
            if now - started > timeout:
                raise RuntimeError(f"{name}: not ready after {timeout:.0f}s; see {log_path}")
            time.sleep(max(0.0, interval - (time.monotonic() - now)))
    finally:
        stop.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
    summary = summarize(name, samples, labels, ready_at[0] if ready_at else None, steady_s)
    summary.lists = listed_lines(log_path.read_text(errors="replace"))
    return summary, samples


def parse_tree(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep:
        name, path = Path(text).resolve().name, text
    folder = Path(path).resolve()
    if not (folder / "extender" / "reflector.py").is_file():
        raise argparse.ArgumentTypeError(f"{folder} is not a gpu-scheduler source tree")
    return name, folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument(
        "--tree",
        action="append",
        type=parse_tree,
        metavar="NAME=PATH",
        help="a source tree to run the extender from (repeatable; default: this checkout)",
    )
    parser.add_argument(
        "--kubeconfig", type=Path, help="measure against this running cluster, build none"
    )
    parser.add_argument("--repeat", type=int, default=1, help="rounds over the trees")
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--after-ready", type=float, default=15.0)
    parser.add_argument("--steady", type=float, default=5.0)
    parser.add_argument("--no-pss", action="store_true", help="skip smaps_rollup reads")
    parser.add_argument("--out", type=Path, help="write samples and summaries as JSON")
    parser.add_argument(
        "--keep", action="store_true", help="keep the lab it built up until Ctrl-C or SIGTERM"
    )
    opts = parser.parse_args()
    trees = opts.tree or [("this", ROOT)]
    label = f"{opts.nodes} nodes, {opts.pods} pods"

    def run(kubeconfig: Path, log_dir: Path, header: dict[str, Any]) -> None:
        summaries, runs = [], []
        for round_ in range(opts.repeat):
            for name, folder in trees:
                tag = name if opts.repeat == 1 else f"{name}#{round_ + 1}"
                summary, samples = measure(
                    tag,
                    folder,
                    kubeconfig,
                    log_dir,
                    interval=opts.interval,
                    after_ready=opts.after_ready,
                    steady_s=opts.steady,
                    pss=not opts.no_pss,
                )
                summaries.append(summary)
                runs.append({"summary": asdict(summary), "samples": [asdict(s) for s in samples]})
                lists = ", ".join(
                    f"{x['kind']} {x['count']} in {x['seconds']}s" for x in summary.lists
                )
                ready = "never" if summary.ready_s is None else f"{summary.ready_s:.1f}s"
                print(f"  {tag}: ready in {ready}; listed {lists}", flush=True)
                time.sleep(2)
        print()
        print(table(summaries, label))
        if opts.out:
            opts.out.write_text(json.dumps({**header, "runs": runs}))
            print(f"\nsamples: {opts.out}")

    if opts.kubeconfig:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="relist-memory-") as tmp:
            run(opts.kubeconfig.resolve(), Path(tmp), {"cluster": str(opts.kubeconfig)})
        return 0

    from lab.stack import bare_stack
    from tests.bench import scale_lab

    with bare_stack("relist-memory-") as (stack, core):
        built = scale_lab.build(core, opts.nodes, opts.pods)
        print(built.summary(), flush=True)
        size, count = scale_lab.listed_pod_bytes(core)
        print(f"pod size as listed: {size / max(count, 1):.0f} bytes", flush=True)
        time.sleep(5)  # let the API server's watch cache and etcd settle
        header = {"build": asdict(built), "pod_bytes": size / max(count, 1), "cluster": label}
        run(stack.cluster.kubeconfig, stack.workdir, header)
        if opts.keep:
            scale_lab.keep(stack.cluster.kubeconfig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
