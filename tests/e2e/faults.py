"""A TCP proxy that misbehaves on command, between a client and the API server.

- :meth:`Proxy.freeze`: every connection open now stops forwarding in both
  directions but stays open (a load balancer whose backend died without a reset);
  connections opened later go through normally.
- :meth:`Proxy.hold`: new connections are accepted but nothing is forwarded until
  :meth:`Proxy.release` (an API server that answers nothing for a while).
- :meth:`Proxy.reset`: every connection open now is closed; :meth:`Proxy.reset_idle`:
  those between requests only.

With several upstream ports it stands in for a Service in front of replicas, as
kube-proxy routes a new connection: ``affinity="ClientIP"`` (a Service's
``sessionAffinity: ClientIP``) sends every connection from one client address to the
replica it first reached while that replica accepts connections, and another one when
it does not; ``affinity="None"`` takes them in turn. :attr:`Proxy.reached` counts the
connections each upstream got.
"""

from __future__ import annotations

import contextlib
import queue
import selectors
import socket
import threading
from dataclasses import dataclass


@dataclass
class _Pair:
    client: socket.socket
    upstream: socket.socket
    frozen: bool = False
    answered: bool = False  # the last bytes went to the client: idle between requests


class Proxy:
    def __init__(self, upstream_port: int | list[int], affinity: str = "None") -> None:
        ports = [upstream_port] if isinstance(upstream_port, int) else list(upstream_port)
        assert ports and affinity in ("None", "ClientIP"), (ports, affinity)
        self.upstream_ports, self.affinity = ports, affinity
        self.sticky: dict[str, int] = {}  # client address -> upstream port
        self.turn = 0
        self.reached = dict.fromkeys(ports, 0)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.selector = selectors.DefaultSelector()
        self.pairs: list[_Pair] = []
        self.held = threading.Event()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.connections = 0
        self.new_pairs: queue.SimpleQueue[_Pair] = queue.SimpleQueue()
        self.resets: queue.SimpleQueue[tuple[threading.Event, bool]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Proxy:
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.thread.start()
        return self

    # --- faults -----------------------------------------------------------------------
    def freeze(self) -> int:
        """Freeze every open connection; returns how many."""
        with self.lock:
            for pair in self.pairs:
                pair.frozen = True
            return len(self.pairs)

    def hold(self) -> None:
        self.held.set()

    def release(self) -> None:
        self.held.clear()

    def reset(self, idle_only: bool = False) -> None:
        """Close every open connection (done by the loop thread, which owns them);
        ``idle_only``: only those whose last bytes were an answer to the client (an idle
        keep-alive connection, as a restarted proxy or a flushed conntrack table drops
        it), sparing those with a request in flight."""
        done = threading.Event()
        self.resets.put((done, idle_only))
        if self.thread.is_alive():
            done.wait(5)

    def reset_idle(self) -> None:
        self.reset(idle_only=True)

    def stop(self) -> None:
        self.reset()
        self.stopped.set()
        self.thread.join(5)
        with contextlib.suppress(OSError):
            self.listener.close()

    # --- the loop -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self.stopped.is_set():
            while not self.resets.empty():
                done, idle_only = self.resets.get()
                with self.lock:
                    pairs = [p for p in self.pairs if p.answered or not idle_only]
                for pair in pairs:
                    self._close(pair)
                done.set()
            while not self.new_pairs.empty():
                pair = self.new_pairs.get()
                for sock in (pair.client, pair.upstream):
                    sock.setblocking(False)
                    self.selector.register(sock, selectors.EVENT_READ, pair)
            try:
                events = self.selector.select(0.02)
            except (OSError, ValueError):
                continue
            for key, _ in events:
                if key.data is None:
                    self._accept()
                else:
                    self._forward(key.fileobj, key.data)  # type: ignore[arg-type]

    def _accept(self) -> None:
        try:
            client, (address, _) = self.listener.accept()
        except OSError:
            return
        self.connections += 1
        threading.Thread(target=self._connect, args=(client, address), daemon=True).start()

    def _candidates(self, address: str) -> list[int]:
        """The upstreams to try for a new connection from ``address``, in order."""
        with self.lock:
            ports = self.upstream_ports
            first = self.sticky.get(address) if self.affinity == "ClientIP" else None
            if first is None:
                first = ports[self.turn % len(ports)]
                self.turn += 1
        return [first] + [p for p in ports if p != first]

    def _connect(self, client: socket.socket, address: str) -> None:
        while self.held.is_set() and not self.stopped.is_set():
            threading.Event().wait(0.05)
        upstream = None
        for port in self._candidates(address):
            with contextlib.suppress(OSError):
                upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
                with self.lock:
                    self.reached[port] += 1
                    if self.affinity == "ClientIP":
                        self.sticky[address] = port
                break
        if upstream is None:
            client.close()
            return
        pair = _Pair(client, upstream)
        with self.lock:
            self.pairs.append(pair)
        self.new_pairs.put(pair)  # the loop thread registers it

    def _forward(self, sock: socket.socket, pair: _Pair) -> None:
        if pair.frozen:
            # Read nothing: the bytes stay in the kernel, the peer waits forever.
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(sock)
            return
        other = pair.upstream if sock is pair.client else pair.client
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(pair)
            return
        pair.answered = sock is pair.upstream
        try:
            other.setblocking(True)
            other.sendall(data)
            other.setblocking(False)
        except OSError:
            self._close(pair)

    def _close(self, pair: _Pair) -> None:
        for sock in (pair.client, pair.upstream):
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.selector.unregister(sock)
            with contextlib.suppress(OSError):
                sock.close()
        with self.lock, contextlib.suppress(ValueError):
            self.pairs.remove(pair)
