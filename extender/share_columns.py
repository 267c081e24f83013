"""A call's sharing candidates as a matrix of GPUs: what the gpu policy's best fit and
the fragmentation policy's measure on partial GPUs read, in a few numpy operations.

Row ``i`` is the ``i``-th known candidate, column ``j`` its ``j``-th GPU: ``free``
(units of gpu-memory free for shares; 0 on a GPU sick or given whole; -1 past the
node's last GPU) and ``cap`` (its units; 0 past the last). A GPU is wholly free where
``free == cap > 0``. The placement is :func:`gpu_scheduler.sharing.fit`'s rule, row by
row at once; ``tests/unit/test_share_columns.py`` holds the two equal.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from extender.cache_shares import ShareClass
from extender.columns import Candidates
from extender.view import View
from gpu_scheduler.sharing import Gpu

_BIG = np.int64(1 << 40)


def gpu_matrix(nodes: Candidates, view: View) -> tuple[np.ndarray, np.ndarray]:
    """(free, cap) of the known candidates' GPUs (a node that does not share has none)."""
    rows: list[Sequence[Gpu]] = []
    for j in range(nodes.known):
        facts = nodes.facts(j)
        rows.append(view.shared_gpus(facts) if facts.shared is not None else ())
    width = max((len(r) for r in rows), default=0) or 1
    free = np.full((len(rows), width), -1, dtype=np.int64)
    cap = np.zeros((len(rows), width), dtype=np.int64)
    for i, gpus in enumerate(rows):
        for j, gpu in enumerate(gpus):
            free[i, j] = gpu.free
            cap[i, j] = gpu.capacity
    return free, cap


def place(
    free: np.ndarray, cap: np.ndarray, shares: Sequence[int], whole: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's GPUs once the pod is placed by the fit rule: (free after, whether it
    fits, units left on the GPU the largest share went to). A row where it does not
    fit keeps its GPUs as they were."""
    after = free.copy()
    rows = np.arange(free.shape[0])
    ok = np.ones(free.shape[0], dtype=bool)
    if whole:
        wholly = (free == cap) & (cap > 0)
        take = wholly & (np.cumsum(wholly, axis=1) <= whole)
        ok &= take.sum(axis=1) >= whole
        after[take] = -1  # not a share's, for the rest of this placement
    leftover = np.zeros(free.shape[0], dtype=np.int64)
    largest = max(range(len(shares)), key=lambda k: shares[k], default=0)
    for k, need in enumerate(shares):  # in the kubelet's order, as fit places them
        fits = after >= need
        cand = np.where(fits, after, _BIG)
        j = cand.argmin(axis=1)
        here = cand[rows, j] < _BIG
        ok &= here
        after[rows[here], j[here]] -= need
        if k == largest:
            leftover = np.where(here, after[rows, j], 0)
    if whole:
        after[take & (after == -1)] = 0
    after[~ok] = free[~ok]
    return after, ok, leftover


def share_fragments(
    free: np.ndarray,
    cap: np.ndarray,
    mix: Sequence[ShareClass],
    cpu: np.ndarray,
    ram: np.ndarray,
    unit: float,
) -> np.ndarray:
    """The FGD measure on partial GPUs (Weng et al., ATC'23, section 4), per row, in
    units of GPU memory: what the mix's classes can expect to be unable to use,
    weighted by how often each class comes. A class that cannot run on the node at
    all (no GPU holds its share, too few wholly free GPUs, or less free CPU or memory
    (``cpu``, ``ram``, per row) than it asks) finds all the free memory a fragment; a
    share class that can finds the GPUs with less free than its share; a whole-GPU
    class that can finds each partly used GPU, counted as ``unit`` units (one GPU's
    worth), whatever is left on it: the whole-GPU class loses one GPU when a share
    breaks into a large GPU or a small one, and the share classes keep what is left.
    (Counted by what is left, as the paper counts it, breaking a large GPU looks
    worse than breaking a small one, and the large GPUs, which hold the most shares,
    go to whole-GPU pods.)"""
    usable = np.maximum(free, 0)
    total = usable.sum(axis=1).astype(np.float64)
    out = np.zeros(free.shape[0])
    wholly = (free == cap) & (cap > 0)
    whole_count = wholly.sum(axis=1)
    partial = ((usable > 0) & ~wholly).sum(axis=1) * float(unit)
    for kind, size, cpu_milli, ram_mib, weight in mix:
        runs = (cpu >= cpu_milli) & (ram >= ram_mib)
        if kind == "share":
            small = usable < size
            runs &= (~small & (usable > 0)).any(axis=1)
            frag = np.where(runs, (usable * small).sum(axis=1), total)
        else:
            frag = np.where(runs & (whole_count >= size), partial, total)
        out += weight * frag
    return out


def gpu_unit(cap: np.ndarray) -> float:
    """One GPU's worth of units among these candidates: the median GPU's (0: none)."""
    sizes = cap[cap > 0]
    return float(np.median(sizes)) if sizes.size else 0.0
