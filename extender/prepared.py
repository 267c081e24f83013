"""Prioritize's answer, prepared in the gap after filter.

kube-scheduler calls the extender's filter, then runs its own PreScore and Score
plugins over the feasible nodes, then calls prioritize with the same Pod and exactly
the names filter passed, in filter's order (``findNodesThatPassExtenders`` and
``prioritizeNodes`` in ``pkg/scheduler/schedule_one.go``; with one feasible node it
skips scoring altogether). Prioritize's answer depends only on the pod, those names
and the extender's view, so the extender computes it as soon as filter's answer is
on the wire, in the same request thread, while kube-scheduler is busy with its
plugins; prioritize then serves it if nothing it depends on changed:

- the same pod facts (the Decider hands out the same facts object only for a Pod
  equal to the one it read them from),
- equal names, in the same order,
- the same view object (any watch event that changes the view makes a new one; then
  prioritize computes afresh from the new view, exactly as it would without this).

So the answer is byte for byte the one prioritize would compute; only where the work
happens moves. One preparation is held at a time (kube-scheduler's scheduling cycle
is serial, and each filter call replaces the last preparation).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from extender import metrics

#: Seconds prioritize waits for a preparation still being made for the same call
#: (kube-scheduler sent prioritize on another connection while the filter's thread
#: was still preparing), before it computes the answer itself.
WAIT = 0.05


class _Entry:
    __slots__ = ("answer", "done", "names", "pod", "view")

    def __init__(self, pod: object, names: Sequence[str], view: object) -> None:
        self.pod, self.names, self.view = pod, names, view
        self.done = threading.Event()
        self.answer: Any = None


class PreparedAnswers:
    """The one answer prepared after the last filter call, and who may take it."""

    def __init__(self, wait: float = WAIT) -> None:
        self._entry: _Entry | None = None
        self._wait = wait

    def begin(self, pod: object, names: Sequence[str], view: object) -> _Entry:
        entry = _Entry(pod, names, view)
        self._entry = entry
        return entry

    @staticmethod
    def finish(entry: _Entry, answer: Any) -> None:
        """``answer`` None: the preparation failed (prioritize computes it itself)."""
        entry.answer = answer
        entry.done.set()

    def take(self, pod: object, names: Sequence[str], view: object) -> Any:
        """The answer prepared for exactly this call, or None. Each is used once."""
        entry = self._entry
        if entry is None:
            metrics.PREPARED.labels("absent").inc()
            return None
        if entry.pod is not pod or entry.view is not view or entry.names != names:
            metrics.PREPARED.labels("stale").inc()
            return None
        if not entry.done.wait(self._wait) or entry.answer is None:
            metrics.PREPARED.labels("unfinished").inc()
            return None
        if self._entry is entry:
            self._entry = None
        metrics.PREPARED.labels("used").inc()
        return entry.answer
