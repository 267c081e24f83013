"""List, then watch, one kind of object, for as long as the extender runs, and know
how old what it has is.

client-go's reflector, in small, with the liveness a half-open connection needs:

- every list and watch call has a client-side read timeout of :data:`SILENCE` seconds:
  a call that delivers nothing for that long (a load balancer whose backend died keeps
  the TCP connection open and silent) is abandoned, the client's idle connections are
  dropped, and the kind is listed again over a new connection;
- watches ask the API server to end them after about :data:`WATCH_SECONDS` (with
  jitter) and for bookmarks, which it sends ~2 s before that end: a healthy watch
  therefore says something at least every :data:`WATCH_SECONDS`, well inside
  :data:`SILENCE`;
- TCP keepalive is on for the client's sockets (``gpu_scheduler.kube``), so a peer
  that vanished without a word is noticed by the kernel too;
- a broken watch (the API server restarting, a reset connection) resumes from the
  last resourceVersion it saw, and a failed list is tried again, after a backoff of
  0.5 s doubling to :data:`MAX_BACKOFF`, so the view is current within seconds of the
  API server coming back; a 410 Gone (that resourceVersion was compacted away) lists
  again at once.

:attr:`Reflector.contact` is when the API server last said anything for this kind (a
list, an event, a bookmark, the clean end of a watch); its age is the age of the view.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from extender import metrics
from gpu_scheduler.jsondecode import decode_json

log = logging.getLogger(__name__)

#: A watch is asked to end after this many seconds (plus up to 5 s of jitter).
WATCH_SECONDS = 30
#: Longest silence on a list or watch call before it is abandoned, in seconds.
SILENCE = 50.0
CONNECT_TIMEOUT = 10.0
#: An optional kind the API server does not serve (or lets us read) is asked again
#: this often, in seconds.
ABSENT_RETRY = 300.0
#: Longest wait between two attempts after a failure, in seconds.
MAX_BACKOFF = 4.0
PAGE_SIZE = 500

ListFunc = Callable[..., Any]


@dataclass(eq=False)
class Reflector:
    """One kind: ``replace(items)`` after each list, ``apply(type, obj)`` per event."""

    kind: str
    list_func: ListFunc
    params: Mapping[str, Any]  # copied at init
    replace: Callable[[Iterable[Mapping[str, Any]]], None]
    apply: Callable[[str, Mapping[str, Any]], None]
    _: KW_ONLY
    stop: threading.Event
    reset_connections: Callable[[], None] = lambda: None
    clock: Callable[[], float] = time.monotonic
    silence: float = SILENCE
    watch_seconds: int = WATCH_SECONDS
    #: Optional kinds only: the API server does not serve it (404) or lets us read
    #: it (403). It then counts as listed and empty, and is asked again later.
    optional: bool = False
    #: Wait (up to :data:`SILENCE`) for this before the first list: ResourceSlices
    #: are read through the DeviceClass that selects their devices.
    after: threading.Event | None = None

    def __post_init__(self) -> None:
        self.params = dict(self.params)
        self.synced = threading.Event()
        #: Monotonic time the API server last said anything about this kind.
        self.contact: float | None = None
        self.relists = 0
        self._version: str | None = None
        #: Why an optional kind counts as absent (None: it is not).
        self.absent: str | None = None
        #: Why the API server does not answer this kind (an error, or no answer over a
        #: new connection either), until it next says anything; None: it answers, or
        #: only a connection of ours went silent (cache.ready tells the two apart).
        self.failing: str | None = None
        self._relist = threading.Event()

    def age(self) -> float | None:
        """Seconds since the last word from the API server (None: never listed; 0 for
        an absent optional kind: there is nothing to be stale about)."""
        if self.absent is not None:
            return 0.0
        return None if self.contact is None else max(0.0, self.clock() - self.contact)

    def _touch(self) -> None:
        self.contact = self.clock()
        self.failing = None
        metrics.child(metrics.CACHE_CONTACT, self.kind).set(time.time())

    def request_relist(self) -> None:
        """List again at the end of the current watch (within :data:`WATCH_SECONDS`):
        what the cache kept of the objects no longer answers a new question."""
        self._relist.set()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name=f"reflector-{self.kind}", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        from gpu_scheduler.kube import Gone, is_timeout

        why, backoff = "start", 0.5
        version: str | None = None  # None: list first
        if self.after is not None:
            self.after.wait(self.silence)
        while not self.stop.is_set():
            try:
                if version is None:
                    version = self._list(why)
                self._watch(version)
                version = self._version or version  # ended on time: watch on from here
                backoff = 0.5
                if self._relist.is_set():
                    self._relist.clear()
                    why, version = "requested", None
            except Gone:
                why, version = "gone", None
            except Exception as exc:
                if self.stop.is_set():
                    return
                if self.optional and version is None and _status(exc) in (403, 404):
                    self._absent(_status(exc))
                    self.stop.wait(ABSENT_RETRY)
                    why = "absent"
                    continue
                self.reset_connections()
                if is_timeout(exc):
                    if version is None:  # a list over a new connection: silent too
                        self.failing = f"no answer over a new connection ({exc!r})"[:300]
                    # Silence: maybe a half-open connection; list again over a new one.
                    why, version = "silence", None
                    log.warning(
                        "the API server went silent; dropping connections and listing again",
                        extra={"kind": self.kind, "silence_s": self.silence},
                    )
                    continue
                # A broken watch resumes from the last resourceVersion it saw (client-go
                # does the same); a failed list is tried again. Either after a backoff.
                self.failing = repr(exc)[:300]
                if version is not None:
                    version = self._version or version
                else:
                    why = "error"
                log.warning(
                    "cache list or watch failed; trying again",
                    extra={
                        "kind": self.kind,
                        "error": repr(exc),
                        "backoff_s": backoff,
                        "resume_from": version,
                    },
                )
                self.stop.wait(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, MAX_BACKOFF)

    def _absent(self, status: int | None) -> None:
        reason = "not served by the API server" if status == 404 else "not readable (RBAC)"
        if self.absent != reason:
            (log.info if status == 404 else log.warning)(
                "optional kind unavailable; treating it as empty",
                extra={"kind": self.kind, "why": reason, "retry_s": ABSENT_RETRY},
            )
        self.absent = reason
        self.replace([])
        self._touch()
        self.synced.set()

    def _list(self, why: str) -> str:
        """List the kind page by page into :attr:`replace`. ``replace`` consumes a
        generator: each page is parsed, handed over item by item and dropped before
        the next page is asked for, so a relist holds one page of raw objects (at most
        :data:`PAGE_SIZE`), never the whole list (at 50,000 pods that is the
        difference between a few MiB and a GiB)."""
        started = time.monotonic()
        listed: dict[str, Any] = {"count": 0, "version": None}

        def pages() -> Iterator[Mapping[str, Any]]:
            token = None
            while True:
                response = self.list_func(
                    limit=PAGE_SIZE,
                    _continue=token,
                    _preload_content=False,
                    _request_timeout=(CONNECT_TIMEOUT, self.silence),
                    **self.params,
                )
                page = decode_json(response.data)
                response.release_conn()
                meta = page.get("metadata") or {}
                items = page.get("items") or ()
                del page
                listed["count"] += len(items)
                yield from items
                del items
                token = meta.get("continue")
                if not token:
                    listed["version"] = str(meta.get("resourceVersion") or "")
                    return

        self.replace(pages())
        version = listed["version"]
        if version is None:
            raise RuntimeError(f"{self.kind}: replace() did not read the list to its end")
        self.absent = None
        self._version = version
        self._touch()
        self.relists += 1
        metrics.CACHE_RELISTS.labels(self.kind, why).inc()
        self.synced.set()
        log.info(
            "cache listed",
            extra={
                "kind": self.kind,
                "count": listed["count"],
                "why": why,
                "seconds": round(time.monotonic() - started, 3),
            },
        )
        return version

    def _watch(self, version: str) -> None:
        from gpu_scheduler.kube import watch_events

        seconds = self.watch_seconds + random.randint(0, 5)
        for event, obj in watch_events(
            self.list_func,
            version,
            seconds,
            request_timeout=(CONNECT_TIMEOUT, self.silence),
            **self.params,
        ):
            meta = obj.get("metadata")
            if isinstance(meta, Mapping) and isinstance(meta.get("resourceVersion"), str):
                self._version = meta["resourceVersion"]
            self._touch()
            if event != "BOOKMARK":
                self.apply(event, obj)
            if self.stop.is_set() or self._relist.is_set():
                return
        self._touch()  # the server ended the watch on time: it is alive


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def stale_readiness(
    reflectors: Mapping[str, Reflector], age: float, limit: float, summary: str
) -> tuple[bool, str]:
    """Readiness when the view is over ``limit`` seconds old. Where the API server
    does not answer this replica (errors, or silence over new connections too) for
    every kind that is stale, the cause is one the other replica shares (the API
    server down or overloaded, egress to it cut): both going unready would stop every
    GPU pod, while kube-scheduler can live with decisions from the last view (its own
    fit check guards each binding), so the replica stays ready, degraded. Where the
    API server answers and only this replica's connections went silent, it is not
    ready: the other replica answers meanwhile, and this one heals at the silence
    bound."""
    stale = {kind: r for kind, r in reflectors.items() if (r.age() or 0.0) > limit}
    failing = [f"{kind}: {r.failing}" for kind, r in stale.items() if r.failing]
    if stale and len(failing) == len(stale):
        return True, (
            f"degraded: the view is {age:.0f}s old and the API server does not answer this "
            f"replica ({failing[0]}); answering from the last view; {summary}"
        )
    return False, f"the view is {age:.0f}s old (over {limit:.0f}s); {summary}"
