"""Malformed requests, by class, from a seed: what a hostile or merely odd client sends.

Each generator takes a ``random.Random`` and a valid baseline body (an ExtenderArgs or
an AdmissionReview, as JSON) and returns the raw bytes of one request body. The
classes (``CLASSES``):

- ``valid``: the baseline, untouched (the control group);
- ``types``: one field at a random depth given a value of another JSON type;
- ``quantities``: a quantity (requests, limits, overhead, allocatable, GPU shares,
  the ``min-gpu-memory`` annotation, the memory label) replaced by a hostile one:
  Infinity, NaN, 1e999999999, thousands of digits, non-ASCII digits;
- ``nesting``: a value at a random depth replaced by arrays or objects nested
  100 to 5,000 levels;
- ``huge``: a string replaced by 1 KiB to 4 MiB of text, or a number by thousands of
  digits;
- ``envelope``: not JSON, truncated JSON, the wrong top-level shape, a BOM, invalid
  UTF-8, keys in other cases;
- ``unicode``: strings replaced by control characters, lone surrogates (escaped),
  right-to-left marks, NULs.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from typing import Any

from gpu_scheduler import contract

Body = bytes
Generator = Callable[[random.Random, Any], Body]

WRONG_TYPES: list[Any] = [0, -1, 1.5, True, False, None, "", "x", [], [1, "a"], {}, {"a": 1}]
#: Quantity strings that parse_quantity refuses (tests/unit/test_quantity.py checks
#: each): not finite, beyond 2**63-1, too long, not ASCII digits, or malformed.
REFUSED_QUANTITIES: list[str] = [
    "Infinity",
    "-Infinity",
    "inf",
    "-inf",
    "NaN",
    "nan",
    "sNaN",
    "1e400",
    "1e999999",
    "1e999999999",
    "1e4294967296",  # upstream truncates this exponent to int32: it would mean 1
    "9Ei",
    "8Ei",
    "9" * 5000,
    "0." + "0" * 4000 + "1",
    "²",
    "1²",
    "\u0663",
    "\uff11",
    "1 ",
    " 1",
    "1 Gi",
    "1_0",
    "1_000",
    "0x10",
    "",
    "1e",
    "1e+",
    "--1",
    "1.5.5",
    "1Qi",
]
#: What the fuzzer puts where a quantity goes: the refused strings, edges that parse
#: (upstream's leniency included: "e5", ".", "-" and "Ki" are 0), and JSON values.
HOSTILE_QUANTITIES: list[Any] = [
    *REFUSED_QUANTITIES,
    "1e-999999999",
    "-1",
    "-0",
    "0.5",
    "500m",
    "1e18",
    "1.5Gi",
    "e5",
    ".",
    "-",
    "Ki",
    1e308,
    -1,
    0.1,
    10**19,
    True,
    None,
    [],
    {},
]
UNICODE: list[str] = ["\x00", "\u202egpu", "\ud800", "\uffff", "🙂" * 50, "a\nb\r\n", "\\", '"']


def _dump(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=True).encode("utf-8", "surrogatepass")


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``value`` (dict keys and list indexes)."""
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out += _paths(child, (*prefix, i))
    return out


