"""An explicit fake of the API server's list and watch, for one kind of object.

It stands where a ``CoreV1Api.list_*`` method stands: called without ``watch`` it
answers a list page (``limit``/``continue`` honoured) with the current objects and
resourceVersion; with ``watch=True`` it streams the events the test queues, as JSON
lines, until the test ends the watch (:meth:`end_watch`) or sends a 410
(:meth:`gone`). A watch given nothing to send for its read timeout raises urllib3's
``ReadTimeoutError``, as a silent connection does. :class:`FakeCore` holds one per
kind the extender's cache reflects.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from urllib3.exceptions import ReadTimeoutError

_END = object()


class _ListResponse:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def release_conn(self) -> None:
        pass


class _WatchResponse:
    def __init__(self, api: FakeListWatch, events: queue.Queue[Any], read_timeout: float) -> None:
        self.api = api
        self.events = events
        self.read_timeout = read_timeout
        self.closed = False

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        while not self.closed:
            try:
                item = self.events.get(timeout=self.read_timeout)
            except queue.Empty:
                raise ReadTimeoutError(None, "/watch", "Read timed out.") from None
            if item is _END:
                return
            yield json.dumps(item).encode() + b"\n"

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        pass


class FakeListWatch:
    """One kind's list and watch. ``objects`` are dicts with ``metadata.name``."""

    def __init__(self, objects: Iterable[Mapping[str, Any]] = (), version: int = 100) -> None:
        self.objects: dict[str, Mapping[str, Any]] = {o["metadata"]["name"]: o for o in objects}
        self.version = version
        self.lists = 0
        self.watches: list[dict[str, Any]] = []
        self.fail_next: list[BaseException] = []
        self.hold = threading.Event()  # set: list calls wait until it is cleared
        # The open watches by field selector (the newest for each): a pod list serves
        # the bound pods' watch and the pending pods' watch at once.
        self._open: dict[str | None, queue.Queue[Any]] = {}
        self._opened = threading.Condition()

    # --- the API side ---------------------------------------------------------------
    def __call__(self, **kwargs: Any) -> Any:
        if self.fail_next:
            raise self.fail_next.pop(0)
        timeout = kwargs.get("_request_timeout")
        read_timeout = timeout[1] if isinstance(timeout, tuple) else (timeout or 3600)
        if not kwargs.get("watch"):
            while self.hold.is_set():
                threading.Event().wait(0.01)
            self.lists += 1
            items = sorted(self.objects.values(), key=lambda o: o["metadata"]["name"])
            items = [o for o in items if _selected(o, kwargs.get("field_selector"))]
            start = int(kwargs.get("_continue") or 0)
            limit = kwargs.get("limit") or len(items) or 1
            meta: dict[str, Any] = {"resourceVersion": str(self.version)}
            if start + limit < len(items):
                meta["continue"] = str(start + limit)
            page = {"metadata": meta, "items": items[start : start + limit]}
            return _ListResponse(json.dumps(page).encode())
        events: queue.Queue[Any] = queue.Queue()
        with self._opened:
            self.watches.append(kwargs)
            self._open[kwargs.get("field_selector")] = events
            self._opened.notify_all()
        return _WatchResponse(self, events, read_timeout)

    # --- the test side ---------------------------------------------------------------
    def wait_for_watch(self, count: int, timeout: float = 5.0) -> None:
        """Block until ``count`` watch calls have been made."""
        with self._opened:
            if not self._opened.wait_for(lambda: len(self.watches) >= count, timeout):
                raise TimeoutError(f"{len(self.watches)} watches, waited for {count}")

    def event(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Change the objects as the event says and stream it to the open watch."""
        self.version += 1
        obj = json.loads(json.dumps(obj))
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        name = obj["metadata"]["name"]
        before = self.objects.get(name)
        if kind == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = obj
        assert self._open, "no watch open"
        # As the API server's watch cache does with a field selector
        # (cacheWatcher.convertToWatchEvent): an object that enters the selection
        # arrives ADDED, one that leaves it DELETED carrying its state before (with the
        # event's resourceVersion), one outside it before and after not at all.
        for selector, events in self._open.items():
            was = before is not None and _selected(before, selector)
            now = kind != "DELETED" and _selected(obj, selector)
            if kind == "DELETED":
                known = was if before is not None else _selected(obj, selector)
                sent = "DELETED" if known else None
            elif now:
                sent = "ADDED" if before is not None and not was else kind
            else:
                sent = "DELETED" if was else None
            if sent is not None:
                shown = obj
                if sent == "DELETED" and kind != "DELETED" and before is not None:
                    shown = json.loads(json.dumps(before))
                    shown["metadata"]["resourceVersion"] = str(self.version)
                events.put({"type": sent, "object": shown})

    def change(self, obj: Mapping[str, Any]) -> None:
        """The API server now holds ``obj`` (a new resourceVersion), and the watch has
        not said so: a watch that is behind."""
        self.version += 1
        obj = json.loads(json.dumps(obj))
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.objects[obj["metadata"]["name"]] = obj

    def remove(self, name: str) -> None:
        """Gone from the API server, and the watch has not said so."""
        self.version += 1
        del self.objects[name]

    def bookmark(self) -> None:
        meta = {"resourceVersion": str(self.version)}
        self._send({"type": "BOOKMARK", "object": {"metadata": meta}})

    def gone(self) -> None:
        self._send({"type": "ERROR", "object": {"code": 410, "message": "too old"}})

    def end_watch(self) -> None:
        for events in self._open.values():
            events.put(_END)

    def _send(self, item: Any) -> None:
        assert self._open, "no watch open"
        for events in self._open.values():
            events.put(item)


class FakeCore:
    """Stands for the ``CoreV1Api`` the cluster cache is started with."""

    def __init__(
        self, nodes: Iterable[Mapping[str, Any]] = (), pods: Iterable[Mapping[str, Any]] = ()
    ) -> None:
        self.list_node = FakeListWatch(nodes)
        self.list_pod_for_all_namespaces = FakeListWatch(pods)
        # PolicyV1Api's list, which the preempt verb reads (extender/budgets.py)
        self.list_pod_disruption_budget_for_all_namespaces = FakeListWatch()
        self.api_client = None
        self.node_reads: list[str] = []
        self.fail_reads: list[BaseException] = []

    def read_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any:
        """GET one Pod, as the API server has it now (404 when it has none)."""
        from kubernetes.client.exceptions import ApiException

        pod = self.list_pod_for_all_namespaces.objects.get(name)
        if pod is None or (pod.get("metadata", {}).get("namespace") or "default") != namespace:
            raise ApiException(status=404, reason="Not Found")
        return _ListResponse(json.dumps(pod).encode())

    def read_node(self, name: str, **kwargs: Any) -> Any:
        """GET one Node, as the API server has it now (404 when it has none)."""
        from kubernetes.client.exceptions import ApiException

        self.node_reads.append(name)
        if self.fail_reads:
            raise self.fail_reads.pop(0)
        node = self.list_node.objects.get(name)
        if node is None:
            raise ApiException(status=404, reason="Not Found")
        return _ListResponse(json.dumps(node).encode())


def _selected(obj: Mapping[str, Any], selector: str | None) -> bool:
    """Whether ``obj`` matches a field selector (``a.b=v``, ``a.b!=v``, comma-joined),
    as the API server reads one: a missing field is the empty string."""
    for term in filter(None, (selector or "").split(",")):
        negated = "!=" in term
        path, _, want = term.partition("!=" if negated else "=")
        value: Any = obj
        for key in path.split("."):
            value = value.get(key) if isinstance(value, Mapping) else None
        if ((value or "") == want.lstrip("=")) == negated:
            return False
    return True


def synced_cache(
    nodes: Iterable[Mapping[str, Any]] = (),
    pods: Iterable[Mapping[str, Any]] = (),
    *,
    core: FakeCore | None = None,
    resource: Any = None,
    **kwargs: Any,
) -> Any:
    """A :class:`ClusterCache` listed from a :class:`FakeCore` (its watches stay open):
    ``core``, or one holding ``nodes`` and ``pods``; with ``resource``, the DRA kinds."""
    from extender.cache import ClusterCache

    cache = ClusterCache(**kwargs)
    core = core or FakeCore(nodes, pods)
    cache.start(core, resource)
    for reflector in cache.reflectors.values():
        if not reflector.synced.wait(5):
            raise TimeoutError(f"{reflector.kind} never listed")
    return cache
