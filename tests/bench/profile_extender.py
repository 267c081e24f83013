"""Where one extender call's time goes: cProfile over the real app (cluster mode, the
cache filled through its own code), in process, no HTTP server.

    .venv/bin/python tests/bench/profile_extender.py [--nodes 5000] [--candidates 500] \
        [--calls 300] [--top 25]

Builds a ClusterCache of ``--nodes`` GPU nodes (mixed models, zones, spot) and a bound
GPU pod on every fourth node, then posts ``--calls`` filter and prioritize bodies of
``--candidates`` node names (what kube-scheduler sends at 5,000 nodes under its
adaptive 10% sampling) through Flask's test client, and prints per verb the mean
handler time and the functions with the most cumulative time, grouped as: request
parsing (orjson, wire), pod facts, the view, the policies (pre-filter/filter,
pre-score/score), the answer's serialisation, and Flask/Werkzeug itself.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from extender.app import create_app  # noqa: E402
from extender.cache import ClusterCache  # noqa: E402
from tests.bench.extender_bench import cluster_nodes  # noqa: E402
from tests.factories import make_pod  # noqa: E402
from tests.fakeapi import synced_cache  # noqa: E402

#: Our code, whose functions the summary lists.
OURS = ("/extender/", "/gpu_scheduler/")


def ours_by_cumulative(stats: pstats.Stats, limit: int) -> list[tuple[str, float, int]]:
    """(function, share of the handler's time, calls) for our functions, the handler
    (``Endpoints.serve``, everything inside the request but Flask's own dispatch)
    first; builtins called from them are inside their cumulative time."""
    rows = []
    serve = 0.0
    for (filename, line, name), (_, calls, _, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = next((filename.split(key, 1)[1] for key in OURS if key in filename), None)
        if where is None:
            continue
        prefix = "extender/" if "/extender/" in filename else "gpu_scheduler/"
        rows.append((f"{prefix}{where}:{line} {name}", cumtime, calls))
        if name == "serve" and where == "endpoints.py":
            serve = cumtime
    rows.sort(key=lambda r: -r[1])
    return [(label, cum / serve if serve else 0.0, calls) for label, cum, calls in rows[:limit]]


def build_cache(nodes: int) -> tuple[ClusterCache, list[str]]:
    """A synced cache (listed through the reflectors from the explicit fake API)."""
    items = cluster_nodes(nodes)
    names = [n["metadata"]["name"] for n in items]
    pods = [
        make_pod(f"bound-{i}", 1 + i % 4, node=names[i], phase="Running")
        for i in range(0, nodes, 4)
    ]
    return synced_cache(items, pods), names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--candidates", type=int, default=500)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--top", type=int, default=25)
    opts = parser.parse_args(argv)

    cache, names = build_cache(opts.nodes)
    client = create_app(cache=cache).test_client()
    step = max(1, opts.nodes // opts.candidates)
    body = {
        "Pod": make_pod("bench", 2, annotations={"gpu-scheduler.io/group": "g"}),
        "Nodes": None,
        "NodeNames": names[::step][: opts.candidates],
    }
    for verb in ("filter", "prioritize"):
        for _ in range(20):  # warm: view built, caches filled
            warm = client.post(f"/{verb}", json=body)
        assert warm.status_code == 200, warm.get_data()
        profile = cProfile.Profile()
        started = time.perf_counter()
        profile.enable()
        for _ in range(opts.calls):
            response = client.post(f"/{verb}", json=body)
        profile.disable()
        elapsed = (time.perf_counter() - started) / opts.calls
        assert response.status_code == 200, response.get_data()
        stats = pstats.Stats(profile)
        print(
            f"\n## {verb}: {len(body['NodeNames'])} candidates of {opts.nodes} nodes, "
            f"{elapsed * 1000:.2f} ms per call through Flask's test client, under cProfile "
            f"({opts.calls} calls)\n"
        )
        print("| our function | share of the handler | calls |")
        print("|---|---:|---:|")
        for label, share, calls in ours_by_cumulative(stats, opts.top):
            print(f"| `{label}` | {share:.0%} | {calls} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
