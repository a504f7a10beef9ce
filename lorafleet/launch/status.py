"""``lorafleet status``: the servers, worker instances, adapters and health at a glance.

Reads etcd for the instances and asks each process its ``/health``; changes nothing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import msgspec

from lorafleet.discovery.settings import EtcdSettings
from lorafleet.launch.admin import instances, load_records
from lorafleet.launch.table import print_table
from lorafleet.proto.adapters import ListLorasRequest, LoraListResponse
from lorafleet.proto.fleet_load import InstanceLoad

__all__ = ["print_status"]


def print_status(etcd: EtcdSettings, namespace: str, frontend_url: str, *, as_json: bool) -> int:
    """Print the cluster's state; 1 when a server or worker is not healthy."""
    loads = asyncio.run(load_records(etcd, namespace))
    workers: list[dict[str, Any]] = [  # JSON for --json: adapters is a list, the rest text
        {"instance": f"{i.instance_id:x}", "engine": i.engine, "url": i.system_url,
         "health": _health(i.system_url), "adapters": _adapters(i.system_url),
         "cache_hits": _hit_ratio(loads.get(i.instance_id))}
        for i in sorted(asyncio.run(instances(etcd, namespace)), key=lambda i: i.system_url)
    ]  # fmt: skip
    servers = [
        {"server": "etcd", "url": etcd.describe(), "health": "ok"},  # it answered the listing
        {"server": "frontend", "url": frontend_url, "health": _health(frontend_url)},
    ]
    if as_json:
        print(json.dumps({"namespace": namespace, "servers": servers, "workers": workers}))
    else:
        print_table(("SERVER", "URL", "HEALTH"), [_as_row(s) for s in servers])
        print()
        rows = [(w["instance"], w["engine"], w["url"], w["health"], w["cache_hits"],
                 ",".join(w["adapters"]) or "-") for w in workers]  # fmt: skip
        print_table(("INSTANCE", "ENGINE", "URL", "HEALTH", "CACHE HITS", "ADAPTERS"), rows)
    healthy = [entry["health"] == "ok" for entry in [*servers, *workers]]
    return 0 if all(healthy) else 1


def _hit_ratio(load: InstanceLoad | None) -> str:
    """The instance's prefix-cache hit ratio as a percentage; "-" without one."""
    ratio = None if load is None else load.prefix_cache_hit_ratio
    return "-" if ratio is None else f"{ratio:.0%}"


def _health(url: str) -> str:
    try:
        response = httpx.get(f"{url}/health", timeout=5)
    except httpx.HTTPError as exc:
        return f"unreachable ({type(exc).__name__})"
    return "ok" if response.status_code == 200 else f"HTTP {response.status_code}"


def _adapters(url: str) -> list[str]:
    try:
        response = httpx.post(f"{url}/engine/update/list_loras", timeout=10,
                              content=msgspec.json.encode(ListLorasRequest()),
                              headers={"Content-Type": "application/json"})  # fmt: skip
        return sorted(msgspec.json.decode(response.content, type=LoraListResponse).loras)
    except (httpx.HTTPError, msgspec.DecodeError, msgspec.ValidationError):
        return []


def _as_row(entry: dict[str, Any]) -> tuple[str, ...]:
    return tuple(str(value) for value in entry.values())
