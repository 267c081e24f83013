"""The trace bench's reports: tables of fill, replay and sample runs, their plots, the
extender's per-call figures from its log, and the section written into docs/BENCHMARKS.md."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


from tests.bench.replay import ReplayResult  # noqa: E402
from tests.bench.sampling import (  # noqa: E402
    FRAGMENTATION_AT,
    LEVELS,
    SampleResult,
)
from tests.bench.trace import (  # noqa: E402
    FillResult,
)


def _quantile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q`` of the values at or below."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _json_records(lines: list[str]) -> Iterator[dict]:
    """The JSON objects among a server's log lines (its JSON log; others skipped)."""
    for line in lines:
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record


def call_records(lines: list[str]) -> Iterator[tuple[str, dict]]:
    """(verb, fields) of each filter/prioritize call in our extender's JSON log lines:
    each verb's own line, and (trees with prioritize's prepared answers) a filter
    that passed every candidate to a prepared prioritize, told on that prioritize's
    line (``filter_ms``; its candidates are prioritize's nodes) as
    ``{"ms": filter_ms, "nodes": nodes}``."""
    for record in _json_records(lines):
        verb = record.get("msg")
        if verb not in ("filter", "prioritize"):
            continue
        if isinstance(record.get("filter_ms"), int | float):
            yield "filter", {"ms": record["filter_ms"], "nodes": record.get("nodes")}
        yield verb, record


def extender_calls(lines: list[str]) -> list[tuple[str, float, int]]:
    """(verb, handler ms, candidate nodes) of each call (:func:`call_records`)."""
    return [
        (verb, float(record["ms"]), int(record["nodes"]))
        for verb, record in call_records(lines)
        if "ms" in record
    ]


def view_lag(lines: list[str], bound_before: dict[str, int]) -> dict[str, float]:
    """How often our extender scored a pod before its view held the bindings the API
    server had already made (issue 27). ``bound_before``: pod name -> GPU pods bound
    when it was submitted (sample mode submits each after the previous one's outcome).
    Per scoring call (prioritize, or a filter that picked the node: extender/choice.py):
    lagging when the view held fewer bound pods than that."""
    calls = lagging = missing = 0
    for record in _json_records(lines):
        name = str(record.get("pod", "")).rpartition("/")[2]
        scored = record.get("msg") == "prioritize" or "chose" in record
        if not scored or name not in bound_before:
            continue
        calls += 1
        behind = bound_before[name] - int(record.get("view_pods") or 0)
        if behind > 0:
            lagging += 1
            missing += behind
    return {
        "calls": calls,
        "lagging": lagging,
        "share": lagging / calls if calls else 0.0,
        "pods_behind_mean": missing / lagging if lagging else 0.0,
    }


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
    _closing_rows(row, results)
    return "\n".join(rows)


def _closing_rows(row: Callable[[str, list[str]], None], results: Sequence[Any]) -> None:
    """The rows the fill and replay tables end with: failures by size, constraint
    violations, tasks set apart."""
    row(
        "failed GPU pods by size (1/2/4/8)",
        ["/".join(str(r.failed_by_size.get(s, 0)) for s in (1, 2, 4, 8)) for r in results],
    )
    row("model-constraint violations", [str(r.constraint_violations) for r in results])
    row("tasks set apart as infeasible", [str(r.infeasible) for r in results])


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
    _closing_rows(row, results)
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
