"""Per-key rate limits: one token bucket per session.

``rate`` requests a second on average, ``burst`` at once. A request that finds the bucket
empty is refused with 429 ``rate_limited`` and a ``Retry-After`` header (whole seconds until
a token is back). ``rate <= 0`` disables the limit. Buckets live as long as their session
is known to the limiter; :meth:`RateLimiter.forget` drops them with the session, and full
buckets (idle keys) are pruned, so memory is bounded by the number of sessions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from rlgate.errors import RateLimited


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self.refused = 0

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def take(self, key: str) -> None:
        """Spend one token of ``key``'s bucket or raise :class:`RateLimited` (with ``retry_after``)."""
        if not self.enabled:
            return
        now = self.clock()
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = _Bucket(float(self.burst), now)
        else:
            b.tokens = min(float(self.burst), b.tokens + (now - b.updated) * self.rate)
            b.updated = now
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return
        self.refused += 1
        wait = (1.0 - b.tokens) / self.rate
        raise RateLimited(
            f"this key sent more than {self.rate:g} requests per second (burst {self.burst}); "
            f"retry in {wait:.2f} s", code="rate_limited", retry_after=max(1, math.ceil(wait)))

    def forget(self, key: str) -> None:
        self._buckets.pop(key, None)

    def prune(self) -> int:
        """Drop buckets that have refilled (their keys were idle); return how many."""
        now = self.clock()
        full = [k for k, b in self._buckets.items() if b.tokens + (now - b.updated) * self.rate >= self.burst]
        for k in full:
            del self._buckets[k]
        return len(full)

    def __len__(self) -> int:
        return len(self._buckets)
