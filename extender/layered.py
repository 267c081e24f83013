"""A dict whose snapshot costs the changes since the last one, not the whole dict.

The cluster cache publishes a new view after every binding, and each view needs its
own immutable copy of the per-node maps (free GPUs, GPUs used). At 5,000 nodes
copying two 5,000-entry dicts was most of a view's cost, after every pod. A
:class:`Layered` keeps an immutable *base* (shared by every snapshot taken since the
last fold) and the changes made since (*delta*); a snapshot copies the delta only.
When the delta grows past an eighth of the base (and at least :data:`FOLD_AT`
entries) it is folded into a new base, so a snapshot costs O(changes) amortised and a
lookup at most two dict probes.

Writers hold the cache's lock; snapshots are read by any thread, never written.
With plain dicts copied whole, and no view built ahead of the call (``EAGER_GAP`` in
``cache.py``), filter takes 1.10-1.12x as long at 500 candidates while pods are being
bound (docs/BENCHMARKS.md, "What each mechanism of the extender pays for").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

#: The delta is folded into a new base once it holds this many entries and more than
#: an eighth of the base.
FOLD_AT = 64
_GONE: Any = object()  # a key deleted since the base was made
_MISSING: Any = object()


class _Layers(Mapping[K, V]):
    """The reads over a base and the changes over it (``delta``)."""

    __slots__ = ("_base", "_delta", "_size")

    def __init__(self, base: dict[K, V], delta: dict[K, V], size: int) -> None:
        self._base, self._delta, self._size = base, delta, size

    def __getitem__(self, key: K) -> V:
        value = self._delta.get(key, _MISSING)
        if value is _MISSING:
            return self._base[key]
        if value is _GONE:
            raise KeyError(key)
        return value  # type: ignore[no-any-return]

    def get(self, key: K, default: Any = None) -> Any:
        if not self._delta:  # just folded, or nothing changed since: one probe
            return self._base.get(key, default)
        value = self._delta.get(key, _MISSING)
        if value is _MISSING:
            return self._base.get(key, default)
        return default if value is _GONE else value

    def __contains__(self, key: object) -> bool:
        value = self._delta.get(key, _MISSING)  # type: ignore[call-overload]
        return key in self._base if value is _MISSING else value is not _GONE

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[K]:
        return iter(_merged(self._base, self._delta))


class Layered(_Layers[K, V], MutableMapping[K, V]):
    """A mutable mapping (the cache's own) with cheap immutable snapshots."""

    __slots__ = ()

    def __init__(self, items: Mapping[K, V] | None = None) -> None:
        base = dict(items or {})
        super().__init__(base, {}, len(base))

    def __setitem__(self, key: K, value: V) -> None:
        if key not in self:
            self._size += 1
        self._delta[key] = value

    def __delitem__(self, key: K) -> None:
        if key not in self:
            raise KeyError(key)
        self._size -= 1
        if key in self._base:
            self._delta[key] = _GONE
        else:
            del self._delta[key]

    def snapshot(self) -> Snapshot[K, V]:
        """An immutable copy as of now (it shares the base, never the delta)."""
        if len(self._delta) >= FOLD_AT and len(self._delta) * 8 > len(self._base):
            self._base = _merged(self._base, self._delta)
            self._delta = {}
        return Snapshot(self._base, dict(self._delta), self._size)


class Snapshot(_Layers[K, V], Generic[K, V]):
    """A :class:`Layered` as it was: read-only, its layers never written again."""

    __slots__ = ()

    def with_entries(self, extra: Mapping[K, V]) -> Snapshot[K, V]:
        """This snapshot with ``extra`` set over it (a new snapshot; this one stays)."""
        if not extra:
            return self
        delta = {**self._delta, **extra}
        size = self._size + sum(1 for key in extra if key not in self)
        return Snapshot(self._base, delta, size)


def _merged(base: dict[K, V], delta: dict[K, V]) -> dict[K, V]:
    """``base`` with ``delta`` applied, as a new dict (deletions dropped)."""
    if not delta:
        return base
    out = {**base, **delta}
    for key, value in delta.items():
        if value is _GONE:
            del out[key]
    return out
