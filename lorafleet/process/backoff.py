"""Capped exponential backoff with full jitter: the one retry delay every loop uses.

Pure arithmetic; callers sleep. Full jitter (a uniform draw below the exponential
bound) keeps a fleet of workers from retrying in lock-step after an outage.
"""

from __future__ import annotations

import random
from typing import Final

__all__ = ["backoff_s"]

BASE_DELAY_S: Final = 0.05


def backoff_s(failures: int, *, cap_s: float, base_s: float = BASE_DELAY_S) -> float:
    """Seconds to wait after ``failures`` failures in a row: uniform below min(cap, base * 2^n)."""
    exponent = min(max(failures, 0), 32)  # 2**32 * base is far past any cap
    return random.uniform(0, min(cap_s, base_s * 2**exponent))
