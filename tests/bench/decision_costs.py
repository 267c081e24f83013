"""What each part of one pod's extender work costs in a quiet process, no HTTP.

    .venv/bin/python tests/bench/decision_costs.py [--nodes 5000] [--sizes 500,5000]

The same cache as ``profile_extender.py`` (``--nodes`` GPU nodes through the cache's
own code, a bound pod on every fourth), then the best of five batches, in µs:
  - filter, the request's parse included (pod facts, the names' lookup);
  - prioritize's answer (``Decider._score``; the "preparation" columns), with the
    placement explanation worked out and without it (past the Event rate,
    ``Explainer.admit`` says no);
  - a binding's watch event applied to the cache, and the view rebuilt after it (what
    the next call's parse does).
The end-to-end bench (``e2e_throughput.py``) shows what the same work costs when it
shares the machine with a control plane.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from extender.app import Decider  # noqa: E402
from extender.cache import ClusterCache  # noqa: E402
from extender.config import ExtenderConfig  # noqa: E402
from extender.explain import Explainer  # noqa: E402
from tests.bench.profile_extender import build_cache  # noqa: E402
from tests.factories import make_pod  # noqa: E402


def best_us(work: Callable[[], object], calls: int = 200, batches: int = 5) -> float:
    for _ in range(10):  # warm up
        work()
    times = []
    for _ in range(batches):
        started = time.perf_counter()
        for _ in range(calls):
            work()
        times.append((time.perf_counter() - started) / calls * 1e6)
    return min(times)


def row(cache: ClusterCache, names: list[str], size: int, first: int) -> list[float]:
    """The four timings (µs) at ``size`` candidates; bindings named from ``first`` on."""
    chosen = names[:: max(1, len(names) // size)][:size]
    pod = make_pod("bench", 2, annotations={"gpu-scheduler.io/spot": "prefer"})
    body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": chosen})
    explainer = Explainer(lambda _: None)
    decider = Decider(ExtenderConfig(), cache, explainer)
    filtered = best_us(lambda: decider.filter(decider.parse(orjson.loads(body))))
    call = decider.parse(orjson.loads(body))
    explained = best_us(lambda: decider._score(call))
    explainer.admit = lambda: False  # type: ignore[method-assign]
    plain = best_us(lambda: decider._score(call))
    raws = iter(
        [
            orjson.dumps(make_pod(f"b-{i}", 1 + i % 4, node=names[i * 7 % len(names)]))
            for i in range(first, first + BINDINGS)
        ]
    )

    def binding() -> None:
        cache.pod_event("ADDED", orjson.loads(next(raws)))
        cache.view()

    return [filtered, explained, plain, best_us(binding, calls=100)]


#: Binding events made per row (the warm-up and five batches of 100).
BINDINGS = 600


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--sizes", default="500,5000")
    opts = parser.parse_args(argv)
    cache, names = build_cache(opts.nodes)
    print(
        "| candidates | filter (parse included) | preparation, explained "
        "| preparation, not explained | binding event + view rebuild |"
    )
    print("|---:|---:|---:|---:|---:|")
    for n, size in enumerate(int(s) for s in opts.sizes.split(",")):
        cells = row(cache, names, size, n * BINDINGS)
        print(f"| {size} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
