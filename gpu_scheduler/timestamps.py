"""RFC 3339 timestamps (the agent's heartbeat Lease, Event times): the project's one
writer and reader."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

#: Longer than any RFC 3339 timestamp (``2026-11-29T14:00:00.123456789+00:00`` is 35).
MAX_LENGTH = 64


def rfc3339(moment: datetime) -> str:
    """``2026-11-29T14:00:00Z``: RFC 3339, UTC, whole seconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(moment: datetime) -> str:
    """``2026-11-29T14:00:00.123456Z``: a Kubernetes ``MicroTime`` (a Lease's
    ``renewTime``), UTC, six fractional digits as apimachinery writes them."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(value: Any) -> datetime | None:
    """The moment an RFC 3339 timestamp names, or None for anything else (a naive
    time without an offset included: its moment is unknown)."""
    if not isinstance(value, str) or not value or len(value) > MAX_LENGTH:
        return None
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    return stamp if stamp.tzinfo is not None else None


def rfc3339_seconds(value: Any) -> float | None:
    """:func:`parse_rfc3339` as seconds since the epoch."""
    stamp = parse_rfc3339(value)
    return stamp.timestamp() if stamp is not None else None
