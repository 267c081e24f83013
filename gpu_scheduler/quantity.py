"""Kubernetes resource quantities ("2", "500m", "40Gi").

The parsing itself is the kubernetes client's ``parse_quantity``; this module adds a
fast path for the plain integers that GPU counts almost always are (the webhook and the
extender run per pod) and one error type the rest of the project can catch.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity (or not one we can use)."""


def parse_quantity(value: Any) -> Decimal:
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, str):
        if value.isdigit():
            return Decimal(int(value))
        from kubernetes.utils.quantity import parse_quantity as _parse

        try:
            return _parse(value)
        except (ValueError, ArithmeticError) as exc:
            raise QuantityError(f"not a quantity: {value!r}") from exc
    if isinstance(value, float):
        return Decimal(str(value))
    raise QuantityError(f"not a quantity: {value!r}")
