"""Placements that explain themselves.

When the extender scores a GPU pod it keeps a small :class:`Decision`: the best-scored
candidates with each policy's part of their score. When its watch then sees the pod
bound, :class:`Explainer` writes one Event on the pod (reason ``GPUPlacement``): the
chosen node's per-policy scores and rank among the candidates, and the runner-up with
the policies it lost on. ``kubectl describe pod`` shows it; ``gpu-scheduler explain
POD`` prints it.

Off the hot path: ``prioritize`` only stores the decision (a dict insert); the Event
is built and sent by one background thread, rate-limited, from a bounded queue (what
does not fit is dropped and counted). A decision is worked out only while the rate
leaves room for its Event (:meth:`Explainer.admit`): in a burst of pods above the rate
the ones past it are not explained, as their Events would be dropped anyway. Two
replicas may both hold a decision for the same pod (kube-scheduler retried on the
other): the Event's name comes from the pod's UID, so the second create gets 409 and
is ignored.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from extender import metrics
from extender.bucket import TokenBucket
from gpu_scheduler.textclip import clip_text as clip
from gpu_scheduler.timestamps import rfc3339

log = logging.getLogger(__name__)

REASON = "GPUPlacement"
COMPONENT = "gpu-scheduler-extender"
#: Candidates kept per decision (the chosen node is among them unless kube-scheduler's
#: own plugins outweighed ours).
TOP = 8
MAX_MESSAGE = 1024


@dataclass(frozen=True, slots=True)
class Voice:
    """Who scored, in the message's words: the extender, or the plugins path's plugins
    (plugins/pkg/explain renders the same message in Go, word for word)."""

    score: str = "extender score"
    whose: str = "the extender's"
    who: str = "The extender"
    others: str = "kube-scheduler's own plugins"
    filters: str = "kube-scheduler's own filters"


EXTENDER = Voice()
PLUGINS = Voice(
    "gpu-scheduler score", "gpu-scheduler's", "gpu-scheduler", "kube-scheduler's other plugins",
    "kube-scheduler's filters",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Candidate:
    node: str
    score: int  # what the extender answered, 0..10
    parts: tuple[tuple[str, float], ...]  # (policy, its 0..10 score) for scoring policies
    #: (GPUs a pod can be given, GPUs advertised) where some are unhealthy; else None
    health: tuple[int, int] | None = None
    #: What drew a placement group's pod here (the topology level); else None
    note: str | None = None
    #: Passed over by a filter that picks, for soft taints the pod does not tolerate
    avoided: bool = False
    #: The GPU a pod's (largest) share goes to there, by the fit rule; else None
    gpu: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    namespace: str
    name: str
    uid: str
    gpus: int
    candidates: int
    top: tuple[Candidate, ...]  # best first
    weights: tuple[tuple[str, int], ...]
    #: From a filter call that left one node (kube-scheduler then skips scoring): why
    #: the others failed, (reason, how many nodes), most common first.
    failed: tuple[tuple[str, int], ...] = ()
    #: The extender picked the node itself, in filter (extender/choice.py): ties were
    #: its to break, and nodes with soft taints the pod does not tolerate came last.
    picked: bool = False
    #: Units of gpu-memory per container that asks a share.
    shares: tuple[int, ...] = ()


def decision(
    namespace: str,
    name: str,
    uid: str,
    gpus: int,
    names: Sequence[str],
    scores: Sequence[int],
    parts: Mapping[str, Sequence[float]],
    weights: Mapping[str, int],
    keep: int = TOP,
    health: Callable[[int], tuple[int, int] | None] | None = None,
    note: Callable[[int], str | None] | None = None,
    first: int | None = None,
    avoided: Callable[[int], bool] | None = None,
    shares: tuple[int, ...] = (),
    gpu: Callable[[int], str | None] | None = None,
) -> Decision:
    """What one scoring decided (a prioritize call, or a filter that picked): the
    ``keep`` best candidates (:func:`best`), each with every scoring policy's 0..10
    part, ``health(position)`` of each: its healthy and advertised GPUs where some are
    unhealthy, ``note(position)``: what drew its placement group there, and
    ``avoided(position)``: passed over for soft taints. ``first``: the position of the
    node the extender picked itself (a filter that picks), kept first."""
    order = best(names, scores, keep)
    if first is not None:
        order = [first, *(i for i in order if i != first)][: max(keep, 1)]
    # Each policy's parts for the kept candidates, read in one step where the engine's
    # lazy parts allow it (``pick``) rather than one item at a time.
    picked = [
        (policy, values.pick(order) if hasattr(values, "pick") else [values[i] for i in order])
        for policy, values in parts.items()
    ]
    top = tuple(
        Candidate(
            names[i],
            int(scores[i]),
            tuple((policy, got[k]) for policy, got in picked),
            health(i) if health is not None else None,
            note(i) if note is not None else None,
            avoided(i) if avoided is not None else False,
            gpu(i) if gpu is not None else None,
        )
        for k, i in enumerate(order)
    )
    used = tuple((p, weights.get(p, 0)) for p in parts)
    return Decision(
        namespace, name, uid, gpus, len(names), top, used, picked=first is not None, shares=shares
    )


def best(names: Sequence[str], scores: Sequence[int], keep: int) -> list[int]:
    """The positions of the ``keep`` highest scores, best first, then by name.

    Where more candidates tie at the lowest score kept than there is room for, the
    first of them in kube-scheduler's order are kept (it breaks such ties at random
    itself). This runs on every prioritize call, over up to every node of the
    cluster: the ``keep``-th highest score is found in numpy, and only the ``keep``
    chosen are ordered in Python."""
    values = np.asarray(scores)
    if keep <= 0:
        return []
    chosen: list[int] = list(range(len(values)))
    if len(values) > keep:
        floor = np.partition(values, len(values) - keep)[len(values) - keep]
        above = np.flatnonzero(values > floor).tolist()  # fewer than keep
        tied = np.flatnonzero(values == floor)[: keep - len(above)].tolist()
        chosen = above + tied
    return sorted(chosen, key=lambda i: (-int(values[i]), names[i]))


def only_fit(
    namespace: str,
    name: str,
    uid: str,
    gpus: int,
    node: str,
    candidates: int,
    reasons: Mapping[str, str],
    shares: tuple[int, ...] = (),
    gpu: str | None = None,
) -> Decision:
    """A filter call that passed one node of ``candidates``: kube-scheduler binds it
    without scoring, so this is the whole story. ``reasons``: node -> why it failed;
    ``shares`` and ``gpu``: a share pod's, and the GPU its largest share goes to."""
    counts: dict[str, int] = {}
    for reason in reasons.values():
        counts[reason] = counts.get(reason, 0) + 1
    failed = tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:3])
    top = (Candidate(node, 10, (), gpu=gpu),)
    return Decision(namespace, name, uid, gpus, candidates, top, (), failed, shares=shares)


