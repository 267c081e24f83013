"""The one quantity parser, against upstream's own examples and hostile input.

The accepted and rejected strings are ``TestQuantityParse`` and
``TestParseQuantityString`` of k8s.io/apimachinery v0.37.2
(pkg/api/resource/quantity_test.go), with the value upstream expects for each.
"""

from __future__ import annotations

import contextlib
import time
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_scheduler.quantity import MAX_LENGTH, MAX_VALUE, QuantityError, parse_count, parse_quantity
from tests.fuzz.corpus import REFUSED_QUANTITIES

KI, MI, GI, TI, PI, EI = (1 << (10 * i) for i in range(1, 7))

# (input, the value ParseQuantity gives) — upstream's table, values written out.
UPSTREAM_ACCEPTED = [
    ("0", 0),
    ("0n", 0),
    ("0u", 0),
    ("0m", 0),
    ("0Ki", 0),
    ("0k", 0),
    ("0Mi", 0),
    ("0M", 0),
    ("0Gi", 0),
    ("0G", 0),
    ("0Ti", 0),
    ("0T", 0),
    ("1", 1),
    ("1Ki", KI),
    ("8Ki", 8 * KI),
    ("7Mi", 7 * MI),
    ("6Gi", 6 * GI),
    ("5Ti", 5 * TI),
    ("4Pi", 4 * PI),
    ("3Ei", 3 * EI),
    ("10Ti", 10 * TI),
    ("100Ti", 100 * TI),
    ("5n", "5e-9"),
    ("4u", "4e-6"),
    ("3m", "3e-3"),
    ("9", 9),
    ("8k", 8000),
    ("50k", 50000),
    ("7M", 7 * 10**6),
    ("6G", 6 * 10**9),
    ("5T", 5 * 10**12),
    ("40T", 4 * 10**13),
    ("300T", 3 * 10**14),
    ("2P", 2 * 10**15),
    ("1E", 10**18),
    ("1E-3", "1e-3"),
    ("1e3", 1000),
    ("1E6", 10**6),
    ("1e9", 10**9),
    ("1E12", 10**12),
    ("1e15", 10**15),
    ("1E18", 10**18),
    ("1e14", 10**14),
    ("1e13", 10**13),
    ("100.035k", 100035),
    ("0.001", "0.001"),
    ("0.0005k", "0.5"),
    ("0.005", "0.005"),
    ("0.05", "0.05"),
    ("0.5", "0.5"),
    ("0.00050k", "0.5"),
    ("0.00500", "0.005"),
    ("0.05000", "0.05"),
    ("0.50000", "0.5"),
    ("0.5e0", "0.5"),
    ("0.5e-1", "0.05"),
    ("0.5e-2", "0.005"),
    ("10.035M", 10035000),
    ("1.2e3", 1200),
    ("1.3E+6", 1300000),
    ("1.40e9", 1.4e9),
    ("1.53E12", 1.53e12),
    ("1.6e15", 1.6e15),
    ("1.7E18", 17 * 10**17),
    ("9.01", "9.01"),
    ("8.1k", 8100),
    ("7.123456M", 7123456),
    ("6.987654321G", 6987654321),
    ("5.444T", 5444 * 10**9),
    ("40.1T", 401 * 10**11),
    ("300.2T", 3002 * 10**11),
    ("2.5P", 25 * 10**14),
    ("1.01E", 101 * 10**16),
    # saturate / round: a non-zero value finer than a nano rounds up to the next nano
    ("3.001n", "4e-9"),
    ("1.1E-9", "2e-9"),
    ("0.0000000001", "1e-9"),
    ("0.0000000005", "1e-9"),
    ("0.00000000050", "1e-9"),
    ("0.5e-9", "1e-9"),
    ("0.9n", "1e-9"),
    ("0.00000012345", "124e-9"),
    ("0.00000012354", "124e-9"),
    ("100.035Ki", "102435.84"),
    ("0.5Mi", MI // 2),
    ("0.05Gi", "53687091.2"),
    ("0.025Ti", "27487790694.4"),
    # "things written by trolls"
    ("0.000000000001Ki", "2e-9"),
    (".001", "0.001"),
    (".0001k", "0.1"),
    ("1.", 1),
    ("1.G", 10**9),
]

UPSTREAM_REJECTED = [
    "",
    "1.1.M",
    "1+1.0M",
    "0.1mi",
    "0.1am",
    "aoeu",
    ".5i",
    "1i",
    "-3.01i",
    "-3.01e-",
    " 1",
    "1 ",
]

# Where upstream parses but we refuse: the magnitude is beyond Quantity.Value()'s
# int64 (upstream caps binary SI there silently, and keeps decimal ones whole).
BEYOND_INT64 = ["9Ei", "9223372036854775807Ki", "12E", "8Ei"]


@pytest.mark.parametrize(("text", "value"), UPSTREAM_ACCEPTED)
def test_upstream_accepted(text, value):
    expected = Decimal(str(value)) if isinstance(value, str | float) else Decimal(value)
    assert parse_quantity(text) == expected
    assert parse_quantity("+" + text) == expected
    assert parse_quantity("-" + text.lstrip("+-")) == -expected


@pytest.mark.parametrize("text", [".", "-.", "+", "-"])
def test_a_lone_dot_or_sign_is_zero_as_upstream_scans_it(text):
    assert parse_quantity(text) == 0  # TestParseQuantityString: "." and "-." are zero


@pytest.mark.parametrize("text", UPSTREAM_REJECTED)
def test_upstream_rejected(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize("text", BEYOND_INT64)
def test_beyond_int64_is_refused_not_capped(text):
    with pytest.raises(QuantityError, match=r"beyond 2\*\*63-1"):
        parse_quantity(text)
    assert parse_quantity(str(MAX_VALUE)) == MAX_VALUE


@pytest.mark.parametrize("text", REFUSED_QUANTITIES)
def test_hostile_strings_are_refused(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_json_numbers_and_other_types():
    assert parse_quantity(3) == 3
    assert parse_quantity(2.5) == Decimal("2.5")
    assert parse_quantity(1e-12) == Decimal("1e-9")  # rounds up, like the string
    for bad in (True, None, [], {}, float("inf"), float("nan"), 2**64, 1e300, 10**5000):
        with pytest.raises(QuantityError):
            parse_quantity(bad)


def test_tiny_exponents_round_up_to_a_nano_without_arithmetic():
    assert parse_quantity("1e-999999999") == Decimal("1e-9")
    assert parse_quantity("-1e-2147483648") == Decimal("-1e-9")


def test_length_is_bounded():
    assert parse_quantity("0" * (MAX_LENGTH - 1) + "1") == 1
    with pytest.raises(QuantityError, match="longer than"):
        parse_quantity("0" * MAX_LENGTH + "1")


def test_parse_count():
    assert parse_count("2", "GPUs") == 2
    assert parse_count("2000m", "GPUs") == 2
    with pytest.raises(QuantityError, match="whole number"):
        parse_count("500m", "GPUs")
    with pytest.raises(QuantityError, match="negative"):
        parse_count("-1", "GPUs")


WORST = [
    "9" * MAX_LENGTH,
    "1e2147483647",
    "1e-2147483648",
    "0." + "0" * 120 + "1",
    "9" * 60 + "." + "9" * 60 + "Ei",
    "x" * (4 << 20),
    "1" * 5000,
    "1." + "1" * 125 + "m",
]


def test_every_string_is_decided_well_under_a_millisecond():
    for text in WORST:
        started = time.perf_counter()
        for _ in range(100):
            with contextlib.suppress(QuantityError):
                parse_quantity(text)
        per_call = (time.perf_counter() - started) / 100
        assert per_call < 2e-4, (text[:40], per_call)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789.+-eEinumkKMGTP ²", max_size=40))
def test_any_string_is_decided_with_a_value_or_a_quantity_error(text):
    try:
        value = parse_quantity(text)
    except QuantityError:
        return
    assert abs(value) <= MAX_VALUE
    assert value == value.quantize(Decimal("1e-9")) or value.as_tuple().exponent >= -9


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=10**15), st.sampled_from(["", "k", "M", "Ki", "Mi"]))
def test_integers_with_suffixes_are_exact(n, suffix):
    factor = {"": 1, "k": 1000, "M": 10**6, "Ki": KI, "Mi": MI}[suffix]
    if n * factor > MAX_VALUE:
        return
    assert parse_quantity(f"{n}{suffix}") == n * factor
