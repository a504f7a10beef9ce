"""A tenant's quota on one frontend, pure: its share of each limit, the limit a refusal names,
and when to retry. The e2e tests (``test_tenants.py``) cover the same through HTTP."""

from __future__ import annotations

import pytest

from lorafleet.frontend.quotas import MAX_RETRY_AFTER_S, TenantQuota, TokenBucket
from lorafleet.proto.errors import RateLimitedError
from lorafleet.proto.tenants import Tenant
from tests.hand_clock import HandClock


def test_each_frontend_admits_its_share_of_the_request_rate_and_says_when_to_retry() -> None:
    clock = HandClock()
    quota = TenantQuota(Tenant(name="t", requests_per_s=10), share=2, clock=clock)
    for _ in range(5):  # 10/s over 2 frontends: 5/s here, a burst of 5
        quota.admit()
    with pytest.raises(RateLimitedError) as refused:
        quota.admit()
    assert "requests_per_s=10" in refused.value.message
    assert refused.value.retry_after_s == 1
    clock.now += 0.2  # one more request's worth at 5/s
    quota.admit()


def test_tokens_are_debited_when_a_request_ends_and_refuse_the_next_until_refilled() -> None:
    clock = HandClock()
    quota = TenantQuota(Tenant(name="t", tokens_per_min=600), share=1, clock=clock)
    quota.admit()
    quota.release(tokens=900)  # 300 over: 10 tokens/s refill it in 30 s
    with pytest.raises(RateLimitedError) as refused:
        quota.admit()
    assert "tokens_per_min=600" in refused.value.message
    assert refused.value.retry_after_s == 31
    clock.now += 31
    quota.admit()


def test_concurrency_is_capped_at_its_share_but_never_below_one() -> None:
    quota = TenantQuota(Tenant(name="t", max_concurrent=2), share=3)
    quota.admit()
    with pytest.raises(RateLimitedError, match="max_concurrent=2"):
        quota.admit()
    quota.release(tokens=0)
    quota.admit()


@pytest.mark.parametrize("rate", [5e-324, 1e-300, 0.001 / 16])
def test_a_slow_rate_asks_again_within_a_minute_and_never_overflows(rate: float) -> None:
    """Issue 39, item 4: 1e-310/s raised OverflowError (a 500), 1e-300/s gave a
    ``Retry-After`` of 301 digits."""
    bucket = TokenBucket(rate, burst=1.0, clock=HandClock())
    bucket.debit(1)
    assert bucket.wait_s(1) == MAX_RETRY_AFTER_S
