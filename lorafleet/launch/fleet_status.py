"""The fleet's adapters as a frontend's ``/v1/adapters`` shows them: a table, a wait, a line.

``lorafleet lora list`` prints the table after the workers' own: every adapter,
declared or loaded straight onto workers (``unmanaged``, ``evicted``), with its
content digest; ``lorafleet lora apply`` waits here until the adapter leaves
``pending``/``loading`` and prints where it ended. Reads only; they send ``DYN_ADMIN_TOKEN``
when it is set, since once tenants exist the frontend shows the fleet only to the admin
token or an API key (docs/tenants.md). The states are in docs/fleet.md.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Final
from urllib.parse import quote

import httpx

from lorafleet.launch.table import print_table
from lorafleet.process.auth import bearer_header

__all__ = [
    "DEFAULT_APPLY_WAIT_S",
    "admin_token_header",
    "describe",
    "print_fleet",
    "settled_status",
]

DEFAULT_APPLY_WAIT_S: Final = 10.0
POLL_INTERVAL_S: Final = 0.2
"""How often ``lora apply`` asks again while the adapter is pending or loading."""
UNSETTLED: Final = frozenset({"pending", "loading"})
READ_TIMEOUT_S: Final = 10.0
DIGEST_HEX_SHOWN: Final = 12
"""Hex digits of an adapter's digest in the table (``--json`` has all of them)."""


def admin_token_header() -> dict[str, str]:
    """``Authorization: Bearer $DYN_ADMIN_TOKEN``, or nothing when it is not set."""
    return bearer_header(os.environ.get("DYN_ADMIN_TOKEN")) or {}


def settled_status(frontend_url: str, status: dict[str, Any], wait_s: float) -> dict[str, Any]:
    """``status`` asked again until its state is neither pending nor loading, or ``wait_s``."""
    deadline = time.monotonic() + wait_s
    url = f"{frontend_url}/v1/adapters/{quote(status['name'])}"
    while status.get("state") in UNSETTLED and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)  # a CLI polling a frontend: no event to wait for
        response = httpx.get(url, headers=admin_token_header(), timeout=READ_TIMEOUT_S)
        if not response.is_success:
            break
        status = response.json()
    return status


def describe(status: dict[str, Any], wait_s: float = DEFAULT_APPLY_WAIT_S) -> str:
    """One line for people: where the adapter is, or why it is not."""
    name, state = status["name"], status.get("state", "pending")
    if state == "placed":
        return f"{name}: placed on {', '.join(status['instances'])}"
    if state == "failed":
        error = status["error"]
        return (
            f"{name}: failed on instance {error['instance']} at {error['at']}: "
            f"{error['code']}: {error['message']}"
        )
    if state == "cold":
        return f"{name}: cold: loaded on its first request (min_replicas 0)"
    if state == "unplaceable":
        return f"{name}: unplaceable: {status['unplaceable']}"
    where = f" on {', '.join(status['loading'])}" if status.get("loading") else ""
    warnings = "".join(f"; {warning}" for warning in status.get("warnings", []))
    return f"{name}: still {state}{where} after {wait_s:g} s{warnings}"


def print_fleet(frontend_url: str, *, as_json: bool) -> None:
    """Print the desired adapters' table (or JSON lines); a note on stderr if unreachable."""
    try:
        response = httpx.get(
            f"{frontend_url}/v1/adapters", headers=admin_token_header(), timeout=READ_TIMEOUT_S
        )
        response.raise_for_status()
    except httpx.HTTPError as exc:
        print(f"fleet adapters: frontend {frontend_url} not reachable: {exc}", file=sys.stderr)
        return
    adapters = response.json()["data"]
    if as_json:
        for status in adapters:
            print(json.dumps({"adapter": status["name"], **status}))
        return
    if not adapters:
        return
    print()
    print_table(("ADAPTER", "STATE", "MIN", "MAX", "INSTANCES", "DEMAND/S", "DIGEST", "DETAIL"),
                [_row(status) for status in adapters])  # fmt: skip


def _row(status: dict[str, Any]) -> tuple[str, ...]:
    return (
        status["name"], status.get("state", "-"), str(status.get("min_replicas")),
        str(status.get("max_replicas")), ",".join(status.get("instances", [])) or "-",
        f"{status.get('demand', 0.0):g}", _short(status.get("digest", "")), _detail(status),
    )  # fmt: skip


def _short(digest: str) -> str:
    """``sha256:`` and the first ``DIGEST_HEX_SHOWN`` hex digits, as image digests are shown."""
    scheme, _, hexdigits = digest.partition(":")
    return f"{scheme}:{hexdigits[:DIGEST_HEX_SHOWN]}" if hexdigits else "-"


def _detail(status: dict[str, Any]) -> str:
    """Why no instance can take it, the failed load's error, when and why placement evicted
    an unmanaged adapter, or the copies its latency targets added and why."""
    error, evicted, slo = status.get("error"), status.get("evicted"), status.get("attainment")
    if status.get("unplaceable"):
        return str(status["unplaceable"])
    if error:
        return f"{error['code']}: {error['message']}"
    if evicted:
        why = f": {evicted['reason']}" if evicted.get("reason") else ""
        return f"evicted from {evicted['instance']} at {evicted['at']}{why}"
    if slo and slo.get("copies"):
        return f"slo copies {slo['copies']}: {slo['reason']}"
    return "-"