def _parts(candidate: Candidate) -> str:
    return ", ".join(f"{policy} {value:.0f}" for policy, value in candidate.parts) or "no policy"


def explain(d: Decision, chosen: str, voice: Voice = EXTENDER) -> str:
    """The Event's message for ``d`` once the pod is bound to ``chosen``."""
    weights = dict(d.weights)
    rank = next((i for i, c in enumerate(d.top) if c.node == chosen), None)
    head = f"{d.gpus} GPU{'s' if d.gpus != 1 else ''} on {chosen}"
    if d.shares:
        where = d.top[rank].gpu if rank is not None else None
        asked = "+".join(map(str, d.shares))
        head = f"a {asked} GiB share{' of ' + where if where else ''} on {chosen}"
    if rank is None:
        best = d.top[0] if d.top else None
        text = (
            f"{head}: not among {voice.whose} best {len(d.top)} of {d.candidates} "
            f"candidates; {voice.others} decided"
        )
        if best is not None:
            text += f" ({voice.whose} best: {best.node}, score {best.score}: {_parts(best)})"
        return clip(text, MAX_MESSAGE - 64)
    node = d.top[rank]
    if not node.parts and not d.picked:  # the one node the filter left
        if d.candidates == 1:
            return clip(f"{head}: the only node {voice.filters} left", 960)
        text = f"{head}: the only one of {d.candidates} candidates that fits"
        if d.failed:
            text += "; the others: " + "; ".join(f"{n} x {reason}" for reason, n in d.failed)
        return clip(text, MAX_MESSAGE - 64)
    if node.health is not None:
        head += f" ({node.health[0]} of {node.health[1]} GPUs there healthy)"
    if node.note is not None:
        head += f", with its placement group ({node.note})"
    text = (
        f"{head}: {voice.score} {node.score}/10, rank {rank + 1} of {d.candidates} "
        f"candidate{'s' if d.candidates != 1 else ''} ({_parts(node)}; weights "
        + ", ".join(f"{p} {w}" for p, w in d.weights)
        + ")"
    )
    others = [c for c in d.top if c.node != chosen]
    if not others:
        return clip(text + ". No other candidate.", MAX_MESSAGE - 64)
    runner = others[0]
    mine = dict(node.parts)
    lost = sorted(
        (
            (weights.get(p, 0) * (mine.get(p, 0.0) - v), p, v)
            for p, v in runner.parts
            if mine.get(p, 0.0) > v
        ),
        reverse=True,
    )
    why = ", ".join(f"{p} {v:.0f} against {mine[p]:.0f}" for _, p, v in lost)
    if runner.avoided:
        text += (
            f". {runner.node} scored {runner.score}, but has a PreferNoSchedule taint "
            "the pod does not tolerate"
        )
    elif runner.score > node.score:
        text += (
            f". {voice.who} preferred {runner.node} (score {runner.score}); "
            f"{voice.others} outweighed that"
        )
    elif runner.score == node.score:
        breaker = "the extender" if d.picked else "kube-scheduler"
        text += f". {runner.node} scored {runner.score} too ({breaker} broke the tie)"
        text += f"; it is lower on {why}" if why else ""
    else:
        text += f". Runner-up {runner.node}, score {runner.score}" + (
            f": lower on {why}" if why else ""
        )
    return clip(text, MAX_MESSAGE - 64)


