"""What the policies may know about the cluster, fixed for the length of one request.

A :class:`View` is immutable once made: the cluster cache builds a new one when the
API server has said something new (or a second has passed), and a request keeps the
one it started with, so a node never vanishes mid-request and a pod's GPUs are never
counted half-moved.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from extender.cache_shares import ShareClass
from extender.columns import Candidates, FreeState, TableSnapshot
from extender.model import NodeFacts, PodFacts
from extender.workload import MixEntry
from gpu_scheduler.sharing import Gpu, node_state

EMPTY: Mapping[Any, Any] = MappingProxyType({})


class View:
    """The cluster as one request sees it (``ClusterView`` in the policies)."""

    __slots__ = (
        "age",
        "beats",
        "claim_shares",
        "free",
        "gpus",
        "groups",
        "mix",
        "nodes",
        "nominated",
        "pods",
        "pressure",
        "prioritized",
        "share_mix",
        "stale",
        "table",
        "time",
        "used",
        "version",
    )

    def __init__(
        self,
        *,
        nodes: Mapping[str, NodeFacts] = EMPTY,
        used: Mapping[str, int] = EMPTY,
        free: Mapping[str, FreeState] = EMPTY,
        mix: tuple[MixEntry, ...] = (),
        gpus: Mapping[str, tuple[Gpu, ...]] = EMPTY,
        share_mix: tuple[ShareClass, ...] = (),
        claim_shares: Mapping[str, tuple[int, ...]] = EMPTY,
        groups: Mapping[tuple[str, str], Mapping[str, int]] = EMPTY,
        pressure: Mapping[str, float] = EMPTY,
        beats: Sequence[float] = (),
        pods: int = 0,
        now: float | None = None,
        age: float | None = None,
        stale: bool = False,
        version: Any = None,
        table: TableSnapshot | None = None,
        nominated: Mapping[str, Any] = EMPTY,
        prioritized: frozenset[str] = frozenset(),
    ) -> None:
        #: Node facts by name.
        self.nodes = nodes
        #: GPUs requested by the pods bound to each node (absent: none).
        self.used = used
        #: Each known node's :data:`FreeState`, kept current by the cache as pods come
        #: and go, so a per-node loop reads one entry instead of deriving it.
        self.free = free
        #: The shapes of the bound GPU pods, heaviest first (extender.workload).
        self.mix = mix
        #: Each sharing node's GPUs as shares are placed on them (cache_shares).
        self.gpus = gpus
        #: What bound pods ask of GPUs, by share size and whole count (cache_shares).
        self.share_mix = share_mix
        #: namespace/name of a ResourceClaim -> GiB its requests ask of one GPU each.
        self.claim_shares = claim_shares
        #: (namespace, group) -> node -> pods of that placement group bound there.
        self.groups = groups
        self.pressure = pressure
        #: Agent heartbeats of every node that has one, sorted (seconds since epoch).
        self.beats = beats
        self.pods = pods
        self.time = time.time() if now is None else now
        #: Seconds since the API server last said anything (None: no cache).
        self.age = age
        #: True when that is longer than the cache trusts (``STALE_AFTER``).
        self.stale = stale
        self.version = version
        #: The same nodes as rows: what :meth:`candidates` gathers.
        self.table = table
        #: Node -> its nominated GPU pods, (uid, record as if bound there): pending
        #: preemptors (extender/cache_pending.py; filter counts them: nominated.py).
        self.nominated = nominated
        #: namespace/name of the ResourceClaims whose requests list devices in order
        #: of preference (``firstAvailable``): kube-scheduler scores which it gets.
        self.prioritized = prioritized

    def used_gpus(self, node: str) -> int:
        return self.used.get(node, 0)

    def free_gpus(self, node: NodeFacts) -> int:
        """GPUs a pod can still be given on ``node``: what the cache keeps for it
        (columns.free_state), or, for a node it does not keep (facts in hand: explain,
        tests), its usable GPUs less the ones in use."""
        state = self.free.get(node.name)
        return state[0] if state is not None else node.usable - self.used.get(node.name, 0)

    def shared_gpus(self, node: NodeFacts) -> tuple[Gpu, ...]:
        """A sharing node's GPUs as shares are placed: the cache's, or for a node it
        does not keep its GPUs as if nothing were placed."""
        state = self.gpus.get(node.name)
        if state is not None:
            return state
        return node_state(node.shared.gpus) if node.shared is not None else ()

    def pod_shares(self, pod: PodFacts) -> tuple[int, ...]:
        """What a pod asks of shared GPUs: its gpu-memory shares, else what its
        ResourceClaims ask of a shareable DRA device (kube-scheduler allocates those;
        the policies score them)."""
        if pod.shares or not pod.claims:
            return pod.shares
        get = self.claim_shares.get
        return tuple(units for ref in pod.claims for units in get(ref, ()))

    def group_zones(self, namespace: str, group: str) -> dict[str, int]:
        """Zone -> pods of this placement group already running there."""
        zones: dict[str, int] = {}
        for name, count in self.groups.get((namespace, group), EMPTY).items():
            node = self.nodes.get(name)
            if node is not None and node.zone:
                zones[node.zone] = zones.get(node.zone, 0) + count
        return zones

    def product_pressure(self) -> Mapping[str, float]:
        return self.pressure

    def now(self) -> float:
        return self.time

    def silent_agents(self, oldest: float) -> tuple[int, int]:
        """(agents whose heartbeat is older than ``oldest``, agents) across the whole
        cluster."""
        return bisect.bisect_left(self.beats, oldest), len(self.beats)

    def lookup(self, names: Sequence[str]) -> list[NodeFacts | None]:
        return list(map(self.nodes.get, names))

    def candidates(self, names: Sequence[str]) -> Candidates:
        """The rows of ``names`` (from the table, else built from the node facts)."""
        if self.table is not None:
            return Candidates.from_view(names, self.table, self.nodes)
        return Candidates.from_facts(names, self.lookup(names), self.free, self.used, self.gpus)
