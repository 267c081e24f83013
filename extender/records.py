"""What the cluster cache keeps of a bound pod: its node, GPUs, placement group, the
products it is restricted to, and the CPU and memory beside its GPUs (the workload
mix's shape). Reduced from the Pod's JSON as it arrives, never kept whole."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any

from extender.workload import TaskShape, task_shape
from gpu_scheduler import contract, podspec, sharing
from gpu_scheduler.constraints import annotation_reader, hard_constraints
from gpu_scheduler.fields import FieldError


class PodRecord:
    __slots__ = (
        "cpu_milli", "demand", "gang", "gpus", "group", "key", "name", "node", "priority",
        "products", "ram_mib", "seq", "shares",
    )  # fmt: skip
    #: What __eq__ compares: all but ``seq`` and ``demand``, the cache's bookkeeping.
    _COMPARED = (
        "cpu_milli", "gang", "gpus", "group", "key", "name", "node", "priority", "products",
        "ram_mib", "shares",
    )  # fmt: skip

    def __init__(
        self,
        node: str,
        gpus: int,
        group: tuple[str, str] | None,
        products: tuple[str, ...] | None = None,
        cpu_milli: int = 0,
        ram_mib: int = 0,
        shares: tuple[int, ...] = (),
        key: str = "",
        priority: int = 0,
        gang: str | None = None,
        name: str = "",
    ) -> None:
        self.node = node
        self.gpus = gpus
        self.group = group
        self.products = products  # gpu-products it is restricted to, if any
        self.cpu_milli = cpu_milli
        self.ram_mib = ram_mib
        #: Units of gpu-memory per container that asks a share; its UID, how a node's
        #: report (ANN_GPU_SHARES) names it, and namespace/name for messages: both only
        #: for a GPU pod. Never matched by name: a pod recreated under the same name is
        #: another pod, and must not inherit what the old one held.
        self.shares = shares
        self.key = key
        self.name = name
        #: What preemption weighs (extender/preemption.py): its priority, and the gang
        #: it belongs to (``podspec.pod_gang``), evicted whole or not at all.
        self.priority = priority
        self.gang = gang
        #: When the cache first counted it on its node (cache_assumed._place): the order
        #: a sharing node's unreported pods are fitted in, kept through its updates.
        self.seq = 0
        #: The GPUs' worth it adds to the demand per product, fixed when first counted
        #: (cache_shares._account), so that it is taken away as it was added.
        self.demand: float | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PodRecord) and all(
            getattr(self, key) == getattr(other, key) for key in self._COMPARED
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking: compared, not keyed

    def shape(self) -> TaskShape:
        return task_shape(self.gpus, self.cpu_milli, self.ram_mib, self.products)


def pod_record(pod: Mapping[str, Any]) -> tuple[str, PodRecord] | None:
    """(uid, record) for a bound pod worth keeping, else None. Never raises, on what the
    API server lists or on a Pod as a filter call sends it (the picks the cache assumes):
    a pod whose GPU request cannot be read counts as asking for none."""
    meta = pod.get("metadata")
    spec = pod.get("spec")
    status = pod.get("status")
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return None
    node = spec.get("nodeName")
    if not isinstance(node, str) or not node:
        return None
    phase = status.get("phase") if isinstance(status, Mapping) else None
    if isinstance(phase, str) and phase in contract.TERMINAL_PHASES:
        return None
    uid = object_key(pod)
    if uid is None:
        return None
    try:
        gpus = podspec.pod_gpu_request(spec)
    except FieldError:
        gpus = 0
    try:
        shares = sharing.pod_shares(spec).units
    except (FieldError, sharing.ShareError):
        shares = ()  # the API server or the webhook refuses such a pod; never bound
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    # The pod's knobs, read as the extender reads them for a pod it scores (pod_facts):
    # a malformed one counts as absent here.
    group_name = annotation_reader(annotations, [])(contract.ANN_GROUP)
    namespace = meta.get("namespace")
    group = None
    if group_name:
        group = (sys.intern(namespace if isinstance(namespace, str) else "default"), group_name)
    if gpus == 0 and group is None and not shares:
        return None
    asks = gpus or shares
    products = hard_constraints(annotations).products if asks else None
    restricted = tuple(sorted(sys.intern(p) for p in products)) if products else None
    cpu_milli, ram_mib = podspec.pod_cpu_memory(spec) if asks else (0, 0)
    name = meta.get("name")
    named = f"{namespace}/{name}" if (gpus or shares) and isinstance(name, str) else ""
    key = uid if gpus or shares else ""
    gang = podspec.pod_gang(meta, spec) if asks else None
    return uid, PodRecord(
        sys.intern(node),
        gpus,
        group,
        restricted,
        cpu_milli,
        ram_mib,
        shares,
        key,
        podspec.pod_priority(spec),
        sys.intern(gang) if gang else None,
        named,
    )


def record_on(pod: Mapping[str, Any], node: str) -> tuple[str, PodRecord] | None:
    """(uid, record) of ``pod`` as if bound to ``node`` (a pick, a nomination)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return None
    return pod_record({**pod, "spec": {**spec, "nodeName": node}})


def object_key(obj: Any) -> str | None:
    """The key the cache keeps an API object under: its uid, else namespace/name;
    None for an object with neither (nothing can track it)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return None
    uid = meta.get("uid")
    if isinstance(uid, str) and uid:
        return uid
    name = meta.get("name")
    return f"{meta.get('namespace')}/{name}" if isinstance(name, str) else None


def add_count(counts: MutableMapping[Any, int], key: Any, delta: int) -> None:
    """counts[key] += delta, keeping no zero entries."""
    value = counts.get(key, 0) + delta
    if value:
        counts[key] = value
    else:
        counts.pop(key, None)


def reduced(
    parse: Callable[[Mapping[str, Any]], Any], items: Iterable[Mapping[str, Any]]
) -> list[Any]:
    """``parse`` of each item, the Nones left out: a list of compact records (one page
    of a list at a time: nothing keeps the raw objects)."""
    return [parsed for parsed in map(parse, items) if parsed is not None]