def event_name(pod: str, uid: str) -> str:
    """One name per pod for every replica (a DNS subdomain of at most 253)."""
    digest = hashlib.sha256(uid.encode()).hexdigest()[:10]
    return f"{pod[:200]}.{digest}.gpu-placement"


def event_body(d: Decision, chosen: str, now: datetime, instance: str) -> dict[str, Any]:
    stamp = rfc3339(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(d.name, d.uid), "namespace": d.namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": d.namespace,
            "name": d.name,
            "uid": d.uid,
        },
        "reason": REASON,
        "message": explain(d, chosen),
        "type": "Normal",
        "action": "Scheduled",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance[:128],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class Explainer:
    """Decisions by pod UID (bounded, expiring), and the thread that writes Events.

    ``post(body)`` creates one Event and raises on failure; an exception with
    ``status == 409`` means another replica wrote it already.
    """

    def __init__(
        self,
        post: Callable[[dict[str, Any]], Any],
        *,
        capacity: int = 4096,
        ttl: float = 600.0,
        rate: float = 10.0,
        burst: int = 50,
        queue_size: int = 1000,
        clock: Callable[[], float] = time.monotonic,
        instance: str | None = None,
    ) -> None:
        self._post = post
        self._decisions: OrderedDict[str, tuple[float, Decision]] = OrderedDict()
        #: Pods whose decision is remembered after their answer went out (a filter
        #: that picks): the node the watch saw them bound to first, if it was quicker.
        self._expected: OrderedDict[str, str | None] = OrderedDict()
        self._lock = threading.Lock()
        self._capacity, self._ttl = capacity, ttl
        self._bucket = TokenBucket(rate, burst, clock)
        self._clock = clock
        self._queue: queue.Queue[tuple[Decision, str] | None] = queue.Queue(queue_size)
        self._instance = instance or socket.gethostname()
        self._thread: threading.Thread | None = None
        self.written = 0
        self.dropped = 0
        self.failed = 0
        self.duplicate = 0

    # --- the hot path and the watch ----------------------------------------------
    def admit(self) -> bool:
        """Whether to work out the decision about to be made: its Event would find a
        token when written (the bucket, refilled to now, holds one more than the
        Events already queued). Above the rate (a burst of pods) the Event would be
        dropped at the writer, so it is not worked out; the caller says
        :meth:`unexplained` for the answer it gives, once a pod."""
        # Read without the writer's cooperation: a refill racing this read makes it
        # off by a fraction of a token, which only moves the one pod at the edge.
        return self._bucket.level() - self._queue.qsize() >= 1

    def unexplained(self) -> None:
        """A placement answered without its explanation (:meth:`admit` said no): its
        Event is counted dropped, as the writer would have counted it."""
        self._count("dropped")

    def expect(self, uid: str) -> None:
        """Pod ``uid``'s decision will be remembered after its answer is on the wire:
        kube-scheduler may bind it, and the watch deliver that, first. Call before
        the answer goes out."""
        with self._lock:
            self._keep(self._expected, uid, None)

    def remember(self, d: Decision) -> None:
        if not d.uid or not d.top:
            return
        now = self._clock()
        with self._lock:
            node = self._expected.pop(d.uid, None)
            if node is None:  # not bound yet (the usual order)
                self._keep(self._decisions, d.uid, (now, d))
                return
        self._enqueue(d, node)  # the watch saw it bound before this

    def bound(self, uid: str, node: str) -> None:
        """The watch saw pod ``uid`` bound to ``node``: queue its Event, if we scored it
        (or keep the node for its decision, where that is still to come)."""
        with self._lock:
            entry = self._decisions.pop(uid, None)
            if entry is None:
                if uid in self._expected:
                    self._expected[uid] = node
                return
        if self._clock() - entry[0] <= self._ttl:
            self._enqueue(entry[1], node)

    def _keep(self, kept: OrderedDict[str, Any], uid: str, value: Any) -> None:
        """``kept[uid] = value``, newest last, the oldest dropped past the capacity
        (the caller holds the lock)."""
        kept[uid] = value
        kept.move_to_end(uid)
        while len(kept) > self._capacity:
            kept.popitem(last=False)

    def _enqueue(self, d: Decision, node: str) -> None:
        try:
            self._queue.put_nowait((d, node))
        except queue.Full:
            self._count("dropped")

    # --- the writer ------------------------------------------------------------------
    def start(self) -> Explainer:
        self._thread = threading.Thread(target=self._run, name="explainer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._queue.put(None)

    def drain(self) -> None:
        """Write what is queued now (the thread's loop; tests call it directly)."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is None:
                return
            self._write(*item)

    def _write(self, d: Decision, node: str) -> None:
        if not self._bucket.take():
            self._count("dropped")
            return
        try:
            self._post(event_body(d, node, datetime.now(UTC), self._instance))
            self._count("written")
        except Exception as exc:
            if getattr(exc, "status", None) == 409:
                self._count("duplicate")  # the other replica wrote it
                return
            self._count("failed")
            log.warning("placement event not written", extra={"pod": d.name, "error": repr(exc)})

    def _count(self, outcome: str) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        metrics.PLACEMENT_EVENTS.labels(outcome).inc()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._write(*item)
            if self._bucket.level() < 1:
                time.sleep(1.0 / self._bucket.rate)
