"""The trace bench's command line (tests/bench/trace_replay.py): its options, and the
lists some of them take (percentages, weight variants, sharing ways)."""

from __future__ import annotations

import argparse
from typing import Any

from tests.bench.sharing_bench import DEFAULT_WAYS
from tests.bench.trace_runners import SCHEDULERS

DESCRIPTION = "Placement quality on the openb production trace: three schedulers side by side."


def parse_percentages(text: str) -> list[int | None]:
    """``default,50,100`` -> [None, 50, 100]; empty -> [None] (one run, unset)."""
    out: list[int | None] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        if item == "default":
            out.append(None)
            continue
        value = int(item)
        if not 0 <= value <= 100:
            raise ValueError(f"percentageOfNodesToScore must be 0..100, not {value}")
        out.append(value)
    return out or [None]


def variant_label(weights: str | None, percentage: int | None, percentages: int) -> str:
    """gpu-scheduler, gpu-scheduler[NAME], gpu-scheduler[pct=50],
    gpu-scheduler[NAME,pct=default]: the percentage named when one is set or more
    than one ran."""
    parts = [weights] if weights else []
    if percentages > 1 or percentage is not None:
        parts.append(f"pct={'default' if percentage is None else percentage}")
    return f"gpu-scheduler[{','.join(parts)}]" if parts else "gpu-scheduler"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--pods", default="openb_pod_list_default.csv", help="trace task file")
    parser.add_argument("--nodes", default="openb_node_list_all_node.csv", help="trace node file")
    parser.add_argument("--mode", choices=("fill", "replay", "sample"), default="fill")
    parser.add_argument("--scale", type=float, default=1.0, help="sample nodes and tasks")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--compress", type=float, default=5000.0, help="replay: arrival gaps divided by this"
    )
    parser.add_argument(
        "--speedup", type=float, default=2.0, help="replay: trace seconds per wall second"
    )
    parser.add_argument(
        "--patience",
        type=float,
        default=120.0,
        help="replay: seconds of (compressed) trace time a pod may pend, / --speedup in wall time",
    )
    parser.add_argument("--schedulers", default=",".join(SCHEDULERS))
    parser.add_argument(
        "--repeat", type=int, default=1, help="fill: run each scheduler N times (ties are random)"
    )
    parser.add_argument(
        "--seeds", default="42,43,44", help="sample: the seeds of the draws (comma list)"
    )
    parser.add_argument(
        "--share", type=float, default=1.3, help="sample: draw until tasks ask this x the GPUs"
    )
    parser.add_argument(
        "--variants",
        default="",
        help="sample: our profile once per extender weight set, NAME:policy=w,...;NAME:...",
    )
    parser.add_argument(
        "--percentages",
        default="",
        help="sample: our profile once per percentageOfNodesToScore, e.g. default,50,100",
    )
    parser.add_argument(
        "--sharing",
        action="store_true",
        help="sample: the sharing ways side by side, in GPUs of work (sharing_bench.py)",
    )
    parser.add_argument(
        "--ways",
        default=",".join(DEFAULT_WAYS),
        help="sample --sharing: the ways to run, in order (comma list)",
    )
    parser.add_argument(
        "--results", default="", help="sample --sharing: write every run's figures to this JSON"
    )
    parser.add_argument("--write-docs", action="store_true", help="table + plot into docs/")
    return parser.parse_args(argv)


#: Extender settings a variant may set besides the weights (true/false).
SWITCHES = ("filterChooses",)


def parse_variants(text: str) -> list[tuple[str, dict[str, Any] | None]]:
    """``NAME:policy=w,...;...`` -> [(label, extender config)]; none: our defaults.
    ``filterChooses=false`` among the pairs sets that switch instead of a weight."""
    if not text.strip():
        return [("gpu-scheduler", None)]
    variants = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        label, _, spec = item.partition(":")
        config: dict[str, Any] = {"weights": {}}
        for pair in filter(None, spec.split(",")):
            key, _, value = (part.strip() for part in pair.partition("="))
            if key in SWITCHES:
                config[key] = value.lower() == "true"
            else:
                config["weights"][key] = int(value)
        variants.append((f"gpu-scheduler[{label.strip()}]", config))
    return variants
