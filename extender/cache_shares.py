"""The cluster cache's accounting of what a bound pod takes on its node: whole GPUs,
the CPU and memory beside them, its placement group, the demand per product, and on a
sharing node the state of each GPU (``gpu_scheduler.sharing.usage``: what the node
reported, then the bound pods it has not reported yet, fitted by the one rule).

Mixed into :class:`~extender.cache.ClusterCache`; every method runs under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from extender.layered import Layered
from extender.model import NodeFacts
from extender.records import PodRecord
from extender.records import add_count as _add
from extender.workload import task_shape
from gpu_scheduler.sharing import BoundPod, Gpu, gpu_units, usage

#: The share classes kept in the mix the share policy scores against (heaviest first).
MAX_SHARE_CLASSES = 32


class ShareClass(NamedTuple):
    """A class of what bound pods ask of sharing nodes: kind "share" (size: units on one
    GPU) or "whole" (size: GPUs), with the CPU and memory beside it (on the workload
    mix's grid, :func:`extender.workload.task_shape`), and its share of the pods."""

    kind: str
    size: int
    cpu_milli: int
    ram_mib: int
    weight: float


class PodAccounting:
    """Mixed into the cluster cache: counts a pod's resources on its node."""

    def _init_accounting(self) -> None:
        self._seq = 0  # the last PodRecord.seq given (cache_assumed._place)
        #: A sharing node's GPUs as shares are placed (extender/policies/share.py).
        self._gpus: Layered[str, tuple[Gpu, ...]] = Layered()
        #: Bound pods by what they ask of a GPU: ("share", units, CPU, memory) per
        #: container asking a share, ("whole", GPUs, CPU, memory) per pod asking whole
        #: GPUs (CPU and memory on the mix's grid).
        self._share_counts: dict[tuple[str, int, int, int], int] = {}
        self._misfits: dict[str, int] = {}

    def _account(self, record: PodRecord, sign: int) -> None:
        _add(self._used, record.node, sign * record.gpus)
        if record.gpus or record.shares:
            _add(self._cpu_used, record.node, sign * record.cpu_milli)
            _add(self._ram_used, record.node, sign * record.ram_mib)
        if record.gpus:
            self._shapes.add(record.shape(), sign)
        if record.shares or record.gpus:
            shape = task_shape(record.gpus, record.cpu_milli, record.ram_mib, None)
            for units in record.shares:
                _add(self._share_counts, ("share", units, shape.cpu_milli, shape.ram_mib), sign)
            if record.gpus:
                key = ("whole", record.gpus, shape.cpu_milli, shape.ram_mib)
                _add(self._share_counts, key, sign)
        self._account_demand(record, sign)
        if record.group is not None:
            members = self._groups.setdefault(record.group, {})
            count = members.get(record.node, 0) + sign
            if count > 0:
                members[record.node] = count
            else:
                members.pop(record.node, None)
                if not members:
                    del self._groups[record.group]

    def _account_demand(self, record: PodRecord, sign: int) -> None:
        """The pod's GPU demand, in all and per product it is restricted to (kept on the
        record, so that taking it away takes away what was added)."""
        demand = record.demand
        if demand is None:
            demand = record.demand = record.gpus + self._share_gpus(record)
        self._demand_total += sign * demand
        for product in record.products or ():
            share = self._demand.get(product, 0.0) + sign * demand / len(record.products)
            if share > 1e-9:
                self._demand[product] = share
            else:
                self._demand.pop(product, None)

    def _node_changed(self, name: str, old: NodeFacts | None, new: NodeFacts | None) -> None:
        """A node's facts changed: the per-model capacity they add, and the demand of its
        pods that ask shares, counted in GPUs of this node (a share's units over those of
        one of its GPUs): worked out again where its GPU memory changed, as when a pod
        was counted before its node was known."""
        for facts, sign in ((old, -1), (new, 1)):
            if facts is not None and facts.model and facts.allocatable:
                left = self._capacity.get(facts.model, 0) + sign * facts.allocatable
                if left > 0:
                    self._capacity[facts.model] = left
                else:
                    self._capacity.pop(facts.model, None)
        if (old and old.memory_mib) == (new and new.memory_mib):
            return
        for uid in self._node_pods.get(name, ()):
            record = self._pods.get(uid)
            if record is not None and record.shares:
                self._account_demand(record, -1)
                record.demand = None
                self._account_demand(record, 1)

    def _share_gpus(self, record: PodRecord) -> float:
        """The GPUs' worth of a pod's shares: each share's units over the units of one
        GPU of its node (a whole GPU each where the node is not known yet)."""
        if not record.shares:
            return 0.0
        facts = self._nodes.get(record.node)
        units = gpu_units(facts.memory_mib) if facts is not None else 0
        return sum(min(1.0, share / units) if units else 1.0 for share in record.shares)

    def _shared_gpus(self, name: str, facts: NodeFacts) -> tuple[Gpu, ...] | None:
        """Recompute a sharing node's GPUs from its report and its bound pods, in the
        order they were seen (None, and nothing kept, for a node that does not share)."""
        shared = facts.shared
        if shared is None:
            self._gpus.pop(name, None)
            self._misfits.pop(name, None)
            return None
        if facts.dra:  # the claims say what each device gives: nothing to fit
            state = self._gpus[name] = self._dra.shared_gpus(name)
            return state
        pods = self._pods
        records = sorted(
            (
                record
                for uid in self._node_pods.get(name, ())
                if (record := pods.get(uid)) is not None and (record.gpus or record.shares)
            ),
            key=lambda record: record.seq,  # first counted first: kept through updates
        )
        bound = [BoundPod(record.key, record.gpus, record.shares) for record in records]
        state, misfits = usage(shared.gpus, shared.report, bound)
        self._gpus[name] = state
        if misfits:
            self._misfits[name] = misfits
        else:
            self._misfits.pop(name, None)
        return state

    def share_mix(self) -> tuple[ShareClass, ...]:
        """The classes of what bound pods ask of shared nodes, heaviest first, weights
        summing to 1 (empty when no pod asks a share)."""
        counts = self._share_counts
        if not any(key[0] == "share" for key in counts):
            return ()
        top = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:MAX_SHARE_CLASSES]
        total = sum(count for _, count in top)
        return tuple(ShareClass(*key, count / total) for key, count in top)

    @property
    def misfits(self) -> Mapping[str, int]:
        """Sharing nodes where bound pods did not fit their GPUs, and how many."""
        return self._misfits

    def preemption_pods(
        self, names: Iterable[str]
    ) -> tuple[dict[str, list[tuple[str, PodRecord]]], dict[str, frozenset[str]], frozenset[str]]:
        """For the preempt verb: each named node's pods that take GPUs, (uid, record),
        every gang of those pods -> the UIDs of all its members, wherever they run
        (the whole cache is read: preemption is rare, and a gang spans nodes), and
        which of those pods are picks not bound yet (never victims: kube-scheduler
        would not find them on the node)."""
        with self._lock:
            pods = self._pods
            on = {
                name: [
                    (uid, record)
                    for uid in self._node_pods.get(name, ())
                    if (record := pods.get(uid)) is not None and (record.gpus or record.shares)
                ]
                for name in names
            }
            wanted = {record.gang for found in on.values() for _, record in found if record.gang}
            gangs: dict[str, set[str]] = {gang: set() for gang in wanted}
            if wanted:
                for uid, record in pods.items():
                    if record.gang in gangs:
                        gangs[record.gang].add(uid)
            picks = frozenset(
                uid for found in on.values() for uid, _ in found if uid in self._assumed
            )
        return on, {gang: frozenset(uids) for gang, uids in gangs.items()}, picks