def _set(body: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    target = body
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return body


def _replace_random(rng: random.Random, base: Any, make: Callable[[Any], Any]) -> Any:
    body = copy.deepcopy(base)
    paths = [p for p in _paths(body) if p]  # never the whole body: that is "envelope"
    path = rng.choice(paths)
    target = body
    for step in path:
        target = target[step]
    return _set(body, path, make(target))


def gen_valid(rng: random.Random, base: Any) -> Body:
    return _dump(base)


def gen_types(rng: random.Random, base: Any) -> Body:
    def other_type(old: Any) -> Any:
        choices = [v for v in WRONG_TYPES if type(v) is not type(old)]
        return copy.deepcopy(rng.choice(choices))

    return _dump(_replace_random(rng, base, other_type))


def quantity_paths(body: Any) -> list[tuple[Any, ...]]:
    """Where quantities (and the values parsed like them) live in the baseline."""
    wanted = (
        contract.RESOURCE_GPU,
        contract.RESOURCE_GPU_MEMORY,
        contract.ANN_MIN_GPU_MEMORY,
        contract.LABEL_GPU_MEMORY,
        "cpu",
        "memory",
    )
    return [p for p in _paths(body) if p and p[-1] in wanted]


def gen_quantities(rng: random.Random, base: Any) -> Body:
    body = copy.deepcopy(base)
    paths = quantity_paths(body)
    for path in rng.sample(paths, k=min(len(paths), rng.randint(1, 3))):
        _set(body, path, copy.deepcopy(rng.choice(HOSTILE_QUANTITIES)))
    text = _dump(body)
    if rng.random() < 0.2:  # a JSON number too big for a double, as raw text
        text = text.replace(b'"1"', b"1" + b"0" * rng.choice([400, 5000]), 1)
    return text


def _nested(rng: random.Random, depth: int) -> Any:
    value: Any = rng.choice(["x", 1, None, True])
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


def gen_nesting(rng: random.Random, base: Any) -> Body:
    depth = rng.choice([100, 250, 256, 300, 1000, 1023, 1100, 5000])
    body = _replace_random(rng, base, lambda old: _nested(rng, depth))
    return _dump_deep(body)


def _dump_deep(value: Any) -> bytes:
    """json.dumps recurses; build very deep bodies without recursion."""
    try:
        return _dump(value)
    except RecursionError:
        return b'{"Pod": ' + b"[" * 5000 + b"]" * 5000 + b"}"


def gen_huge(rng: random.Random, base: Any) -> Body:
    size = rng.choice([1 << 10, 64 << 10, 1 << 20, 4 << 20])
    body = copy.deepcopy(base)
    strings = [p for p in _paths(body) if p and isinstance(_get(body, p), str)]
    path = rng.choice(strings)
    if rng.random() < 0.25:
        marker = "HUGE-NUMBER-MARKER"
        _set(body, path, marker)
        digits = b"9" * rng.choice([4301, 10000])
        return _dump(body).replace(b'"' + marker.encode() + b'"', digits)
    _set(body, path, rng.choice("xé🙂") * (size // 4))
    return _dump(body)


def _get(body: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        body = body[step]
    return body


def gen_envelope(rng: random.Random, base: Any) -> Body:
    valid = _dump(base)
    choice = rng.randrange(12)
    if choice == 0:
        return b""
    if choice == 1:
        return valid[: rng.randrange(1, len(valid))]  # truncated
    if choice == 2:
        return b"\xef\xbb\xbf" + valid  # BOM
    if choice == 3:
        return valid.replace(b'"', b"\xff", 1)  # invalid UTF-8
    if choice == 4:
        return _dump(rng.choice([None, [], 1, "x", [base], True]))
    if choice == 5:
        return _dump({k.lower() if rng.random() < 0.5 else k.upper(): v for k, v in base.items()})
    if choice == 6:
        keys = list(base)
        return _dump({k: v for k, v in base.items() if k != rng.choice(keys)})
    if choice == 7:
        return _dump({**base, "Extra": {"a": [1, 2]}, "Pod": base.get("Pod", {})})
    if choice == 8:
        return valid + b" trailing garbage"
    if choice == 9:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 512)))
    if choice == 10:
        return valid.replace(b":", b"=", 1)
    return b"NaN"


def gen_unicode(rng: random.Random, base: Any) -> Body:
    body = copy.deepcopy(base)
    strings = [p for p in _paths(body) if p and isinstance(_get(body, p), str)]
    for path in rng.sample(strings, k=min(3, len(strings))):
        _set(body, path, rng.choice(UNICODE))
    return _dump(body)


CLASSES: dict[str, Generator] = {
    "valid": gen_valid,
    "types": gen_types,
    "quantities": gen_quantities,
    "nesting": gen_nesting,
    "huge": gen_huge,
    "envelope": gen_envelope,
    "unicode": gen_unicode,
}


def corpus(seed: int, count: int, base: Any) -> list[tuple[str, Body]]:
    """``count`` requests, the classes in turn, reproducible from ``seed``."""
    rng = random.Random(seed)
    names = list(CLASSES)
    chosen = [names[i % len(names)] for i in range(count)]
    return [(name, CLASSES[name](rng, base)) for name in chosen]
