"""Node facts as columns: what lets one extender call decide 500 candidates in a few
numpy operations instead of 500 Python-level steps per policy.

kube-scheduler sends every candidate on every call (about 500 at 5,000 nodes under its
adaptive sampling, all of them at 100%), and its scheduling cycle is serial: each
microsecond per candidate is paid by every pod. So the cluster cache keeps, next to
its :class:`~extender.model.NodeFacts`, one row of integers per node (:class:`NodeTable`:
the facts the vector forms of the policies read, and the node's free GPUs, CPU and
memory), updated where the node or its pods change. A view holds a copy
(:class:`TableSnapshot`); a call gathers its candidates' rows in one indexing step
(:class:`Candidates`). Facts in hand (``gpu-scheduler explain``, preemption's what-if
view of one node, tests) make the same rows with :meth:`Candidates.from_facts`.

The rows hold codes, not strings: a GPU model or zone is a small integer whose string
is in the table's ``models``/``zones`` (0 stands for none). The policies' ``word``
methods, which put a refusal the rows decided into words, read :class:`NodeFacts`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter

import numpy as np

from extender.model import NodeFacts, canon
from gpu_scheduler.sharing import Gpu, node_state

#: What a node has left for the next GPU pod: (free GPUs of those it can give (see
#: ``NodeFacts.usable``), free CPU millicores, free memory MiB, GPU model). CPU and
#: memory count what its bound GPU pods request; a node with unknown allocatable CPU
#: or memory is not limited by it (:data:`UNLIMITED`).
FreeState = tuple[int, int, int, str | None]
UNLIMITED = 1 << 62


def free_state(
    node: NodeFacts,
    used_gpus: int,
    cpu_used: int,
    ram_used: int,
    gpus: Sequence[Gpu] | None = None,
) -> FreeState:
    """On a sharing node (``gpus``: its GPUs as shares are placed), a whole GPU is free
    only where no share is placed either."""
    cpu, ram = node.cpu_milli, node.ram_mib
    free = node.usable - used_gpus
    if gpus is not None:
        free = min(free, sum(1 for g in gpus if g.whole_free))
    return canon(
        (
            free,
            UNLIMITED if cpu is None else cpu - cpu_used,
            UNLIMITED if ram is None else ram - ram_used,
            node.model,
        )
    )


#: Row layout: present and readable (1/0), allocatable GPUs, free GPUs, free CPU
#: (millicores), free memory (MiB), GPU model code, GPU memory per pod (MiB; -1 none),
#: labelled as a GPU node (1/0), spot capacity (1/0), zone code, PreferNoSchedule
#: taints (1/0; which ones: ``NodeFacts.soft_taints``), the largest share one GPU
#: can still take (units of gpu-memory; -1: not a sharing node), the units free for
#: shares on all its GPUs, the GPUs it can give (``NodeFacts.usable``: allocatable
#: less the sick ones).
OK, ALLOC, FREE, CPU, RAM, MODEL, MEMORY, LABELLED, SPOT, ZONE, SOFT = range(11)
LARGEST, SHARE_FREE, USABLE = 11, 12, 13
WIDTH = 14
#: Every value is kept inside this (the facts are clamped far below it already), so
#: the arithmetic a policy does on a row (free - request) cannot overflow int64.
LIMIT = 1 << 61


def bound(value: int) -> int:
    return -LIMIT if value < -LIMIT else LIMIT if value > LIMIT else value


class Codes:
    """Strings as small integers, 0 for none: append-only, so codes in any snapshot
    stay valid while the cache adds more."""

    __slots__ = ("ids", "values")

    def __init__(self) -> None:
        self.ids: dict[str | None, int] = {None: 0, "": 0}
        self.values: list[str | None] = [None]

    def code(self, value: str | None) -> int:
        got = self.ids.get(value)
        if got is None:
            got = self.ids[value] = len(self.values)
            self.values.append(value)
        return got

    def lookup(self, table: Mapping[str, float], default: float) -> np.ndarray:
        """``table`` as an array indexed by code (``default`` for codes it lacks)."""
        out = np.full(len(self.values), default)
        ids = self.ids
        for value, number in table.items():
            code = ids.get(value)
            if code:
                out[code] = number
        return out

    def member(self, values: frozenset[str] | set[str]) -> np.ndarray:
        """A boolean array indexed by code: True where the code's string is in ``values``."""
        out = np.zeros(len(self.values), dtype=bool)
        ids = self.ids
        for value in values:
            code = ids.get(value)
            if code:
                out[code] = True
        return out


