"""The facts the policies decide on, parsed once from Node and Pod JSON.

Only the fields the policies need are kept (slotted objects, interned strings), so
the cluster cache stays small at thousands of nodes and the hot path reads plain
attributes instead of walking nested dicts.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from gpu_scheduler import contract, podspec, sharing
from gpu_scheduler.constraints import annotation_reader, hard_constraints
from gpu_scheduler.fields import FieldError, expect_object, object_at, string_at
from gpu_scheduler.quantity import (
    QuantityError,
    mib,
    millis,
    parse_count,
    parse_quantity,
    type_name,
)
from gpu_scheduler.taints import (
    SoftTaint,
    SoftToleration,
    node_soft_taints,
    pod_soft_tolerations,
)
from gpu_scheduler.textclip import clip
from gpu_scheduler.timestamps import rfc3339_seconds

PLACEMENTS = ("binpack", "spread")

_intern = sys.intern

#: Values many nodes share (a zone's topology domains, an instance type's CPU and
#: memory, an idle node's free state), kept once: at 5,000 nodes each copy is
#: 30-100 bytes a node (docs/BENCHMARKS.md, "Cache footprint"). Bounded: past this
#: many distinct values a new one is kept as it is.
CANON_LIMIT = 1 << 14
_CANON: dict[Any, Any] = {}


def canon(value: Any) -> Any:
    """The one kept instance equal to ``value`` (hashable, immutable), or ``value``."""
    kept = _CANON.get(value)
    if kept is not None:
        return kept
    if len(_CANON) < CANON_LIMIT:
        _CANON[value] = value
    return value


#: Longest Node name (a DNS subdomain) and namespace/name of a pod we keep.
MAX_NAME = 253
#: More GPUs than any node has; bigger counts are clamped so arithmetic stays small.
MAX_GPUS = 1 << 20


@dataclass(slots=True)
class NodeFacts:
    """What the extender knows about one node.

    ``allocatable`` counts what a pod asks for: whole GPUs, MIG devices under GFD's
    single strategy, replicas of a time-sliced or MPS-shared GPU (GPUs times replicas), or
    a DRA driver's devices of the class serving ``nvidia.com/gpu``. ``product`` is the
    label value (``…-SHARED`` when shared, ``…-MIG-1g.10gb`` under MIG single), ``model``
    the same without ``-SHARED``. ``memory_mib`` is what one pod can count on: the GPU's
    (or MIG slice's) memory, divided by the replicas when the GPU is shared.
    """

    name: str
    allocatable: int = 0
    _: KW_ONLY
    labelled_gpu: bool = False
    memory_mib: int | None = None
    product: str | None = None
    #: ``product`` without ``-SHARED``, interned (None: no product).
    model: str | None = field(init=False)
    capacity_type: str | None = None
    zone: str | None = None
    heartbeat: float | None = None
    #: GFD's gpu.replicas: > 1 when the device plugin time-slices or MPS-shares.
    replicas: int = 1
    #: True when the GPUs come from a DRA driver's ResourceSlices.
    dra: bool = False
    #: Allocatable CPU (millicores) and memory (MiB) of the node; None: unknown.
    cpu_milli: int | None = None
    ram_mib: int | None = None
    #: Why the Node object could not be read (a field of the wrong type): the
    #: node then fails every pod with this reason.
    error: str | None = None
    #: What the agent's ``gpu-scheduler.io/gpus`` annotation says of the GPUs'
    #: health (None: no annotation, or unreadable); on a DRA node, its devices'
    #: blocking taints (the driver's word, believed without an agent).
    health: contract.GpuHealth | None = None
    #: True when the node's agent holds its heartbeat Lease: only
    #: then is ``health`` believed, so an annotation a departed agent left behind
    #: never holds GPUs back.
    managed: bool = False
    #: (label key, value) of each topology level the node is labelled with (the
    #: extender's ``groupLevels``); without them, its zone alone (given None, set
    #: so at init: never None on a made object).
    domains: tuple[tuple[str, str], ...] | None = None
    #: Its ``PreferNoSchedule`` taints, (key, value) (gpu_scheduler/taints.py).
    soft_taints: tuple[SoftTaint, ...] = ()
    #: Its GPUs as shares are placed on them (None: not a sharing node).
    shared: SharedNode | None = None

    def __post_init__(self) -> None:
        product, zone = self.product, self.zone
        self.model = _opt_intern(contract.base_product(product)) if product else None
        if self.domains is None:
            self.domains = ((contract.LABEL_ZONE, zone),) if zone else ()

    @property
    def usable(self) -> int:
        """GPUs a pod can be given: ``allocatable``, and on an agent-managed node no
        more than the agent reads healthy (the device plugin can still count a GPU
        that has failed: its health checks off, or between an XID and its update)."""
        health = self.health
        if health is None or not (self.managed or self.dra):
            return self.allocatable
        return health.usable(self.allocatable)

    @property
    def unhealthy(self) -> tuple[str, ...]:
        """The unhealthy GPUs in words, where they are believed (see ``usable``): the
        agent's, or on a DRA node its devices with a NoSchedule/NoExecute taint."""
        health = self.health
        return health.unhealthy if health is not None and (self.managed or self.dra) else ()

    @property
    def has_gpus(self) -> bool:
        return self.allocatable > 0 or self.labelled_gpu


@dataclass(frozen=True, slots=True)
class SharedNode:
    """A node whose GPUs the agent's device plugin shares (``gpu-scheduler.io/gpu-sharing``,
    or allocatable ``gpu-scheduler.io/gpu-memory``): its mode, its GPUs as (UUID,
    capacity units, healthy) (:func:`gpu_scheduler.sharing.node_gpus`), what it
    reported each pod holds, and the units it advertises."""

    mode: str
    gpus: tuple[tuple[str, int, bool], ...]
    report: Mapping[str, Mapping[str, int | str]] | None
    allocatable: int


def _shared_node(
    labels: Mapping[str, Any], annotations: Mapping[str, Any], allocatable: Mapping[str, Any]
) -> SharedNode | None:
    mode = labels.get(contract.LABEL_GPU_SHARING)
    raw = allocatable.get(contract.RESOURCE_GPU_MEMORY)
    units = 0
    if raw is not None:
        try:
            units = min(parse_count(raw, "allocatable GPU memory"), sharing.MAX_UNITS * 64)
        except QuantityError:
            units = 0
    if mode not in contract.SHARING_MODES and units <= 0:
        return None
    gpus = sharing.node_gpus(
        annotations.get(contract.ANN_GPUS),
        contract.label_int(labels.get(contract.LABEL_GPU_COUNT)),
        contract.node_gpu_memory_mib(labels),
    )
    report = sharing.read_report(annotations.get(contract.ANN_GPU_SHARES))
    return SharedNode(mode if isinstance(mode, str) else "unlabelled", gpus, report, units)


def _opt_intern(value: str | None) -> str | None:
    return _intern(value) if value else None


def node_facts(node: Any, levels: Sequence[str] = contract.TOPOLOGY_LEVELS) -> NodeFacts:
    """Facts from a Node object in its JSON form; ``levels``: the topology labels whose
    values it keeps (:attr:`NodeFacts.domains`).

    Raises :class:`FieldError` only when the node has no usable ``metadata.name``
    (nothing can even be said about it). Any other field of the wrong type gives facts
    whose ``error`` names the field, so that node fails with that reason.
    """
    if not isinstance(node, Mapping):
        raise FieldError("node", f"must be an object, not {type_name(node)}")
    meta = node.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        raise FieldError("metadata.name", f"must be a node name (1..{MAX_NAME} characters)")
    try:
        return _node_facts(_intern(name), meta, node, levels)  # type: ignore[arg-type]
    except FieldError as exc:
        return NodeFacts(_intern(name), error=f"the Node object is malformed: {exc}")


def _node_facts(
    name: str, meta: Mapping[str, Any], node: Mapping[str, Any], levels: Sequence[str]
) -> NodeFacts:
    labels = object_at(meta, "labels", "metadata.labels")
    status = object_at(node, "status", "status")
    raw = object_at(status, "allocatable", "status.allocatable").get(contract.RESOURCE_GPU)
    allocatable = 0
    if raw is not None:
        try:
            allocatable = parse_count(raw, "allocatable GPUs")
        except QuantityError as exc:
            raise FieldError(f'status.allocatable["{contract.RESOURCE_GPU}"]', str(exc)) from None

    def label(key: str) -> str | None:
        return string_at(labels, key, f'metadata.labels["{key}"]')

    present = label(contract.LABEL_GPU_PRESENT)
    label(contract.LABEL_GPU_MEMORY)
    for key, _spot in contract.SPOT_LABELS:
        label(key)
    replicas = _replicas(label(contract.LABEL_GPU_REPLICAS))
    if label(contract.LABEL_GKE_GPU_SHARING_STRATEGY):  # GKE's shared pools: no GFD there
        replicas = max(replicas, _replicas(label(contract.LABEL_GKE_MAX_SHARED_CLIENTS)))
    memory = contract.node_gpu_memory_mib(labels)
    allocatable_map = object_at(status, "allocatable", "status.allocatable")
    product = _opt_intern(label(contract.LABEL_GPU_PRODUCT))
    annotations = object_at(meta, "annotations", "metadata.annotations")
    health = contract.gpu_health(
        annotations.get(contract.ANN_GPUS), replicas, bool(product and contract.MIG_PART in product)
    )
    return NodeFacts(
        name,
        min(allocatable, MAX_GPUS),
        labelled_gpu=present == "true" or contract.LABEL_GPU_COUNT in labels,
        memory_mib=canon(memory // replicas) if memory is not None else None,
        product=product,
        capacity_type=contract.capacity_type(labels),
        zone=_opt_intern(label(contract.LABEL_ZONE)),
        domains=canon(tuple((key, _intern(value)) for key in levels if (value := label(key)))),
        replicas=replicas,
        cpu_milli=canon(_milli(allocatable_map.get("cpu"))),
        ram_mib=canon(_mib(allocatable_map.get("memory"))),
        health=health,
        soft_taints=node_soft_taints(node.get("spec")),
        shared=_shared_node(labels, annotations, allocatable_map),
    )


#: Larger CPU or memory figures are clamped (a node never has 2**40 cores or MiB).
MAX_RESOURCE = 1 << 40


def _clamp(value: int) -> int:
    return 0 if value < 0 else min(value, MAX_RESOURCE)


def _milli(value: Any) -> int | None:
    """A CPU quantity in millicores; None when absent or unreadable (it only informs
    a preference, so a bad value must not fail the node)."""
    try:
        return None if value is None else _clamp(millis(parse_quantity(value)))
    except QuantityError:
        return None


def _mib(value: Any) -> int | None:
    try:
        return None if value is None else _clamp(mib(parse_quantity(value)))
    except QuantityError:
        return None


def _replicas(value: str | None) -> int:
    """GFD's ``gpu.replicas`` as a divisor: 1 unless it says the GPU is shared."""
    if value and value.isascii() and value.isdigit() and len(value) <= 5:
        return max(1, int(value))
    return 1


def lease_heartbeat(lease: Any) -> tuple[str, float | None] | None:
    """(node, last renewal in seconds since the epoch) of an agent's heartbeat Lease
    (named as its node, ``contract.LEASE_LABEL``), or None for anything that is not
    one. A Lease with no readable ``spec.renewTime`` gives (node, None): the node is
    agent-managed but its agent has not renewed yet, which no policy holds against it."""
    if not isinstance(lease, Mapping):
        return None
    meta = lease.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    name = meta.get("name")
    labels = meta.get("labels")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        return None
    if not isinstance(labels, Mapping) or labels.get(contract.LEASE_LABEL) != (
        contract.LEASE_LABEL_VALUE
    ):
        return None
    spec = lease.get("spec")
    renewed = spec.get("renewTime") if isinstance(spec, Mapping) else None
    return _intern(name), rfc3339_seconds(renewed)


@dataclass(frozen=True, slots=True)
class PodFacts:
    """A pod being scheduled, with its knobs read and checked once."""

    namespace: str
    name: str
    gpus: int
    min_memory_mib: int | None = None
    products: frozenset[str] | None = None
    placement: str = "binpack"
    spot: str | None = None
    group: str | None = None
    error: str | None = None  # an annotation we cannot honour: every node fails with it
    cpu_milli: int = 0  # requests, as kube-scheduler sums them
    ram_mib: int = 0
    #: What asks kube-scheduler's own scoring to weigh nodes (preferred affinity, a
    #: ScheduleAnyway spread), in words; None: nothing (gpu_scheduler.podspec).
    preference: str | None = None
    #: Its tolerations that can match a ``PreferNoSchedule`` taint.
    soft_tolerations: tuple[SoftToleration, ...] = ()
    #: Units of gpu-scheduler.io/gpu-memory per container that asks a share.
    shares: tuple[int, ...] = ()
    #: Its ResourceClaims, namespace/name (``View.pod_shares`` reads what they ask).
    claims: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _bounded_name(value: Any, fallback: str) -> str:
    """A namespace or name for logs and keys: the string if it is a sane one."""
    if isinstance(value, str) and 0 < len(value) <= MAX_NAME:
        return value
    return fallback if value is None or value == "" else clip(value, 64)


def pod_facts(pod: Mapping[str, Any], default_placement: str = "binpack") -> PodFacts:
    """Facts from a Pod in its JSON form. Never raises.

    A field of the wrong type or a malformed knob is reported in ``error``, so that
    every node fails with a reason the pod's owner (or the client that sent it) can
    act on, and the pod stays Pending.
    """
    meta = pod.get("metadata")
    meta_map = meta if isinstance(meta, Mapping) else {}
    namespace = _bounded_name(meta_map.get("namespace"), "default")
    name = _bounded_name(meta_map.get("name") or meta_map.get("generateName"), "")
    try:
        meta = expect_object(meta, "metadata")
        annotations = object_at(meta, "annotations", "metadata.annotations")
        gpus = podspec.pod_gpu_request(pod.get("spec"))
        shares = sharing.pod_shares(pod.get("spec")).units
    except FieldError as exc:
        return PodFacts(namespace, name, 0, error=f"the Pod object is malformed: {exc}")
    except sharing.ShareError as exc:
        return PodFacts(namespace, name, gpus, error=str(exc))
    hard = hard_constraints(annotations)
    errors = list(hard.errors)
    annotation = annotation_reader(annotations, errors)

    placement = annotation(contract.ANN_PLACEMENT)
    placement = default_placement if placement is None else placement
    if placement not in PLACEMENTS:
        errors.append(f"{contract.ANN_PLACEMENT}={clip(placement)}: use binpack or spread")
        placement = default_placement

    spot = hard.spot
    if spot is None and (gpus > 0 or shares):
        spot = "avoid"

    group = annotation(contract.ANN_GROUP) or None
    cpu_milli, ram_mib = podspec.pod_cpu_memory(pod.get("spec"))
    preference, tolerations = _preferences(pod.get("spec"))
    return PodFacts(
        namespace=namespace,
        name=name,
        gpus=gpus,
        min_memory_mib=hard.min_memory_mib,
        products=hard.products,
        placement=placement,
        spot=spot,
        group=group,
        error="; ".join(errors) or None,
        cpu_milli=cpu_milli,
        ram_mib=ram_mib,
        preference=preference,
        soft_tolerations=tolerations,
        shares=shares,
        claims=_claims(pod, namespace),
    )


#: A pod names at most this many claims (the API's limit on spec.resourceClaims).
MAX_CLAIMS = 32


def _claims(pod: Mapping[str, Any], namespace: str) -> tuple[str, ...]:
    """The ResourceClaims a pod uses, as namespace/name: those it names, and those made
    for it from templates (``status.resourceClaimStatuses``). Never raises."""
    names: list[str] = []
    for part, key in (("spec", "resourceClaims"), ("status", "resourceClaimStatuses")):
        section = pod.get(part)
        entries = section.get(key) if isinstance(section, Mapping) else None
        for entry in (entries if isinstance(entries, list) else ())[:MAX_CLAIMS]:
            name = entry.get("resourceClaimName") if isinstance(entry, Mapping) else None
            if isinstance(name, str) and 0 < len(name) <= MAX_NAME:
                names.append(f"{namespace}/{name}")
    return tuple(dict.fromkeys(names))


#: A pod whose preferences cannot be read is taken to have some: the extender then
#: leaves the choice to kube-scheduler's scoring, as it would for preferences.
UNREADABLE_PREFERENCES = "scheduling preferences it cannot read"


def _preferences(spec: Any) -> tuple[str | None, tuple[SoftToleration, ...]]:
    """(:attr:`PodFacts.preference`, :attr:`PodFacts.soft_tolerations`); they inform
    only who picks among the nodes that fit, so a field of the wrong type never
    fails the pod."""
    try:
        spec = expect_object(spec, "spec")
        return podspec.pod_preference(spec), pod_soft_tolerations(spec)
    except FieldError:
        return UNREADABLE_PREFERENCES, ()
