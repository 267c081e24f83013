"""A pod's hard GPU constraints, read once from its annotations for every component.

``gpu-scheduler.io/gpu-products``, ``min-gpu-memory`` and ``spot: require|forbid``
decide which nodes a pod may use at all. The extender filters by them; the webhook
writes them into the pod as required node affinity, so that kube-scheduler's own
filters, autoscalers and any other scheduler refuse the same nodes. Both read them
here, with the same checks and the same messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from gpu_scheduler import contract
from gpu_scheduler.quantity import QuantityError, type_name
from gpu_scheduler.textclip import clip

SPOT_PREFERENCES = ("prefer", "avoid", "require", "forbid")
#: ``gpu-products``: at most this many products, each a label value (<= 63 characters).
MAX_PRODUCTS = 64


def parse_products(raw: str) -> frozenset[str] | None:
    """``gpu-scheduler.io/gpu-products``: a comma list of product label values. GFD's
    ``-SHARED`` suffix is dropped: a pod naming the model means it shared or not."""
    found = (contract.base_product(p.strip()) for p in raw.split(",") if p.strip())
    return frozenset(found) or None


@dataclass(frozen=True)
class HardConstraints:
    """What a pod's annotations demand of a node; ``errors`` name the annotations that
    could not be read (the extender then refuses every node with them)."""

    products: frozenset[str] | None = None  # GPU models (GFD product, no -SHARED)
    min_memory_mib: int | None = None  # per GPU
    spot: str | None = None  # one of SPOT_PREFERENCES, as written
    errors: tuple[str, ...] = ()

    @property
    def spot_rule(self) -> str | None:
        """``require`` or ``forbid``: the spot preferences that are hard constraints."""
        return self.spot if self.spot in ("require", "forbid") else None

    @property
    def any(self) -> bool:
        return bool(self.products or self.min_memory_mib is not None or self.spot_rule)


def annotation_reader(
    annotations: Mapping[str, Any], errors: list[str]
) -> Callable[[str], str | None]:
    """A reader of string annotations that notes a value of another type in ``errors``
    (and reads it as absent)."""

    def annotation(key: str) -> str | None:
        value = annotations.get(key)
        if value is None or isinstance(value, str):
            return value
        errors.append(f"{key} must be a string, not {type_name(value)}")
        return None

    return annotation


_KEYS = (contract.ANN_MIN_GPU_MEMORY, contract.ANN_GPU_PRODUCTS, contract.ANN_SPOT)
_CACHED_LENGTH = 4096  # longer values are read each time, not kept


def hard_constraints(annotations: Mapping[str, Any]) -> HardConstraints:
    """The constraints in a pod's annotations (a mapping, as the API gives it). Pods of
    one workload carry the same few strings: those are read once (a small cache)."""
    values = tuple(annotations.get(key) for key in _KEYS)
    if all(v is None or (isinstance(v, str) and len(v) <= _CACHED_LENGTH) for v in values):
        return _hard_constraints(values)  # type: ignore[arg-type]
    return _read(annotations)


@lru_cache(maxsize=1024)
def _hard_constraints(values: tuple[str | None, str | None, str | None]) -> HardConstraints:
    return _read(dict(zip(_KEYS, values, strict=True)))


def _read(annotations: Mapping[str, Any]) -> HardConstraints:
    errors: list[str] = []
    annotation = annotation_reader(annotations, errors)

    min_memory = None
    raw = annotation(contract.ANN_MIN_GPU_MEMORY)
    if raw is not None:
        try:
            min_memory = contract.parse_mib(raw)
        except QuantityError as exc:
            errors.append(
                f"{contract.ANN_MIN_GPU_MEMORY}={clip(raw)} is not a memory size "
                f"(use e.g. 40Gi, 80G, or MiB as an integer): {exc}"
            )

    products = None
    raw = annotation(contract.ANN_GPU_PRODUCTS)
    if raw is not None:
        products = parse_products(raw)
        if products is None:
            errors.append(f"{contract.ANN_GPU_PRODUCTS} is empty")
        elif len(products) > MAX_PRODUCTS or max(map(len, products)) > 63:
            errors.append(
                f"{contract.ANN_GPU_PRODUCTS}={clip(raw)}: at most {MAX_PRODUCTS} "
                "products, each a label value of at most 63 characters"
            )
            products = None

    spot = annotation(contract.ANN_SPOT)
    if spot is not None and spot not in SPOT_PREFERENCES:
        errors.append(f"{contract.ANN_SPOT}={clip(spot)}: use prefer, avoid, require or forbid")
        spot = None
    return HardConstraints(products, min_memory, spot, tuple(errors))