def row(
    facts: NodeFacts,
    free: FreeState,
    models: Codes,
    zones: Codes,
    shared: Sequence[Gpu] | None = None,
) -> list[int]:
    """A node's row (:data:`WIDTH` integers) from its facts, its FreeState, and on a
    sharing node its GPUs."""
    gpus, cpu, ram, _ = free
    memory = facts.memory_mib
    largest = max((g.free for g in shared), default=0) if shared is not None else -1
    return [
        1 if facts.error is None else 0,
        facts.allocatable,
        bound(gpus),
        bound(cpu),
        bound(ram),
        models.code(facts.model),
        -1 if memory is None else bound(memory),
        1 if facts.labelled_gpu else 0,
        1 if facts.capacity_type == "spot" else 0,
        zones.code(facts.zone),
        1 if facts.soft_taints else 0,
        largest,
        sum(g.free for g in shared) if shared is not None else 0,
        bound(facts.usable),
    ]


def _beat(facts: NodeFacts) -> float:
    return np.nan if facts.heartbeat is None else facts.heartbeat


def _slots(slots: Mapping[str, int], names: Sequence[str]) -> Iterable[int]:
    """Each name's slot, 0 for a name not in ``slots`` (all found: looked up in C)."""
    if len(names) > 1:
        try:
            return itemgetter(*names)(slots)  # type: ignore[no-any-return]
        except KeyError:  # some unknown: look each up with a default
            pass
    return map(slots.get, names, repeat(0))


@dataclass(slots=True, eq=False)
class TableSnapshot:
    """An immutable copy of the table for one view: the rows (one per column,
    ``cols[c, slot]``), each node's heartbeat (NaN: none), and name -> slot. Slot 0
    is a row of zeros that stands for an unknown node."""

    cols: np.ndarray
    beats: np.ndarray
    slots: Mapping[str, int]
    models: Codes
    zones: Codes

    def lookup(self, names: Sequence[str]) -> tuple[np.ndarray, bool]:
        """The slot of each name (0: not known), and whether the names are known to be
        distinct: all known, and no slot twice (False where some are unknown, or one
        repeats)."""
        slots = np.fromiter(_slots(self.slots, names), np.intp, len(names))
        distinct = bool(slots.all())
        if distinct and len(slots) > 1:  # no slot twice: counted in flags, no sort
            seen = np.zeros(len(self.beats), dtype=bool)
            seen[slots] = True
            distinct = int(np.count_nonzero(seen)) == len(slots)
        return slots, distinct


class NodeTable:
    """The cluster cache's rows, one per known node, kept in step by :meth:`put`
    (the caller holds the cache's lock); :meth:`snapshot` for a view."""

    def __init__(self, capacity: int = 64) -> None:
        self.models = Codes()
        self.zones = Codes()
        self._cols = np.zeros((WIDTH, capacity + 1), dtype=np.int64)
        self._beats = np.full(capacity + 1, np.nan)
        self._slots: dict[str, int] = {}
        self._spare: list[int] = []
        self._high = 1  # slots in use are below this
        self._slots_copy: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self._slots)

    def put(
        self,
        name: str,
        facts: NodeFacts | None,
        free: FreeState | None,
        gpus: Sequence[Gpu] | None = None,
    ) -> None:
        """Set a node's row (``facts`` None: the node is gone; ``gpus``: a sharing
        node's GPUs)."""
        slot = self._slots.get(name)
        if facts is None or free is None:
            if slot is not None:
                del self._slots[name]
                self._cols[:, slot] = 0
                self._beats[slot] = np.nan
                self._spare.append(slot)
                self._slots_copy = None
            return
        if slot is None:
            slot = self._spare.pop() if self._spare else self._grow()
            self._slots[name] = slot
            self._slots_copy = None
        self._cols[:, slot] = row(facts, free, self.models, self.zones, gpus)
        self._beats[slot] = _beat(facts)

    def _grow(self) -> int:
        slot = self._high
        if slot >= self._cols.shape[1]:
            width = self._cols.shape[1] * 2
            cols = np.zeros((WIDTH, width), dtype=np.int64)
            cols[:, :slot] = self._cols[:, :slot]
            beats = np.full(width, np.nan)
            beats[:slot] = self._beats[:slot]
            self._cols, self._beats = cols, beats
        self._high += 1
        return slot

    def snapshot(self) -> TableSnapshot:
        if self._slots_copy is None:
            self._slots_copy = dict(self._slots)
        high = self._high
        return TableSnapshot(
            self._cols[:, :high].copy(),
            self._beats[:high].copy(),
            self._slots_copy,
            self.models,
            self.zones,
        )


