"""fragmentation: place a GPU pod where it fragments the cluster least.

After FGD (Weng et al., "Beware of Fragmentation", USENIX ATC'23), adapted to whole
GPUs and to CPU and memory. A node's free GPUs are *fragmented* for a task shape when
that shape cannot run there: too few free GPUs, too little free CPU or memory beside
them, or a product the shape is not allowed on. Weighted by each shape's share of the
cluster's workload (the cluster cache's mix of bound GPU pods, :mod:`extender.workload`:
restricted shapes by their count of pods, the others also by the GPUs they ask for as
multi-GPU demand grows), a node's expected fragmentation is

    F(node) = free GPUs x sum over shapes s of share(s) x [s does not fit the node]

and a node scores ``F(before) - F(after placing the pod)``: the smaller the increase in
fragmentation (or the larger the decrease), the better. A pod that takes the last free
GPUs of a node leaves nothing to fragment; one that leaves 3 GPUs where the common
shapes need 4 or 8, or that takes the CPU the remaining GPUs' users need, scores low.
Restricted shapes (``gpu-scheduler.io/gpu-products``) make a scarce product's GPUs
fragmented for everyone else, so unrestricted pods are steered off it as demand
restricted to it grows.

Free GPUs, CPU and memory are each node's :data:`~extender.columns.FreeState`, which
the cache keeps current as pods come and go, read as the candidates' columns.

A pod asking a share of one GPU is scored on partial GPUs, as the paper measures them
(:func:`extender.share_columns.share_fragments`): each sharing candidate's GPUs, CPU
and memory after the fit rule places the pod, against the mix of what bound pods ask
of GPUs (share sizes and whole-GPU counts, with their CPU and memory,
``View.share_mix``). The score is again ``F(before) - F(after)``, in units of GPU
memory. Two things the paper's measure, made for GPUs alike, does not see on GPUs of
different sizes:

- a share that must break a wholly free GPU costs the whole-GPU classes one GPU
  whatever its size, and leaves the shares the rest: a partly used GPU counts as one
  GPU's worth for them (the candidates' median GPU), not as what is left on it; so a
  share breaks the largest GPU it can, where the most shares will fit beside it;
- a whole-GPU pod takes all of a GPU's memory, which shares could have used: where
  shares are in the mix, a whole-GPU pod pays, on a sharing node, the share of the
  mix that shares make up, times the GPUs it takes, times how far their memory
  exceeds the candidates' median GPU (in GPUs, the unit of ``F`` for whole-GPU pods).
  It goes to the smaller GPUs and leaves the large ones to the shares.

On the openb trace's sample protocol with shares (docs/BENCHMARKS.md, "Shares of one
GPU"), the measure as the paper counts it left as many GPUs unallocated as best fit
alone; the CPU and memory in the classes and the two points above, together, left a
quarter fewer, and without any one of the three, more again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from extender.cache_shares import ShareClass
from extender.columns import CPU, FREE, LARGEST, MEMORY, MODEL, RAM, Candidates, Codes, bound
from extender.model import PodFacts
from extender.policies.base import ClusterView, Policy
from extender.share_columns import gpu_matrix, gpu_unit, place, share_fragments
from extender.workload import MixEntry


@dataclass(frozen=True, slots=True)
class _State:
    gpus: int
    cpu_milli: int
    ram_mib: int
    mix: tuple[MixEntry, ...]
    #: the share of the pods on sharing nodes that ask a share (0: no shares)
    shares_weight: float = 0.0


@dataclass(frozen=True, slots=True)
class _ShareState:
    gpus: int
    shares: tuple[int, ...]
    cpu_milli: int
    ram_mib: int
    mix: tuple[ShareClass, ...]


class FragmentationPolicy(Policy):
    name: ClassVar[str] = "fragmentation"

    def __init__(self) -> None:
        # The last mix's evaluator: a view keeps its mix until a pod comes or goes,
        # and every call on that view (filter, then prioritize, for pod after pod
        # while nothing binds) needs the same one. The model codes are append-only,
        # so their count is part of the key.
        self._last: tuple[tuple[MixEntry, ...], Codes, int, _Fragmentation] | None = None

    def _evaluator(self, mix: tuple[MixEntry, ...], models: Codes) -> _Fragmentation:
        last = self._last
        if last and last[0] is mix and last[1] is models and last[2] == len(models.values):
            return last[3]
        made = _Fragmentation(mix, models)
        self._last = (mix, models, len(models.values), made)
        return made

    def pre_score(self, pod: PodFacts, view: ClusterView) -> _State | _ShareState | None:
        shares = view.pod_shares(pod)
        if shares:
            if not view.share_mix:
                return None
            return _ShareState(pod.gpus, shares, pod.cpu_milli, pod.ram_mib, view.share_mix)
        if pod.gpus == 0 or not view.mix:
            return None
        weight = sum(c.weight for c in view.share_mix if c.kind == "share")
        return _State(pod.gpus, pod.cpu_milli, pod.ram_mib, view.mix, weight)

    def score_all(
        self, state: _State | _ShareState, nodes: Candidates, view: ClusterView
    ) -> np.ndarray:
        cols = nodes.cols
        cpu, ram = cols[CPU], cols[RAM]
        cpu_after, ram_after = cpu - bound(state.cpu_milli), ram - bound(state.ram_mib)
        if isinstance(state, _ShareState):
            free, cap = gpu_matrix(nodes, view)
            after, fits, _ = place(free, cap, state.shares, state.gpus)
            unit = gpu_unit(cap)
            gain = share_fragments(free, cap, state.mix, cpu, ram, unit) - share_fragments(
                after, cap, state.mix, cpu_after, ram_after, unit
            )
            if fits.any() and not fits.all():  # where the fit rule finds no room: last
                gain = np.where(fits, gain, gain[fits].min() - 1.0)
            return gain
        free, model = cols[FREE], cols[MODEL]
        fragmented = self._evaluator(state.mix, nodes.models)
        gain = fragmented((free, cpu, ram, model), (free - state.gpus, cpu_after, ram_after, model))
        # to 9 decimals: the direct sum and the table add the same shares in other
        # orders, and so does the GPUScheduler plugin; rounded, equal nodes rank alike
        gain = np.round(gain, 9)
        if state.shares_weight:
            gain -= state.shares_weight * state.gpus * _excess_memory(cols)
        return gain


def _excess_memory(cols: np.ndarray) -> np.ndarray:
    """How far each candidate's GPU memory exceeds the median of the sharing
    candidates', in GPUs of that median (0 on a node that does not share: its memory
    is no share's)."""
    sharing = cols[LARGEST] >= 0
    memory = np.where(sharing, np.maximum(cols[MEMORY], 0), 0).astype(np.float64)
    if not sharing.any():
        return memory
    unit = float(np.median(memory[sharing]))
    if unit <= 0:
        return np.zeros(len(memory))
    return np.maximum(memory / unit - 1.0, 0.0)


