"""Held-out workloads: variants of the openb default pod list that the project does not
ship, built the way the published variants were (issue 27).

    .venv/bin/python tests/bench/trace_variants.py [--out DIR] [--seed 2027]

writes ``openb_pod_list_multigpu{30,40,50}.csv`` and ``openb_pod_list_gpuspec{25,33}.csv``
(default DIR: .cache/traces/openb, git-ignored). The same seed gives the same files.
``trace_replay.py --pods DIR/FILE`` replays one.

How the published variants were made (hkust-adsl/kubernetes-scheduler-simulator ships
the files, not a generator; read from the files themselves):

* **multigpuN**: every row of the default file, unchanged and in order, then tasks
  drawn with replacement from the default file's multi-GPU tasks (``num_gpu`` > 1),
  their request columns copied, names continuing the sequence, until multi-GPU tasks
  hold N% of the file's GPU request (``num_gpu x gpu_milli / 1000``; 7.3% in the
  default file). Only the resource columns are written, as in the published
  multigpu20 (so no arrival times: fill and sample modes only).
* **gpuspecN**: the default file's rows, with ``gpu_spec`` (accepted models) set on N%
  of its GPU tasks, chosen independently, GPU-sharing tasks (``gpu_milli`` < 1000)
  0.77 times as likely as whole-GPU ones, as in the published files. The default file
  has no spec at all; each chosen task's spec is drawn from the published gpuspec20
  file's specs of the same class (sharing or whole-GPU), so the models asked for are
  the production mix.
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.trace import find_trace_dir  # noqa: E402

DEFAULT = "openb_pod_list_default.csv"
SPEC_SOURCE = "openb_pod_list_gpuspec20.csv"
OUT = ROOT / ".cache" / "traces" / "openb"
MULTI_GPU_SHARES = (30, 40, 50)
SPEC_SHARES = (25, 33)
#: Resource columns, the only ones the published multigpu files have.
RESOURCE_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
#: How much less likely a GPU-sharing task is to get a spec than a whole-GPU one.
SHARING_WEIGHT = 0.77

Row = dict[str, str]


def gpu_request(row: Row) -> float:
    """A task's GPU request in GPUs (a sharing task asks for a fraction of one)."""
    return int(row["num_gpu"]) * int(row["gpu_milli"]) / 1000


def multi_gpu_share(rows: Sequence[Row]) -> float:
    total = sum(gpu_request(r) for r in rows)
    multi = sum(gpu_request(r) for r in rows if int(r["num_gpu"]) > 1)
    return multi / total if total else 0.0


def multigpu_variant(rows: Sequence[Row], percent: int, seed: int) -> list[Row]:
    """The default rows, then multi-GPU tasks drawn with replacement until they hold
    ``percent``% of the GPU request; resource columns only."""
    rng = random.Random(f"multigpu{percent}-{seed}")
    out = [{c: r[c] for c in RESOURCE_COLUMNS} for r in rows]
    pool = [r for r in rows if int(r["num_gpu"]) > 1]
    total = sum(gpu_request(r) for r in out)
    multi = sum(gpu_request(r) for r in out if int(r["num_gpu"]) > 1)
    width = len(rows[-1]["name"].rsplit("-", 1)[1])
    prefix = rows[-1]["name"].rsplit("-", 1)[0]
    while multi / total < percent / 100:
        drawn = rng.choice(pool)
        row = {c: drawn[c] for c in RESOURCE_COLUMNS}
        row["name"] = f"{prefix}-{len(out):0{width}d}"
        out.append(row)
        total += gpu_request(row)
        multi += gpu_request(row)
    return out


def spec_pools(source: Sequence[Row]) -> dict[bool, list[str]]:
    """The specs of a published gpuspec file's GPU tasks, by class (sharing or not)."""
    pools: dict[bool, list[str]] = {True: [], False: []}
    for row in source:
        if int(row["num_gpu"]) > 0 and row.get("gpu_spec"):
            pools[int(row["gpu_milli"]) < 1000].append(row["gpu_spec"])
    return pools


def gpuspec_variant(
    rows: Sequence[Row], percent: int, seed: int, pools: dict[bool, list[str]]
) -> list[Row]:
    """The rows with ``gpu_spec`` set on ``percent``% of the GPU tasks (sharing ones
    0.77 times as likely), each spec drawn from its class's pool."""
    rng = random.Random(f"gpuspec{percent}-{seed}")
    gpu = [i for i, r in enumerate(rows) if int(r["num_gpu"]) > 0]
    want = round(len(gpu) * percent / 100)
    weight = {i: SHARING_WEIGHT if int(rows[i]["gpu_milli"]) < 1000 else 1.0 for i in gpu}
    # Weighted sampling without replacement (Efraimidis-Spirakis keys).
    keys = sorted(gpu, key=lambda i: rng.random() ** (1 / weight[i]), reverse=True)
    chosen = set(keys[:want])
    out = []
    for i, row in enumerate(rows):
        row = dict(row)
        if i in chosen:
            row["gpu_spec"] = rng.choice(pools[int(row["gpu_milli"]) < 1000])
        out.append(row)
    return out


def read(path: Path) -> list[Row]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def write(path: Path, rows: Sequence[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def generate(out: Path, seed: int, trace: Path | None = None) -> list[Path]:
    trace = trace or find_trace_dir()
    rows = read(trace / DEFAULT)
    pools = spec_pools(read(trace / SPEC_SOURCE))
    written = []
    for percent in MULTI_GPU_SHARES:
        path = out / f"openb_pod_list_multigpu{percent}.csv"
        write(path, multigpu_variant(rows, percent, seed))
        written.append(path)
    for percent in SPEC_SHARES:
        path = out / f"openb_pod_list_gpuspec{percent}.csv"
        write(path, gpuspec_variant(rows, percent, seed, pools))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"folder (default {OUT})")
    parser.add_argument("--seed", type=int, default=2027, help="the draw's seed (default 2027)")
    opts = parser.parse_args(argv)
    for path in generate(opts.out, opts.seed):
        rows = read(path)
        gpu = [r for r in rows if int(r["num_gpu"]) > 0]
        specced = sum(1 for r in gpu if r.get("gpu_spec"))
        print(
            f"{path}: {len(rows)} tasks, multi-GPU {multi_gpu_share(rows):.1%} of the GPU "
            f"request, spec on {specced / len(gpu):.1%} of GPU tasks"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
