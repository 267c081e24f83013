"""Bounded, never-raising text of values taken from requests.

Anything a client sent may be huge (a 4 MiB label value), deep (an object nested a
thousand levels) or hostile to ``repr`` (an integer of 5,000 digits, which Python
refuses to turn into text). Error messages, reasons and log fields show such values
through :func:`clip`: at most :data:`LIMIT` characters, saying so when it truncated,
and never raising.
"""

from __future__ import annotations

from typing import Any

#: The most characters of one value that ever reach an answer or a log line.
LIMIT = 1024
_DEPTH = 4
_ITEMS = 16
_BIG_INT_BITS = 4000  # ~1,200 digits; Python refuses int -> str beyond 4,300


def clip(value: Any, limit: int = LIMIT) -> str:
    """A repr-like text of ``value``, at most ``limit`` characters (plus a note)."""
    try:
        text = _show(value, _DEPTH, limit + 1)
    except Exception as exc:  # a hostile __repr__ or something stranger: never raise
        text = f"<unprintable {type(value).__name__}: {type(exc).__name__}>"
    return _cut(text, limit, _size(value))


def clip_text(text: str, limit: int = LIMIT) -> str:
    """Plain text (a message, not a value) cut to ``limit`` characters."""
    if not isinstance(text, str):
        return clip(text, limit)
    return _cut(text, limit, len(text))


def _cut(text: str, limit: int, size: int | None) -> str:
    if len(text) <= limit:
        return text
    whole = f" of {size} characters" if size is not None and size > limit else ""
    return f"{text[:limit]}... (truncated{whole})"


def _size(value: Any) -> int | None:
    return len(value) if isinstance(value, str) else None


def _show(value: Any, depth: int, budget: int) -> str:
    """The text, built for at most about ``budget`` characters and ``depth`` levels."""
    if isinstance(value, str):
        return repr(value[:budget])
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > _BIG_INT_BITS:
            return f"<integer of about {int(value.bit_length() * 0.30103)} digits>"
        return repr(value)
    if isinstance(value, dict | list | tuple):
        if depth <= 0:
            return "{...}" if isinstance(value, dict) else "[...]"
        parts: list[str] = []
        used = 0
        items = value.items() if isinstance(value, dict) else value
        for i, item in enumerate(items):
            if i >= _ITEMS or used > budget:
                parts.append(f"... ({len(value)} items)")
                break
            if isinstance(value, dict):
                key, val = item
                part = f"{_show(key, 0, 64)}: {_show(val, depth - 1, budget - used)}"
            else:
                part = _show(item, depth - 1, budget - used)
            parts.append(part)
            used += len(part) + 2
        inner = ", ".join(parts)
        return "{" + inner + "}" if isinstance(value, dict) else "[" + inner + "]"
    if isinstance(value, bytes | bytearray):
        return f"<{len(value)} bytes>"
    return repr(value)[: budget + 1]  # our own objects (exceptions, datetimes)
