"""A TCP proxy that misbehaves on command, between a client and the API server.

- :meth:`Proxy.freeze`: every connection open now stops forwarding in both
  directions but stays open (a load balancer whose backend died without a reset);
  connections opened later go through normally.
- :meth:`Proxy.hold`: new connections are accepted but nothing is forwarded until
  :meth:`Proxy.release` (an API server that answers nothing for a while).
- :meth:`Proxy.reset`: every connection open now is closed.
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


class Proxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.selector = selectors.DefaultSelector()
        self.pairs: list[_Pair] = []
        self.held = threading.Event()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.connections = 0
        self.new_pairs: queue.SimpleQueue[_Pair] = queue.SimpleQueue()
        self.resets: queue.SimpleQueue[threading.Event] = queue.SimpleQueue()
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

    def reset(self) -> None:
        """Close every open connection (done by the loop thread, which owns them)."""
        done = threading.Event()
        self.resets.put(done)
        if self.thread.is_alive():
            done.wait(5)

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
                with self.lock:
                    pairs = list(self.pairs)
                for pair in pairs:
                    self._close(pair)
                self.resets.get().set()
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
            client, _ = self.listener.accept()
        except OSError:
            return
        self.connections += 1
        threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        while self.held.is_set() and not self.stopped.is_set():
            threading.Event().wait(0.05)
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
        except OSError:
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