#: Up to this many (state, shape) pairs are evaluated directly; above, the distinct
#: states are found first (a sort), which costs more than it saves on small calls.
DIRECT = 1 << 15


#: Keys below this are made distinct by marking them in an array of that many flags
#: (no sort: a tenth of ``np.unique``'s cost on 10,000 states); larger ones by sorting.
DENSE_KEYS = 1 << 20

#: A mix's table of fitting shares has (most GPUs a shape asks + 1) x (CPU levels + 1)
#: x (memory levels + 1) x models cells; it is built only up to this many (8 MiB).
TABLE_CELLS = 1 << 20
#: A table this small (128 KiB) is built for the first call on a mix, however small the
#: call: it costs about one direct evaluation of a few hundred candidates to build, and
#: each later call on the mix (the mix changes after 1% of the pods) then reads each
#: state's share in one gather instead of comparing it with every shape.
SMALL_TABLE = 1 << 14


def _distinct(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a position of each distinct key, each key's index among the distinct ones):
    ``key[first][inverse] == key``. Keys are non-negative integers."""
    size = int(key.max()) + 1
    if size > DENSE_KEYS:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        return first, inverse.reshape(-1)
    index = np.full(size, -1, dtype=np.intp)
    index[key] = np.arange(len(key))  # a position of each key (the last write wins)
    present = np.flatnonzero(index >= 0)
    first = index[present]
    index[present] = np.arange(len(present))
    return first, index[key]


class _Fragmentation:
    """F(node) for the view's mix, over columns of free GPUs, CPU, memory and model.

    Whether a shape fits depends on free CPU and memory only through where they fall
    among the shapes' own (gridded) sizes, so nodes in the same (free GPUs, CPU level,
    memory level, model) share one evaluation: on large calls the states are made
    unique first and each is evaluated once against every shape, in the mix's order.

    A mix of many shapes over a cluster of many different states (up to 128 shapes;
    free CPU and memory vary node by node) costs shapes x states: 2-5 ms at 5,000
    candidates. Such a call builds, once for the mix, the share that fits every
    (free GPUs, CPU level, memory level, model) (a histogram of the shapes summed
    along three axes), and it and every later call on the same mix read each state's
    share from it in one gather. The table adds the same shares in another order than
    the direct sum: the two differ by rounding only (a test holds them together)."""

    def __init__(self, mix: tuple[MixEntry, ...], models: Codes) -> None:
        shapes = [entry.shape for entry in mix]
        self.cpu_levels = np.array(sorted({s.cpu_milli for s in shapes}), dtype=np.int64)
        self.ram_levels = np.array(sorted({s.ram_mib for s in shapes}), dtype=np.int64)
        column = (len(shapes), 1)
        self.gpus = np.array([s.gpus for s in shapes], dtype=np.int64).reshape(column)
        self.cpu_at = np.searchsorted(self.cpu_levels, [s.cpu_milli for s in shapes]).reshape(
            column
        )
        self.ram_at = np.searchsorted(self.ram_levels, [s.ram_mib for s in shapes]).reshape(column)
        self.share = np.array([entry.share for entry in mix]).reshape(column)
        # allowed[shape, model code]: the shape may run on that model (none: only the
        # shapes that accept any product)
        self.allowed = np.ones((len(shapes), len(models.values)), dtype=bool)
        for i, s in enumerate(shapes):
            if s.products is not None:
                self.allowed[i] = models.member(frozenset(s.products))
        self.models = len(models.values)
        self.top = int(self.gpus.max()) if len(shapes) else 0
        self.cells = (
            (self.top + 1) * (len(self.cpu_levels) + 1) * (len(self.ram_levels) + 1) * self.models
        )
        self._table: np.ndarray | None = None

    def table(self) -> np.ndarray:
        """fitting[f, c, r, m]: the share of the mix that fits ``f`` free GPUs (at most
        the most any shape asks), the ``c`` lowest CPU levels, the ``r`` lowest memory
        levels, and model code ``m``."""
        if self._table is None:
            shape = (self.top + 1, len(self.cpu_levels) + 1, len(self.ram_levels) + 1)
            hist = np.zeros((*shape, self.models))
            at = (self.gpus[:, 0], self.cpu_at[:, 0] + 1, self.ram_at[:, 0] + 1)
            np.add.at(hist, at, self.share * self.allowed)
            for axis in range(3):
                np.cumsum(hist, axis=axis, out=hist)
            self._table = hist
        return self._table

    def __call__(self, *states: tuple[np.ndarray, ...]) -> np.ndarray:
        """F(before) - F(after) for two (free, cpu, ram, model) column sets."""
        value, _ = self.measure(*(np.concatenate(p) for p in zip(*states, strict=True)))
        half = len(value) // 2
        return value[:half] - value[half:]

    def measure(
        self, frees: np.ndarray, cpus: np.ndarray, rams: np.ndarray, models: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(F, the share of the mix that fits) of each (free, cpu, ram, model) state."""
        frees = np.maximum(frees, 0)  # no free GPUs: nothing to fragment
        cpu_at = np.searchsorted(self.cpu_levels, cpus, side="right")
        ram_at = np.searchsorted(self.ram_levels, rams, side="right")
        work = len(frees) * len(self.share)
        small = self.cells <= min(SMALL_TABLE, TABLE_CELLS)
        if (
            self._table is not None
            or small
            or (work > DIRECT and self.cells <= min(work, TABLE_CELLS))
        ):
            at = self._key(np.minimum(frees, self.top), cpu_at, ram_at, models)
            fitting = self.table().ravel().take(at)
        elif work <= DIRECT:
            fitting = self._fitting(frees, cpu_at, ram_at, models)
        else:  # evaluate each distinct state once
            first, inverse = _distinct(self._key(frees, cpu_at, ram_at, models))
            fitting = self._fitting(frees[first], cpu_at[first], ram_at[first], models[first])
            fitting = fitting[inverse]
        return np.where(frees > 0, frees * (1.0 - fitting), 0.0), fitting

    def _key(
        self, free: np.ndarray, cpu_at: np.ndarray, ram_at: np.ndarray, models: np.ndarray
    ) -> np.ndarray:
        """One integer per (free GPUs, CPU level, memory level, model) state: the
        table's flat index, for free GPUs up to the most a shape asks."""
        key = (free * (len(self.cpu_levels) + 1) + cpu_at) * (len(self.ram_levels) + 1)
        return (key + ram_at) * self.models + models

    def _fitting(
        self, free: np.ndarray, cpu_at: np.ndarray, ram_at: np.ndarray, models: np.ndarray
    ) -> np.ndarray:
        """The share of the mix that fits each state: the shapes that fit, their
        shares added in the mix's order (axis 0)."""
        fits = self.gpus <= free
        fits &= self.cpu_at < cpu_at
        fits &= self.ram_at < ram_at
        fits &= self.allowed[:, models]
        return np.where(fits, self.share, 0.0).sum(axis=0)


def node_fragmentation(
    mix: tuple[MixEntry, ...], models: Codes, cols: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For rows of a view's table (``cols[c, row]``): each node's F(node) against
    ``mix``, and the share of the mix that fits its free GPUs, CPU and memory (what
    the extender exports as the cluster's fragmentation: extender/cluster_metrics.py)."""
    return _Fragmentation(mix, models).measure(cols[FREE], cols[CPU], cols[RAM], cols[MODEL])
