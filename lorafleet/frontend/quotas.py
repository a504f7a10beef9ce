"""One tenant's limits on one frontend: token buckets for requests and tokens, a
concurrency count; pure bookkeeping, no I/O.

Each frontend holds ``1/share`` of every limit, ``share`` being the live frontends it
sees (``frontend.tenants``); docs/tenants.md states the error bound that follows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Final

from lorafleet.proto.errors import RateLimitedError
from lorafleet.proto.tenants import Tenant

__all__ = ["MAX_RETRY_AFTER_S", "TenantQuota", "TokenBucket"]

TOKEN_WINDOW_S: Final = 60.0
"""The token limit is per minute: a frontend may spend its minute's share at once."""
MAX_RETRY_AFTER_S: Final = 60
"""The longest ``Retry-After`` a refusal names: a slow rate (0.001/s over 16 frontends is one
request in 4.4 hours) is still asked about within the minute, and the header stays short."""


class TokenBucket:
    """``rate`` units per second, up to ``burst`` saved; a debit may take it below zero."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float]) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._level = burst
        self._at = clock()

    def level(self) -> float:
        """Units available now (negative: owed by requests already let through)."""
        now = self._clock()
        self._level = min(self.burst, self._level + (now - self._at) * self.rate)
        self._at = now
        return self._level

    def debit(self, units: float) -> None:
        """Take ``units`` (after the fact: the level may go below zero)."""
        self._level = self.level() - units

    def wait_s(self, needed: float) -> int:
        """Whole seconds until ``needed`` units are there: 1 to ``MAX_RETRY_AFTER_S``."""
        seconds = (needed - self.level()) / self.rate  # inf for a rate near zero
        return max(1, math.ceil(min(seconds, MAX_RETRY_AFTER_S)))


class TenantQuota:
    """The tenant's limits divided by ``share``: admit or refuse one request, count its end."""

    def __init__(
        self, tenant: Tenant, share: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.tenant = tenant
        self.share = share
        self.inflight = 0
        rps, tpm = tenant.requests_per_s / share, tenant.tokens_per_min / share
        self._requests = TokenBucket(rps, max(1.0, rps), clock) if rps else None
        self._tokens = TokenBucket(tpm / TOKEN_WINDOW_S, tpm, clock) if tpm else None
        self._cap = max(1, tenant.max_concurrent // share) if tenant.max_concurrent else 0

    def admit(self) -> None:
        """Count one request in, or raise ``RateLimitedError`` naming the limit it hit."""
        name = self.tenant.name
        if self._cap and self.inflight >= self._cap:
            raise RateLimitedError(
                f"tenant {name!r} has {self.inflight} requests running on this frontend, its "
                f"share of max_concurrent={self.tenant.max_concurrent}; retry when one ends",
                retry_after_s=1, limit="max_concurrent",
            )  # fmt: skip
        if self._tokens is not None and self._tokens.level() <= 0:
            raise RateLimitedError(
                f"tenant {name!r} is over tokens_per_min={self.tenant.tokens_per_min} "
                "(prompt plus completion tokens)",
                retry_after_s=self._tokens.wait_s(1), limit="tokens_per_min",
            )  # fmt: skip
        if self._requests is not None:
            if self._requests.level() < 1:
                raise RateLimitedError(
                    f"tenant {name!r} is over requests_per_s={self.tenant.requests_per_s:g}",
                    retry_after_s=self._requests.wait_s(1), limit="requests_per_s",
                )  # fmt: skip
            self._requests.debit(1)
        self.inflight += 1

    def release(self, tokens: int) -> None:
        """One admitted request ended, having used ``tokens`` (prompt plus completion)."""
        self.inflight -= 1
        if self._tokens is not None and tokens:
            self._tokens.debit(tokens)
