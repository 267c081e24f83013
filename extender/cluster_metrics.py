"""The cluster's GPUs as the extender's view holds them, exported when /metrics is scraped.

What ``gpu-scheduler status`` prints node by node, summed by GPU model (never by node
or pod: the series stay as few as the models), with the fragmentation the
fragmentation policy measures and the state of shared GPUs:

- ``gpu_scheduler_extender_cluster_gpus{model, state}``: allocatable, usable (less the
  GPUs the agents report sick), allocated (whole GPUs taken by bound pods and the
  filter's picks not yet bound), free (whole GPUs a pod can still be given);
- ``gpu_scheduler_extender_fragmented_gpus{model}``: the sum over nodes of the FGD
  measure F(node) against the current workload mix (extender/policies/fragmentation.py):
  the free GPUs the mix, weighted, cannot use;
- ``gpu_scheduler_extender_stranded_gpus{model}``: free GPUs on nodes where no shape of
  the mix fits (too few free GPUs beside them, too little CPU or memory, a product the
  shapes are not allowed on);
- ``gpu_scheduler_extender_share_units{model, state}``: units of GPU memory (GiB) on
  sharing nodes: allocatable, usable (healthy GPUs), free (for shares: not on a GPU a
  whole-GPU pod holds);
- ``gpu_scheduler_extender_shared_gpu_fill_ratio{model}``: a histogram over the healthy
  GPUs of sharing nodes of how much of each one's memory is taken (0: none; 1: all, by
  shares or by a pod given the GPU whole).

They are worked out from the view at scrape time (a custom collector: nothing on the
filter and prioritize path), by numpy over the view's table but for the sharing nodes'
GPUs. Under several gunicorn workers each worker's cache holds the whole cluster; the
collector is not part of the multiprocess files (which would keep a model's series
after its last node went), the worker that answers the scrape serves its own
(:data:`gpu_scheduler.http.LIVE`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import numpy as np
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from extender.columns import ALLOC, FREE, MODEL, OK, USABLE
from extender.policies.fragmentation import node_fragmentation
from extender.view import View
from gpu_scheduler.http import LIVE

log = logging.getLogger(__name__)

PREFIX = "gpu_scheduler_extender_"
#: The fill ratio histogram's upper bounds (+Inf holds nothing: a ratio is at most 1).
FILL_BUCKETS = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
#: The model label of a GPU node whose product is not known.
UNKNOWN = "unknown"
GPU_STATES = ("allocatable", "usable", "allocated", "free")
UNIT_STATES = ("allocatable", "usable", "free")


def _families() -> dict[str, Metric]:
    return {
        "gpus": GaugeMetricFamily(
            PREFIX + "cluster_gpus",
            "GPUs of the nodes the extender knows, by GPU model and state (allocatable; "
            "usable: less the ones the agents report sick; allocated: taken whole by "
            "bound pods and picks not bound yet; free: a pod can still be given them)",
            labels=["model", "state"],
        ),
        "fragmented": GaugeMetricFamily(
            PREFIX + "fragmented_gpus",
            "The fragmentation policy's measure summed over nodes: each node's free GPUs "
            "times the share of the workload mix that does not fit them (FGD); 0 while "
            "no GPU pod is bound",
            labels=["model"],
        ),
        "stranded": GaugeMetricFamily(
            PREFIX + "stranded_gpus",
            "Free GPUs on nodes where no shape of the workload mix fits (GPUs, CPU, "
            "memory, product); 0 while no GPU pod is bound",
            labels=["model"],
        ),
        "units": GaugeMetricFamily(
            PREFIX + "share_units",
            "Units of GPU memory (GiB) on sharing nodes, by GPU model and state "
            "(allocatable; usable: on healthy GPUs; free: for shares)",
            labels=["model", "state"],
        ),
        "fill": HistogramMetricFamily(
            PREFIX + "shared_gpu_fill_ratio",
            "Healthy GPUs of sharing nodes by the share of their memory taken (by shares, "
            "or all of it by a pod given the GPU whole)",
            labels=["model"],
        ),
    }


def collect_view(view: View | None) -> list[Metric]:
    """The families, with a sample per model the view's GPU nodes have (none without
    a view)."""
    families = _families()
    if view is None or view.table is None:
        return list(families.values())
    table = view.table
    cols = table.cols
    rows = np.flatnonzero((cols[OK] == 1) & (cols[ALLOC] > 0))
    codes = cols[MODEL, rows]
    names = [value or UNKNOWN for value in table.models.values]
    size = len(names)

    def by_model(values: np.ndarray) -> np.ndarray:
        return np.bincount(codes, weights=values, minlength=size)

    free = np.maximum(cols[FREE, rows], 0)
    allocated = np.zeros(size)
    slots = table.slots
    for name, count in view.used.items():
        slot = slots.get(name)
        if slot and cols[OK, slot] == 1 and cols[ALLOC, slot] > 0:
            allocated[cols[MODEL, slot]] += count
    gpus = {
        "allocatable": by_model(cols[ALLOC, rows]),
        "usable": by_model(cols[USABLE, rows]),
        "allocated": allocated,
        "free": by_model(free),
    }
    fragmented = stranded = np.zeros(size)
    if view.mix and len(rows):
        value, fitting = node_fragmentation(view.mix, table.models, cols[:, rows])
        fragmented = by_model(value)
        stranded = by_model(np.where(fitting <= 1e-9, free, 0))
    present = sorted({int(code) for code in codes}, key=lambda code: names[code])
    for code in present:
        model = names[code]
        for state in GPU_STATES:
            families["gpus"].add_metric([model, state], float(gpus[state][code]))
        families["fragmented"].add_metric([model], round(float(fragmented[code]), 6))
        families["stranded"].add_metric([model], float(stranded[code]))
    _shares(view, families)
    return list(families.values())


def _shares(view: View, families: dict[str, Metric]) -> None:
    """The units and fill of the sharing nodes' GPUs, by model."""
    units: dict[str, list[float]] = {}  # allocatable, usable, free, fill ratios added
    fill: dict[str, list[int]] = {}
    for name, state in view.gpus.items():
        facts = view.nodes.get(name)
        if facts is None or facts.shared is None or facts.error is not None:
            continue
        model = facts.model or UNKNOWN
        total = units.setdefault(model, [0.0, 0.0, 0.0, 0.0])
        counts = fill.setdefault(model, [0] * len(FILL_BUCKETS))
        health = [healthy for _, _, healthy in facts.shared.gpus]
        for i, gpu in enumerate(state):
            total[0] += gpu.capacity
            if gpu.capacity <= 0 or (i < len(health) and not health[i]):
                continue
            taken = 1.0 - gpu.free / gpu.capacity
            total[1] += gpu.capacity
            total[2] += gpu.free
            total[3] += taken
            counts[next(k for k, bound in enumerate(FILL_BUCKETS) if taken <= bound)] += 1
    for model in sorted(units):
        for state, value in zip(UNIT_STATES, units[model], strict=False):
            families["units"].add_metric([model, state], value)
        cumulative = np.cumsum(fill[model]).tolist()
        buckets = [
            (repr(bound), float(n)) for bound, n in zip(FILL_BUCKETS, cumulative, strict=True)
        ]
        buckets.append(("+Inf", float(cumulative[-1])))
        families["fill"].add_metric([model], buckets, round(units[model][3], 6))


class ClusterCollector:
    """A prometheus_client collector reading the view that ``source`` gives (None:
    not synced yet), set by the app that owns the cache."""

    def __init__(self) -> None:
        self.source: Callable[[], View | None] | None = None

    def describe(self) -> list[Metric]:
        return []  # no names claimed: the registry does not collect to find them

    def collect(self) -> Iterator[Metric]:
        view = None
        source = self.source
        if source is not None:
            try:
                view = source()
            except Exception:  # a scrape must not fail: the families go out empty
                log.exception("reading the view for the cluster metrics failed")
        yield from collect_view(view)


COLLECTOR = ClusterCollector()
LIVE.register(COLLECTOR)
