"""The facts the policies decide on, parsed once from Node and Pod JSON.

Only the fields the policies need are kept (slotted objects, interned strings), so
the cluster cache stays small at thousands of nodes and the hot path reads plain
attributes instead of walking nested dicts.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpu_scheduler import contract
from gpu_scheduler.quantity import QuantityError, parse_quantity

PLACEMENTS = ("binpack", "spread")
SPOT_PREFERENCES = ("prefer", "avoid", "require", "forbid")

_intern = sys.intern


class NodeFacts:
    """What the extender knows about one node."""

    __slots__ = (
        "allocatable",
        "capacity_type",
        "heartbeat",
        "labelled_gpu",
        "memory_mib",
        "name",
        "product",
        "zone",
    )

    def __init__(
        self,
        name: str,
        allocatable: int = 0,
        *,
        labelled_gpu: bool = False,
        memory_mib: int | None = None,
        product: str | None = None,
        capacity_type: str | None = None,
        zone: str | None = None,
        heartbeat: float | None = None,
    ) -> None:
        self.name = name
        self.allocatable = allocatable
        self.labelled_gpu = labelled_gpu
        self.memory_mib = memory_mib
        self.product = product
        self.capacity_type = capacity_type
        self.zone = zone
        self.heartbeat = heartbeat

    @property
    def has_gpus(self) -> bool:
        return self.allocatable > 0 or self.labelled_gpu

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NodeFacts) and all(
            getattr(self, s) == getattr(other, s) for s in self.__slots__
        )

    def __repr__(self) -> str:
        fields = ", ".join(f"{s}={getattr(self, s)!r}" for s in self.__slots__)
        return f"NodeFacts({fields})"


def _opt_intern(value: str | None) -> str | None:
    return _intern(value) if value else None


def parse_rfc3339(value: str) -> float | None:
    """Seconds since the epoch for an RFC 3339 timestamp, or None if unreadable."""
    try:
        stamp = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    if stamp.tzinfo is None:
        return None
    return stamp.timestamp()


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    """Facts from a Node object in its JSON form. Raises ValueError if it is no Node."""
    meta = node.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        raise ValueError("node without metadata.name")
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    status = node.get("status") or {}
    if not isinstance(labels, Mapping) or not isinstance(annotations, Mapping):
        raise ValueError(f"node {meta['name']}: labels and annotations must be objects")
    if not isinstance(status, Mapping):
        raise ValueError(f"node {meta['name']}: status must be an object")
    allocatable = 0
    raw = (status.get("allocatable") or {}).get(contract.RESOURCE_GPU)
    if raw is not None:
        try:
            allocatable = max(0, int(parse_quantity(raw)))
        except QuantityError:
            allocatable = 0
    heartbeat = annotations.get(contract.ANN_HEARTBEAT)
    return NodeFacts(
        _intern(meta["name"]),
        allocatable,
        labelled_gpu=labels.get(contract.LABEL_GPU_PRESENT) == "true"
        or contract.LABEL_GPU_COUNT in labels,
        memory_mib=contract.node_gpu_memory_mib(labels),
        product=_opt_intern(labels.get(contract.LABEL_GPU_PRODUCT)),
        capacity_type=contract.capacity_type(labels),
        zone=_opt_intern(labels.get(contract.LABEL_ZONE)),
        heartbeat=parse_rfc3339(heartbeat) if isinstance(heartbeat, str) else None,
    )


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

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_products(raw: Any) -> frozenset[str] | None:
    """``gpu-scheduler.io/gpu-products``: a comma list of product label values."""
    if raw is None:
        return None
    return frozenset(p.strip() for p in str(raw).split(",") if p.strip()) or None


def pod_facts(pod: Mapping[str, Any], default_placement: str = "binpack") -> PodFacts:
    """Facts from a Pod in its JSON form. Raises ValueError if it is no Pod at all.

    A malformed knob does not raise: it is reported in ``error`` so that the pod stays
    Pending with a reason its owner can act on.
    """
    meta = pod.get("metadata")
    spec = pod.get("spec")
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        raise ValueError("Pod needs metadata and spec objects")
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        raise ValueError("Pod metadata.annotations must be an object")
    namespace = str(meta.get("namespace") or "default")
    name = str(meta.get("name") or meta.get("generateName") or "")
    try:
        gpus = contract.pod_gpu_request(spec)
    except QuantityError as exc:
        raise ValueError(f"Pod resources: {exc}") from exc
    errors: list[str] = []

    min_memory = None
    raw = annotations.get(contract.ANN_MIN_GPU_MEMORY)
    if raw is not None:
        try:
            min_memory = contract.parse_mib(raw)
        except (QuantityError, ValueError):
            errors.append(
                f"{contract.ANN_MIN_GPU_MEMORY}={raw!r} is not a memory size "
                "(use e.g. 40Gi, or MiB as an integer)"
            )

    products = None
    raw = annotations.get(contract.ANN_GPU_PRODUCTS)
    if raw is not None:
        products = parse_products(raw)
        if products is None:
            errors.append(f"{contract.ANN_GPU_PRODUCTS} is empty")

    placement = annotations.get(contract.ANN_PLACEMENT, default_placement)
    if placement not in PLACEMENTS:
        errors.append(f"{contract.ANN_PLACEMENT}={placement!r}: use binpack or spread")
        placement = default_placement

    spot = annotations.get(contract.ANN_SPOT)
    if spot is not None and spot not in SPOT_PREFERENCES:
        errors.append(f"{contract.ANN_SPOT}={spot!r}: use prefer, avoid, require or forbid")
        spot = None
    if spot is None and gpus > 0:
        spot = "avoid"

    group = annotations.get(contract.ANN_GROUP) or None
    return PodFacts(
        namespace=namespace,
        name=name,
        gpus=gpus,
        min_memory_mib=min_memory,
        products=products,
        placement=placement,
        spot=spot,
        group=str(group) if group else None,
        error="; ".join(errors) or None,
    )
