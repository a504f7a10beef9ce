"""Aliases and rollouts: one name split by weight over adapter versions, and its canary policy.

An ``Alias`` is desired state (``v1/aliases/{namespace}/{slug}``, no lease), written
by frontends' admin routes. A ``WindowReport`` is one frontend's counts of one
evaluation window (``v1/rollouts/{namespace}/{slug}/{frontend}``, under that
frontend's lease). :func:`validate_alias_shape` and :func:`validate_policy` check what
needs no other state; the frontend checks targets against what the fleet serves.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from lorafleet.proto.adapters import LoraName
from lorafleet.proto.errors import InvalidRequestError
from lorafleet.proto.limits import MAX_SAFE_INT
from lorafleet.proto.openai import ModelObject

__all__ = [
    "Alias",
    "AliasList",
    "AliasModelObject",
    "AliasRequest",
    "AliasTarget",
    "PromoteRequest",
    "RollbackRequest",
    "Rollout",
    "RolloutFigures",
    "RolloutPhase",
    "RolloutPolicy",
    "RolloutRequest",
    "TTFT_BOUNDS_MS",
    "VersionCounts",
    "VersionFigures",
    "WindowReport",
    "decode_alias",
    "encode_alias",
    "validate_alias_shape",
    "validate_policy",
]

TOTAL_WEIGHT: Final = 100
MAX_TARGETS: Final = 16
MAX_STEPS: Final = 16
MIN_WINDOW_S: Final = 1.0
"""The shortest evaluation window: a shorter one judges too few requests, and one near zero
made every judged window a write to etcd."""
MAX_WINDOW_S: Final = 86_400.0
"""The longest evaluation window (a day): a rollout judged less often never ends."""
MAX_TTFT_RATIO: Final = 1_000.0
"""The loosest TTFT bound (the canary 1,000 times slower than the baseline): more is no bound."""
TTFT_BOUNDS_MS: Final = (
    5, 10, 20, 35, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 1500, 2500, 5000, 10000, 30000,
)  # fmt: skip
"""Upper bounds of the TTFT buckets frontends count in (one more bucket: above the last)."""

RolloutPhase = Literal["running", "promoted", "rolled_back"]
"""``running``: the policy judges each window; ``promoted``: all weight on the canary;
``rolled_back``: the alias's targets back as they were before it, with the reason and the
figures."""


class AliasTarget(msgspec.Struct, kw_only=True, frozen=True):
    """One version an alias sends a share of its requests to."""

    model: LoraName
    weight: Annotated[int, msgspec.Meta(ge=0, le=TOTAL_WEIGHT)]
    """Percent of the alias's requests, 0 to 100; an alias's weights sum to 100."""


Targets = Annotated[list[AliasTarget], msgspec.Meta(min_length=1, max_length=MAX_TARGETS)]
Step = Annotated[int, msgspec.Meta(ge=1, le=TOTAL_WEIGHT)]


class RolloutPolicy(msgspec.Struct, kw_only=True, frozen=True):
    """When a canary is rolled back or promoted, judged once per evaluation window.

    Examples::

        RolloutPolicy()                                   # 5% errors, p95 TTFT 1.5x, manual
        RolloutPolicy(steps=[10, 50, 100], window_s=60)   # promote step by step
        RolloutPolicy(max_error_rate=0.01, min_requests=200)
    """

    max_error_rate: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.05
    """Roll back when more than this share of the canary's requests in a window failed."""
    max_ttft_p95_ratio: Annotated[float, msgspec.Meta(gt=0, le=MAX_TTFT_RATIO)] = 1.5
    """Roll back when the canary's TTFT p95 exceeds the baseline's times this."""
    min_requests: Annotated[int, msgspec.Meta(ge=1, le=MAX_SAFE_INT)] = 20
    """A window with fewer canary requests is not judged (it counts as waiting)."""
    window_s: Annotated[float, msgspec.Meta(ge=MIN_WINDOW_S, le=MAX_WINDOW_S)] = 30.0
    steps: Annotated[list[Step], msgspec.Meta(max_length=MAX_STEPS)] = msgspec.field(
        default_factory=list
    )
    """Canary weights, rising to 100 (e.g. ``[10, 50, 100]``); each healthy window moves one
    step up. Empty: the canary keeps the rollout's ``weight`` until promoted by hand."""


class VersionFigures(msgspec.Struct, kw_only=True, frozen=True):
    """One version's figures over a judged window, summed over every frontend."""

    requests: int = 0
    errors: int = 0
    error_rate: float = 0.0
    ttft_p95_ms: float | None = None


class RolloutFigures(msgspec.Struct, kw_only=True, frozen=True):
    """What the last judged window measured, for the baseline and the canary."""

    window: int
    """Windows judged in this rollout, this one included."""
    frontends: int
    """Frontends whose reports were summed."""
    baseline: VersionFigures
    canary: VersionFigures


