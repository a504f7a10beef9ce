"""``lorafleet keys create|list|revoke`` and ``lorafleet tenants set|list|delete``: API keys
and tenants through a frontend's admin routes (``DYN_ADMIN_TOKEN``).

``keys create TENANT`` prints the new key once: the fleet stores only its sha256, so a
lost key is revoked and made again, never shown again.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Final
from urllib.parse import quote

import msgspec

from lorafleet.launch.admin import admin_request
from lorafleet.launch.table import print_table
from lorafleet.proto.tenants import ApiKeyRequest, Tenant

__all__ = [
    "KEY_ACTIONS",
    "TENANT_ACTIONS",
    "add_key_flags",
    "add_tenant_flags",
    "keys_command",
    "tenants_command",
]

KEY_ACTIONS: Final = ("create", "list", "revoke")
TENANT_ACTIONS: Final = ("set", "list", "delete")


def add_key_flags(keys: argparse.ArgumentParser) -> None:
    """The arguments of ``lorafleet keys``."""
    keys.add_argument("action", choices=KEY_ACTIONS, help="what to do")
    keys.add_argument(
        "name", nargs="?", metavar="TENANT|ID",
        help="create: the key's tenant; revoke: the key's id (keys list)",
    )  # fmt: skip
    keys.add_argument("--note", default="", help="create: a note shown by keys list")


def add_tenant_flags(tenants: argparse.ArgumentParser) -> None:
    """The arguments of ``lorafleet tenants``."""
    tenants.add_argument("action", choices=TENANT_ACTIONS, help="what to do")
    tenants.add_argument("name", nargs="?", help="set/delete: the tenant's name")
    tenants.add_argument("--model", action="append", default=[], metavar="PATTERN",
                         help="set: a model or adapter the tenant may use, fnmatch pattern "
                              "(repeatable; default: *)")  # fmt: skip
    limits = (
        ("--requests-per-s", float, "requests per second over the fleet"),
        ("--tokens-per-min", int, "prompt plus completion tokens per minute"),
        ("--max-concurrent", int, "requests running at once over the fleet"),
    )
    for flag, kind, what in limits:
        tenants.add_argument(flag, type=kind, default=0, help=f"set: {what} (0: no limit)")
    tenants.add_argument("--priority", type=int, default=0,
                         help="set: 0-9, higher first while the fleet is saturated")  # fmt: skip
    tenants.add_argument("--salt-cache", action="store_true",
                         help="set: salt the tenant's requests with its name, so that its "
                              "prompts share no prefix cache with other tenants'")  # fmt: skip


def keys_command(args: argparse.Namespace) -> int:
    """Run one ``keys`` action against ``args.frontend``; 0 on success."""
    if args.action == "list":
        return _call("GET", f"{args.frontend}/v1/keys", None, args.json, _print_keys)
    if not args.name:
        print(f"lorafleet keys {args.action} needs a "
              f"{'TENANT' if args.action == 'create' else 'key ID'}", file=sys.stderr)  # fmt: skip
        return 2
    if args.action == "revoke":
        url = f"{args.frontend}/v1/keys/{quote(args.name)}"
        return _call("DELETE", url, None, args.json, lambda _: print(f"revoked {args.name}"))
    body = msgspec.json.encode(ApiKeyRequest(tenant=args.name, note=args.note))
    return _call("POST", f"{args.frontend}/v1/keys", body, args.json, _print_new_key)


def tenants_command(args: argparse.Namespace) -> int:
    """Run one ``tenants`` action against ``args.frontend``; 0 on success."""
    if args.action == "list":
        return _call("GET", f"{args.frontend}/v1/tenants", None, args.json,
                     lambda answer: _print_tenants(answer["data"]))  # fmt: skip
    if not args.name:
        print(f"lorafleet tenants {args.action} needs a NAME", file=sys.stderr)
        return 2
    if args.action == "delete":
        url = f"{args.frontend}/v1/tenants/{quote(args.name)}"
        return _call("DELETE", url, None, args.json, lambda _: print(f"deleted {args.name}"))
    tenant = Tenant(
        name=args.name, models=args.model or ["*"], requests_per_s=args.requests_per_s,
        tokens_per_min=args.tokens_per_min, max_concurrent=args.max_concurrent,
        priority=args.priority, salt_cache=args.salt_cache,
    )  # fmt: skip
    body = msgspec.json.encode(tenant)
    return _call("POST", f"{args.frontend}/v1/tenants", body, args.json,
                 lambda answer: _print_tenants([answer]))  # fmt: skip


def _call(method: str, url: str, body: bytes | None, as_json: bool, show: Any) -> int:
    """Send one admin request; print the error, the JSON, or ``show(answer)``."""
    return admin_request(method, url, body, show=None if as_json else show)


def _print_new_key(answer: dict[str, Any]) -> None:
    print(answer["key"])
    print(f"# id {answer['id']}, tenant {answer['tenant']}: shown once, store it now",
          file=sys.stderr)  # fmt: skip


def _print_keys(answer: dict[str, Any]) -> None:
    rows = [(k["id"], k["tenant"], k["created"], k.get("note") or "-") for k in answer["data"]]
    print_table(("ID", "TENANT", "CREATED", "NOTE"), rows)


def _print_tenants(tenants: list[dict[str, Any]]) -> None:
    rows = [
        (t["name"], ",".join(t["models"]), t["requests_per_s"] or "-",
         t["tokens_per_min"] or "-", t["max_concurrent"] or "-", t["priority"])
        for t in tenants
    ]  # fmt: skip
    print_table(("TENANT", "MODELS", "REQ/S", "TOKENS/MIN", "CONCURRENT", "PRIORITY"), rows)