@dataclass(slots=True, eq=False)
class Candidates:
    """One call's candidates: the names in order, and the rows of those the view
    knows and can read (*known*; the policies see only these, by position)."""

    names: Sequence[str]
    #: ``len(names)``.
    count: int
    #: Positions among ``names`` of the known candidates; None: all are known.
    where: np.ndarray | None
    #: ``cols[c]``: column ``c`` over the known candidates.
    cols: np.ndarray
    beats: np.ndarray
    models: Codes
    zones: Codes
    #: Candidate ``i``'s facts, by its position among ``names``.
    _facts: Callable[[int], NodeFacts | None] = field(repr=False)
    #: The names are known to be distinct (False: the caller must check them).
    distinct: bool = True

    @property
    def known(self) -> int:
        return self.cols.shape[1]

    def position(self, j: int) -> int:
        """The position among ``names`` of the ``j``-th known candidate."""
        return j if self.where is None else int(self.where[j])

    def facts(self, j: int) -> NodeFacts:
        """The facts of the ``j``-th known candidate (for a reason's wording)."""
        return self._facts(self.position(j))

    def unknown(self) -> int:
        """How many candidates the view does not know at all (not merely unreadable)."""
        if self.where is None:
            return 0
        known = set(self.where.tolist())
        return sum(1 for i in range(self.count) if i not in known and self._facts(i) is None)

    def at(self, i: int) -> NodeFacts | None:
        """The facts of candidate ``i`` (by its position among all): for one that is
        not known, None (not in the view) or facts whose ``error`` says why they
        cannot be read."""
        return self._facts(i)

    @classmethod
    def from_view(cls, names: Sequence[str], table: TableSnapshot, nodes: Mapping[str, NodeFacts]):
        """From a view's table: one lookup per name, then one gather per call."""
        slots, distinct = table.lookup(names)
        cols = table.cols.take(slots, axis=1)
        beats = table.beats.take(slots)
        where = None
        ok = cols[OK]
        if not ok.all():
            where = np.flatnonzero(ok)
            cols, beats = cols.take(where, axis=1), beats.take(where)
        get = nodes.get
        return cls(
            names,
            len(names),
            where,
            cols,
            beats,
            table.models,
            table.zones,
            lambda i: get(names[i]),
            distinct,
        )

    @classmethod
    def from_facts(
        cls,
        names: Sequence[str],
        nodes: Sequence[NodeFacts | None],
        free: Mapping[str, FreeState],
        used: Mapping[str, int],
        gpus: Mapping[str, Sequence[Gpu]] | None = None,
    ):
        """From facts in hand, not the cache's table (module docstring). A node
        absent from ``free`` has its own allocatable free and no pods known; a sharing
        node absent from ``gpus`` has nothing placed on its GPUs."""
        models, zones = Codes(), Codes()
        rows, beats, where = [], [], []
        for i, node in enumerate(nodes):
            if node is None or node.error is not None:
                continue
            state = free.get(node.name)
            shared = (gpus or {}).get(node.name)
            if shared is None and node.shared is not None:
                shared = node_state(node.shared.gpus)
            if state is None:
                state = free_state(node, used.get(node.name, 0), 0, 0, shared)
            rows.append(row(node, state, models, zones, shared))
            beats.append(_beat(node))
            where.append(i)
        cols = np.array(rows, dtype=np.int64).T if rows else np.zeros((WIDTH, 0), np.int64)
        all_known = len(where) == len(names)
        return cls(
            names,
            len(names),
            None if all_known else np.array(where, dtype=np.intp),
            np.ascontiguousarray(cols),
            np.array(beats, dtype=np.float64),
            models,
            zones,
            nodes.__getitem__,
        )
