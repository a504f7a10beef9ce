"""Per-adapter latency targets (SLOs): the targets, the frontends' window counts, the copies.

An adapter's desired state may carry ``slo`` targets (``SloTargets``). Every frontend
counts each such adapter's answered requests by window (``SloCounts``) and puts the
counts of each ended window under its lease (``SloReport``, ``v1/slo/{ns}/reports/
{frontend}``). One frontend's judgement per window raises the copies placement keeps
(``SloCopies``, ``v1/slo/{ns}/copies/{slug}``, no lease); ``/v1/adapters`` shows the
fleet's attainment and why copies were added (``SloAttainment``). Latencies are counted
in ``SLO_BOUNDS_MS`` buckets (10% apart), so the frontends' counts add up.
"""

from __future__ import annotations

import bisect
import math
from typing import Annotated, Final

import msgspec

__all__ = [
    "MAX_SLO_MS",
    "SLO_BOUNDS_MS",
    "SloAttainment",
    "SloCopies",
    "SloCounts",
    "SloReport",
    "SloTargets",
    "bucket_of",
    "decode_slo_copies",
    "decode_slo_report",
    "encode_slo_copies",
    "encode_slo_report",
]

MAX_SLO_MS: Final = 600_000.0
"""The highest target accepted (10 minutes): anything above is a unit mistake."""
_BUCKET_RATIO: Final = 1.1
SLO_BOUNDS_MS: Final = tuple(
    round(_BUCKET_RATIO**i, 3) for i in range(math.ceil(math.log(MAX_SLO_MS, _BUCKET_RATIO)) + 1)
)
"""Upper bounds of the latency buckets, 1 ms to past ``MAX_SLO_MS``, each 10% above the
last; a p95 read from them is at most 10% above the true one."""

TargetMs = Annotated[
    float,
    msgspec.Meta(description=f"milliseconds, above 0 and at most {MAX_SLO_MS:.0f}"),
]


class SloTargets(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """An adapter's latency targets (p95, in milliseconds); None: no target for that one.

    Example::

        SloTargets(ttft_p95_ms=300)                    # time to first token
        SloTargets(ttft_p95_ms=300, itl_p95_ms=50)     # and time per later token
    """

    ttft_p95_ms: TargetMs | None = None
    """95% of answered requests get their first token within this."""
    itl_p95_ms: TargetMs | None = None
    """95% of answered requests of two tokens or more get each later token within this on
    average (inter-token latency: the time from the first token to the last over the
    tokens after the first)."""


class SloCounts(msgspec.Struct, kw_only=True):
    """One adapter's answered requests in one window at one frontend."""

    requests: int = 0
    met: int = 0
    """Requests within every target the adapter has."""
    ttft_met: int = 0
    itl_requests: int = 0
    """Requests with an inter-token latency (two tokens or more)."""
    itl_met: int = 0
    ttft_buckets: dict[int, int] = msgspec.field(default_factory=dict)
    """``SLO_BOUNDS_MS`` index -> requests whose TTFT fell in that bucket (sparse)."""
    itl_buckets: dict[int, int] = msgspec.field(default_factory=dict)

    def add(self, other: SloCounts) -> None:
        """Add ``other``'s counts to these (another frontend's, the same window)."""
        self.requests += other.requests
        self.met += other.met
        self.ttft_met += other.ttft_met
        self.itl_requests += other.itl_requests
        self.itl_met += other.itl_met
        for mine, theirs in ((self.ttft_buckets, other.ttft_buckets),
                             (self.itl_buckets, other.itl_buckets)):  # fmt: skip
            for bucket, count in theirs.items():
                mine[bucket] = mine.get(bucket, 0) + count


class SloReport(msgspec.Struct, kw_only=True, frozen=True):
    """One frontend's counts of one window: window ``window`` spans ``[window * window_s,
    (window + 1) * window_s)`` in Unix seconds, the same windows on every frontend."""

    window_s: float
    window: int
    adapters: dict[str, SloCounts]


class SloCopies(msgspec.Struct, kw_only=True, frozen=True):
    """The copies an adapter's targets made placement keep, and why (the last step's)."""

    name: str
    copies: int
    """Placement keeps at least this many (within ``max_replicas``) while the adapter has
    demand."""
    reason: str
    """The miss that added the last copy, e.g. ``ttft p95 812 ms > target 300 ms``."""
    window: int
    """The window that was judged to add it."""


class SloAttainment(msgspec.Struct, kw_only=True, frozen=True):
    """What ``/v1/adapters`` shows of an adapter with targets: the fleet's last window."""

    window_s: float = 0.0
    requests: int = 0
    """Answered requests in the last judged window, every frontend's (0: none yet)."""
    attainment: float | None = None
    """Share of them within every target."""
    ttft_p95_ms: float | None = None
    """Observed p95 (a bucket's upper bound, at most 10% high)."""
    itl_p95_ms: float | None = None
    copies: int = 0
    """Copies the targets added placement to keep (0: none; demand and bounds decide)."""
    reason: str = ""
    """Why those copies, as the judging frontend wrote it."""


def bucket_of(ms: float) -> int:
    """The ``SLO_BOUNDS_MS`` index of the bucket that holds ``ms``."""
    return bisect.bisect_left(SLO_BOUNDS_MS, ms)


_report_decoder: Final = msgspec.json.Decoder(SloReport)
_copies_decoder: Final = msgspec.json.Decoder(SloCopies)


def encode_slo_report(report: SloReport) -> bytes:
    """A frontend's window report as JSON."""
    return msgspec.json.encode(report)


def decode_slo_report(raw: bytes) -> SloReport:
    """Decode a window report (raises msgspec errors on bad input)."""
    return _report_decoder.decode(raw)


def encode_slo_copies(copies: SloCopies) -> bytes:
    """An adapter's SLO copies record as indented JSON, readable through ``etcdctl``."""
    return msgspec.json.format(msgspec.json.encode(copies), indent=2)


def decode_slo_copies(raw: bytes) -> SloCopies:
    """Decode an SLO copies record (raises msgspec errors on bad input)."""
    return _copies_decoder.decode(raw)
