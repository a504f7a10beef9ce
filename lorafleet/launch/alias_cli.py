"""``lorafleet lora alias|rollout|promote|rollback|status``: aliases and canaries via a frontend.

``alias NAME MODEL=WEIGHT...`` sets an alias's targets; ``rollout ALIAS CANARY`` starts a
canary under a policy (``--steps 10,50,100`` promotes it step by step); ``promote`` and
``rollback`` move it by hand; ``status [ALIAS]`` shows each alias, its weights and its
rollout's phase, reason and last window's figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Final
from urllib.parse import quote

import httpx
import msgspec

from lorafleet.launch.admin import admin_request
from lorafleet.launch.fleet_status import admin_token_header
from lorafleet.launch.table import print_table
from lorafleet.proto.aliases import (
    AliasRequest,
    AliasTarget,
    PromoteRequest,
    RollbackRequest,
    RolloutPolicy,
    RolloutRequest,
)

__all__ = ["ALIAS_ACTIONS", "add_alias_flags", "alias_command"]

ALIAS_ACTIONS: Final = ("alias", "rollout", "promote", "rollback", "status")
_DEFAULTS: Final = RolloutPolicy()


def add_alias_flags(lora: argparse.ArgumentParser) -> None:
    """The alias and rollout flags of ``lorafleet lora``."""
    lora.add_argument(
        "more",
        nargs="*",
        metavar="MODEL=WEIGHT",
        help="alias: further targets after the first (NAME MODEL=WEIGHT ...)",
    )
    lora.add_argument(
        "--baseline",
        help="rollout: the version the canary is judged against, one of the alias's targets "
        "(default: its heaviest target but the canary)",
    )
    lora.add_argument("--weight", type=int, help="rollout: the canary's first weight, 1-99")
    lora.add_argument(
        "--steps",
        type=_steps,
        default=[],
        help="rollout: canary weights to promote through, e.g. 10,50,100",
    )
    lora.add_argument(
        "--max-error-rate",
        type=float,
        default=_DEFAULTS.max_error_rate,
        help="rollout: roll back above this share of failed canary requests",
    )
    lora.add_argument(
        "--max-ttft-p95-ratio",
        type=float,
        default=_DEFAULTS.max_ttft_p95_ratio,
        help="rollout: roll back when the canary's TTFT p95 exceeds the baseline's times this",
    )
    lora.add_argument(
        "--min-requests",
        type=int,
        default=_DEFAULTS.min_requests,
        help="rollout: canary requests a window needs to be judged",
    )
    lora.add_argument(
        "--window-s", type=float, default=_DEFAULTS.window_s, help="rollout: the evaluation window"
    )
    lora.add_argument("--full", action="store_true", help="promote: all weight to the canary")
    lora.add_argument("--reason", default="rolled back by hand", help="rollback: why")


def _steps(value: str) -> list[int]:
    try:
        return [int(step) for step in value.split(",") if step]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a list like 10,50,100") from None


def alias_command(args: argparse.Namespace) -> int:
    """Run one alias action against ``args.frontend``; print the answer; 0 on success."""
    if args.action == "status":
        return _status(args.frontend, args.name, as_json=args.json)
    if not args.name or (args.action in ("alias", "rollout") and not args.uri):
        wanted = {"alias": "NAME MODEL=WEIGHT ...", "rollout": "ALIAS CANARY"}
        print(
            f"lorafleet lora {args.action} needs {wanted.get(args.action, 'an ALIAS')} "
            "(lorafleet lora --help)",
            file=sys.stderr,
        )
        return 2
    path, body = _request(args)
    show = None if args.json else lambda answer: _print_aliases([answer])
    return admin_request("POST", f"{args.frontend}{path}", msgspec.json.encode(body), show=show)


def _request(args: argparse.Namespace) -> tuple[str, msgspec.Struct]:
    if args.action == "alias":
        targets = [_target(text) for text in (args.uri, *args.more)]
        return "/v1/aliases", AliasRequest(name=args.name, targets=targets)
    if args.action == "rollout":
        policy = RolloutPolicy(
            max_error_rate=args.max_error_rate,
            max_ttft_p95_ratio=args.max_ttft_p95_ratio,
            min_requests=args.min_requests,
            window_s=args.window_s,
            steps=args.steps,
        )
        return "/v1/rollouts", RolloutRequest(
            alias=args.name,
            canary=args.uri,
            baseline=args.baseline,
            weight=args.weight,
            policy=policy,
        )
    if args.action == "promote":
        return "/v1/rollouts/promote", PromoteRequest(alias=args.name, full=args.full)
    return "/v1/rollouts/rollback", RollbackRequest(alias=args.name, reason=args.reason)


def _target(text: str) -> AliasTarget:
    model, _, weight = text.rpartition("=")
    if not model or not weight.lstrip("-").isdigit():
        raise ValueError(f"target {text!r} must look like MODEL=WEIGHT, e.g. bot-v1=90")
    return AliasTarget(model=model, weight=int(weight))


def _status(frontend: str, name: str | None, *, as_json: bool) -> int:
    url = f"{frontend}/v1/aliases" + (f"/{quote(name)}" if name else "")
    try:
        response = httpx.get(url, headers=admin_token_header(), timeout=10)
        answer: Any = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        print(f"cannot read aliases at {url}: {exc}")
        return 1
    if not response.is_success or as_json:
        print(json.dumps(answer))
        return 0 if response.is_success else 1
    _print_aliases(answer["data"] if name is None else [answer])
    return 0


def _print_aliases(aliases: list[dict[str, Any]]) -> None:
    rows = []
    for alias in aliases:
        targets = ", ".join(f"{t['model']}:{t['weight']}" for t in alias["targets"])
        rollout = alias.get("rollout") or {}
        phase = rollout.get("phase", "-")
        figures = rollout.get("figures") or {}
        canary = figures.get("canary") or {}
        seen = f"{canary.get('errors', 0)}/{canary.get('requests', 0)}" if figures else "-"
        rows.append((alias["name"], targets, phase, seen, rollout.get("reason", "") or "-"))
    print_table(("ALIAS", "TARGETS", "ROLLOUT", "CANARY ERR/REQ", "REASON"), rows)
