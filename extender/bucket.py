"""A token bucket: ``rate`` tokens a second, at most ``burst`` held. The Event writer
spends one per Event; the filter's recheck one per node it reads again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    __slots__ = ("_burst", "_clock", "_lock", "_refilled", "_tokens", "rate")

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self._burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._refilled = clock()
        self._lock = threading.Lock()  # request threads take tokens side by side

    def level(self) -> float:
        """The tokens it holds, refilled to now (read without taking any)."""
        return self._at(self._clock())

    def take(self, keep: float = 0.0) -> bool:
        """Spend one token, if there is one besides the ``keep`` held back for others."""
        with self._lock:
            now = self._clock()
            self._tokens, self._refilled = self._at(now), now
            if self._tokens >= 1 + keep:
                self._tokens -= 1
                return True
            return False

    def _at(self, now: float) -> float:
        return min(self._burst, self._tokens + (now - self._refilled) * self.rate)
