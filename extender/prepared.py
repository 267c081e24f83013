"""Prioritize's answer, prepared in the gap after filter.

kube-scheduler calls the extender's filter, then runs its own PreScore and Score
plugins over the feasible nodes, then calls prioritize with the same Pod and exactly
the names filter passed, in filter's order (``findNodesThatPassExtenders`` and
``prioritizeNodes`` in ``pkg/scheduler/schedule_one.go``; with one feasible node it
skips scoring altogether). Prioritize's answer depends only on the pod, those names
and the extender's view, so the extender computes it as soon as filter's answer is
on the wire, in the same request thread, while kube-scheduler is busy with its
plugins, and prioritize serves it when it is the same call:

- the same pod facts (the Decider hands out the same facts object only for a Pod
  equal to the one it read them from),
- equal names, in the same order,
- prepared at most :data:`MAX_AGE` seconds ago.

It is scored on the view filter decided on, even where a watch event has made a newer
one since (a binding of an earlier pod, typically): kube-scheduler itself filters and
scores one cycle on one snapshot of its cache, taken when the cycle starts, and the
extender's cycle does the same. Where the view did not change the answer is byte for
byte what prioritize would compute; where it did, it is what prioritize would have
computed a few milliseconds earlier. One preparation is held at a time
(kube-scheduler's scheduling cycle is serial; each filter call replaces the last).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from extender import metrics

#: Seconds prioritize waits for a preparation still being made for the same call
#: (kube-scheduler sent prioritize on another connection while the filter's thread
#: was still preparing), before it computes the answer itself.
WAIT = 0.05
#: Seconds after which a preparation is no longer this cycle's (a scheduling cycle
#: takes milliseconds; the view itself is rebuilt at least this often).
MAX_AGE = 1.0


class _Entry:
    __slots__ = ("answer", "done", "names", "pod", "time", "version")

    def __init__(self, pod: object, names: Sequence[str], version: object, now: float) -> None:
        self.pod, self.names, self.version, self.time = pod, names, version, now
        # held until the answer is in (a Lock: a third of an Event's cost to make)
        self.done = threading.Lock()
        self.done.acquire()
        self.answer: Any = None


class PreparedAnswers:
    """The one answer prepared after the last filter call, and who may take it."""

    def __init__(self, wait: float = WAIT, clock: Callable[[], float] = time.monotonic) -> None:
        self._entry: _Entry | None = None
        self._wait = wait
        self._clock = clock

    def begin(self, pod: object, names: Sequence[str], version: object) -> _Entry:
        """A preparation for this pod and names, on the view of ``version``."""
        entry = _Entry(pod, names, version, self._clock())
        self._entry = entry
        return entry

    @staticmethod
    def finish(entry: _Entry, answer: Any) -> None:
        """``answer`` None: the preparation failed (prioritize computes it itself)."""
        entry.answer = answer
        entry.done.release()

    def take(self, pod: object, names: Sequence[str], version: object) -> Taken | None:
        """The answer prepared for this call, or None. Each is used once.
        ``version``: the cache's now, only to count whether the answer's view is
        older."""
        entry = self._entry
        if entry is None:
            metrics.PREPARED.labels("absent").inc()
            return None
        now = self._clock()
        if entry.pod is not pod or entry.names != names or now - entry.time > MAX_AGE:
            metrics.PREPARED.labels("stale").inc()
            return None
        if not _finished(entry, self._wait) or entry.answer is None:
            metrics.PREPARED.labels("unfinished").inc()
            return None
        if self._entry is entry:
            self._entry = None
        metrics.child(
            metrics.PREPARED, "used" if entry.version == version else "used-older-view"
        ).inc()
        return Taken(entry.answer, now - entry.time, self._clock() - now)


def _finished(entry: _Entry, wait: float) -> bool:
    """Whether the entry's answer is in, waiting up to ``wait`` seconds for it."""
    if not entry.done.acquire(timeout=wait):
        return False
    entry.done.release()  # stays open for anyone else who looks
    return True


class Taken(NamedTuple):
    """A prepared answer, with when its call came: ``after`` seconds after filter's
    answer was written (the gap kube-scheduler's own plugins took, plus the call's
    parse), and ``waited`` seconds for the preparation to finish (0 when it already
    had: the answer cost prioritize nothing but the lookup)."""

    answer: Any
    after: float
    waited: float
