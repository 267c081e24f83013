"""Kubernetes resource quantities ("2", "500m", "40Gi"): the project's one parser.

The grammar is ``k8s.io/apimachinery/pkg/api/resource``'s (``quantity.go``)::

    <quantity>  ::= <sign>? <number> <suffix>
    <number>    ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>    ::= Ki | Mi | Gi | Ti | Pi | Ei           (binary SI, 2**10..2**60)
                  | n | u | m | "" | k | M | G | T | P | E (decimal SI, 10**-9..10**18)
                  | (e|E) <sign>? <digits>                  (decimal exponent)

with ASCII digits only (``²`` or Arabic-Indic digits are not digits here), no
whitespace, and upstream's rounding: a non-zero value finer than a nano is rounded
away from zero to the next nano (``0.9n`` is ``1n``), as ``ParseQuantity`` does. Like
upstream, a lone sign or dot parses as zero (``"."``, ``"-"``, ``"1."`` are accepted
by ``ParseQuantity``).

It is *bounded*: any input is decided in a few microseconds, never by arithmetic on
the number as written. Where upstream is unbounded or silently wrong, this parser
refuses, with a reason:

* more than :data:`MAX_LENGTH` characters (upstream takes any length; no quantity the
  API server writes is longer than ~25);
* an exponent outside int32 (upstream parses it as int64 and then *truncates* it to
  int32, so ``1e4294967296`` would mean ``1``);
* a magnitude above ``2**63 - 1``: beyond ``Quantity.Value()``, the int64 that
  kube-scheduler and the kubelet account in. Upstream silently caps binary-SI values
  there (``9Ei``) and keeps decimal ones (``12E``) whole; both are refused here, as no
  GPU count, memory size or CPU amount comes near it.

JSON numbers are taken as upstream's ``UnmarshalJSON`` takes them (a bare number is
parsed like the string): ints within int64, finite floats. ``bool`` is not a number.
"""

from __future__ import annotations

import re
from decimal import ROUND_UP, Context, Decimal
from typing import Any

from gpu_scheduler.textclip import clip

#: Longest quantity string accepted.
MAX_LENGTH = 128
#: Largest magnitude accepted: int64, what ``Quantity.Value()`` can hold.
MAX_VALUE = (1 << 63) - 1
_MAX_DECIMAL = Decimal(MAX_VALUE)
_INT32 = (1 << 31) - 1
_NANO = Decimal("1e-9")
# Exact for every accepted input: at most MAX_LENGTH digits times 2**60 (19 digits).
_EXACT = Context(prec=MAX_LENGTH + 40)

_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SHAPE = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]?|[eE](?P<exp>[+-]?[0-9]+))",
    re.ASCII,
)


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity (or not one we can use)."""


#: Texts already parsed (the same few, "500m", "16Gi", come in pod after pod), and
#: how many the memo holds before it starts again. Only short texts are kept.
_PARSED: dict[str, Decimal] = {}
_PARSED_MAX = 4096
_PARSED_TEXT = 24


def parse_quantity(value: Any) -> Decimal:
    """The exact value of a quantity (a JSON string, or a JSON number), or
    :class:`QuantityError` saying why not."""
    if isinstance(value, str):
        if value.isascii() and value.isdigit() and len(value) <= 18:
            return Decimal(int(value))  # the common case: "1", "8"
        known = _PARSED.get(value)
        if known is not None:
            return known
        amount = _parse_text(value)
        if len(value) <= _PARSED_TEXT:
            if len(_PARSED) >= _PARSED_MAX:
                _PARSED.clear()
            _PARSED[value] = amount
        return amount
    if isinstance(value, bool):
        raise QuantityError(f"a quantity must be a string or a number, not a boolean ({value})")
    if isinstance(value, int):
        if -MAX_VALUE <= value <= MAX_VALUE:
            return Decimal(value)
        raise QuantityError(f"quantity {clip(value)} is beyond 2**63-1")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"quantity {value!r} is not a finite number")
        return _parse_text(repr(value))
    raise QuantityError(f"a quantity must be a string or a number, not {type_name(value)}")


def mib(amount: Decimal | int) -> int:
    """Bytes (a memory quantity) as whole MiB, rounded down; 0 for a negative amount."""
    return max(0, int(amount)) >> 20


def millis(amount: Decimal | int) -> int:
    """Cores (a CPU quantity) as millicores, rounded down; 0 for a negative amount."""
    return max(0, int(amount * 1000))


def parse_count(value: Any, what: str) -> int:
    """A non-negative whole quantity (a GPU count), e.g. ``"2"``; ``"2000m"`` is 2."""
    quantity = parse_quantity(value)
    if quantity < 0:
        raise QuantityError(f"{what} must not be negative, got {clip(value)}")
    if quantity != quantity.to_integral_value():
        raise QuantityError(f"{what} must be a whole number, got {clip(value)}")
    return int(quantity)


def _parse_text(text: str) -> Decimal:
    if not text:
        raise QuantityError("empty quantity")
    if len(text) > MAX_LENGTH:
        raise QuantityError(f"quantity of {len(text)} characters is longer than {MAX_LENGTH}")
    match = _SHAPE.fullmatch(text)
    if match is None:
        raise QuantityError(f"not a quantity: {clip(text)} (use e.g. 2, 500m, 40Gi, 80G or 1e3)")
    negative = match["sign"] == "-"
    whole, fraction = match["int"], match["frac"] or ""
    suffix = match["suffix"]
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return Decimal(0)
    # The value is int(digits) * 10**exp10 * 2**exp2. Decide its size from the digit
    # count before any arithmetic: an absurd exponent must cost nothing.
    exp10, exp2 = -len(fraction), 0
    if match["exp"] is not None:
        exponent = int(match["exp"])  # at most MAX_LENGTH digits: cheap
        if not -_INT32 - 1 <= exponent <= _INT32:
            raise QuantityError(f"quantity exponent in {clip(text)} is beyond int32")
        exp10 += exponent
    elif suffix in _BINARY_SI:
        exp2 = _BINARY_SI[suffix]
    else:
        exp10 += _DECIMAL_SI[suffix]
    # Decimal digits of the integer part: len(digits) + exp10 (binary adds < 19 more).
    magnitude = len(digits) + exp10 + (exp2 * 3 + 9) // 10
    if magnitude > 20:
        raise QuantityError(f"quantity {clip(text)} is beyond 2**63-1")
    if exp2 == 0 and len(digits) + exp10 < -9:
        # Wholly below a nano (< 10**-10): upstream rounds it up to one nano.
        return -_NANO if negative else _NANO
    amount = _EXACT.multiply(Decimal(int(digits)).scaleb(exp10, _EXACT), Decimal(1 << exp2))
    if amount > _MAX_DECIMAL:
        raise QuantityError(f"quantity {clip(text)} is beyond 2**63-1")
    if amount.as_tuple().exponent < -9:  # type: ignore[operator]
        amount = amount.quantize(_NANO, rounding=ROUND_UP, context=_EXACT)
    return -amount if negative else amount


def type_name(value: Any) -> str:
    """The JSON name of a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