class Rollout(msgspec.Struct, kw_only=True, frozen=True):
    """A canary rollout of an alias: its policy, where it stands, and why."""

    baseline: LoraName
    canary: LoraName
    policy: RolloutPolicy
    weight: int
    """The canary's current weight."""
    phase: RolloutPhase = "running"
    window_started_at: float = 0.0
    """Unix time the current step's first window began; window ``k`` starts ``k`` windows later."""
    next_window: int = 0
    """The index (from ``window_started_at``) of the next window to judge."""
    windows: int = 0
    """Windows judged since the rollout began."""
    reason: str = ""
    figures: RolloutFigures | None = None
    before: list[AliasTarget] = msgspec.field(default_factory=list)
    """The alias's targets when the rollout began: while it runs, the targets other than
    the canary share ``100 - weight`` in these proportions, and a rollback restores them.
    Empty in records written before it existed: the baseline alone, as then."""


class Alias(msgspec.Struct, kw_only=True, frozen=True):
    """Desired state of one alias: its targets and, while it has one, its rollout."""

    name: LoraName
    targets: Targets
    rollout: Rollout | None = None


class AliasRequest(msgspec.Struct, kw_only=True, frozen=True):
    """Body of ``POST /v1/aliases``: set an alias's targets (ends a running rollout)."""

    name: LoraName
    targets: Targets


class RolloutRequest(msgspec.Struct, kw_only=True, frozen=True):
    """Body of ``POST /v1/rollouts``: send ``weight`` percent of ``alias`` to ``canary``.

    The alias's other targets keep their proportions in the rest. ``baseline`` (whose
    figures the canary's are judged against) defaults to the heaviest of them, and must be
    one of them; an alias that does not exist yet is created with ``baseline`` as its one
    target.
    """

    alias: LoraName
    canary: LoraName
    baseline: LoraName | None = None
    weight: Annotated[int, msgspec.Meta(ge=1, le=TOTAL_WEIGHT - 1)] | None = None
    """The canary's first weight, 1 to 99 (default: the first step, else 10)."""
    policy: RolloutPolicy = msgspec.field(default_factory=RolloutPolicy)


class PromoteRequest(msgspec.Struct, kw_only=True, frozen=True):
    """Body of ``POST /v1/rollouts/promote``: the next step now, or all weight with ``full``."""

    alias: LoraName
    full: bool = False


class RollbackRequest(msgspec.Struct, kw_only=True, frozen=True):
    """Body of ``POST /v1/rollouts/rollback``: the alias's targets back as they were."""

    alias: LoraName
    reason: Annotated[str, msgspec.Meta(max_length=512)] = "rolled back by hand"


class AliasList(msgspec.Struct, kw_only=True, frozen=True):
    """Answer of ``GET /v1/aliases``."""

    data: list[Alias]
    object: Literal["list"] = "list"


class AliasModelObject(ModelObject, kw_only=True, frozen=True):
    """An alias's entry in ``/v1/models``: its targets and rollout beside OpenAI's fields."""

    targets: list[AliasTarget] = msgspec.field(default_factory=list)
    rollout: Rollout | None = None


class VersionCounts(msgspec.Struct, kw_only=True):
    """One version's requests in a window at one frontend: TTFT by ``TTFT_BOUNDS_MS`` bucket."""

    requests: int = 0
    errors: int = 0
    ttft_buckets: list[int] = msgspec.field(default_factory=lambda: [0] * (len(TTFT_BOUNDS_MS) + 1))


class WindowReport(msgspec.Struct, kw_only=True, frozen=True):
    """One frontend's counts of one window of one alias's rollout."""

    alias: str
    window_started_at: float
    window: int
    versions: dict[str, VersionCounts]


_alias_decoder = msgspec.json.Decoder(Alias)


def decode_alias(raw: bytes) -> Alias:
    """Decode an alias record (raises msgspec errors on bad input)."""
    return _alias_decoder.decode(raw)


def encode_alias(alias: Alias) -> bytes:
    """Encode an alias record as indented JSON, readable through ``etcdctl``."""
    return msgspec.json.format(msgspec.json.encode(alias), indent=2)


def validate_alias_shape(name: str, targets: list[AliasTarget]) -> None:
    """Raise ``InvalidRequestError`` unless the weights are 0-100, sum to 100, and the targets
    are distinct and not the alias itself."""
    seen: set[str] = set()
    for target in targets:
        if target.model == name:
            raise InvalidRequestError(
                f"alias {name!r} points at itself; an alias's targets are adapters"
            )
        if target.model in seen:
            raise InvalidRequestError(f"alias {name!r} names target {target.model!r} twice")
        seen.add(target.model)
        if not 0 <= target.weight <= TOTAL_WEIGHT:
            raise InvalidRequestError(
                f"weight of {target.model!r} in alias {name!r} is {target.weight}; "
                f"use 0 to {TOTAL_WEIGHT}"
            )
    total = sum(target.weight for target in targets)
    if total != TOTAL_WEIGHT:
        raise InvalidRequestError(
            f"weights of alias {name!r} sum to {total}; they must sum to {TOTAL_WEIGHT}"
        )


def validate_policy(policy: RolloutPolicy) -> None:
    """Raise ``InvalidRequestError`` unless ``policy``'s steps rise to 100 (its numbers'
    ranges are ``Meta`` constraints, checked as it decodes)."""
    steps = policy.steps
    if steps and (steps != sorted(set(steps)) or steps[-1] != TOTAL_WEIGHT):
        raise InvalidRequestError(f"steps {steps} must rise strictly and end at 100")
