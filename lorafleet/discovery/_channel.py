"""Build the gRPC channel to etcd's members: one target for all, TLS, a capped reconnect,
keepalive pings that leave a stalled member.

Must not hold etcd logic: ``client.py`` owns calls and errors, this module only says
where the members are and how to reach them.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeAlias

import grpc

from lorafleet.discovery._auth import TokenInterceptor
from lorafleet.discovery.settings import EtcdSettings

__all__ = [
    "ChannelPlan",
    "KEEPALIVE_TIMEOUT_MS",
    "KEEPALIVE_TIME_MS",
    "MAX_RECONNECT_BACKOFF_MS",
    "Resolver",
    "needs_resolving",
    "open_channel",
    "plan_channel",
    "resolve_host",
]

MAX_RECONNECT_BACKOFF_MS: Final = 500
"""gRPC's reconnect backoff grows to 120 s by default: after a 90 s outage the lease
keep-alive came back only after the TTL and the cards were gone. Capped, a channel
reconnects within this long of etcd's return."""

KEEPALIVE_TIME_MS: Final = 5000
"""Ping etcd over a quiet connection this often: a member that stalls (SIGSTOP, a hung
host, a one-way partition) keeps its TCP connection open, and a watch on it would wait
silently for ever. 5 s is the least etcd accepts by default
(``--grpc-keepalive-min-time``); quicker pings get the connection closed as abusive.
gRPC sends them only while nothing else is written: a client that keeps calling is
moved off a stalled member by ``EtcdClient`` instead (a call that times out). Only while a
call is open (a watch, the lease's keep-alive stream, a call waiting): etcd refuses pings
on a connection without one (``PermitWithoutStream`` is off) and closes it with
``GOAWAY too_many_pings``; a connection with nothing open has nothing to wait for."""
KEEPALIVE_TIMEOUT_MS: Final = 1000
"""A ping unanswered this long closes the connection. gRPC's C core now reads this from
``grpc.http2.ping_timeout_ms`` (default 60 s), so both are set: with the keepalive
option alone a watch over a stalled link was never found out."""

_CHANNEL_OPTIONS: Final = {
    # Each client its own connections: gRPC otherwise shares them process-wide, and a new
    # client would inherit another's reconnect backoff and fail at once after a restart.
    "grpc.use_local_subchannel_pool": 1,
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": MAX_RECONNECT_BACKOFF_MS,
    "grpc.keepalive_time_ms": KEEPALIVE_TIME_MS,
    "grpc.keepalive_timeout_ms": KEEPALIVE_TIMEOUT_MS,
    "grpc.http2.ping_timeout_ms": KEEPALIVE_TIMEOUT_MS,
    "grpc.keepalive_permit_without_calls": 0,
    "grpc.http2.max_pings_without_data": 0,
}

Resolver: TypeAlias = Callable[[str, int], list[str]]
"""``resolve(host, port)``: the ``ip:port`` addresses of a member's host name (DNS)."""


@dataclass(frozen=True)
class ChannelPlan:
    """Where a channel goes: its gRPC target and options. Equal plans, same members."""

    target: str
    options: dict[str, Any] = field(default_factory=dict)


def resolve_host(host: str, port: int) -> list[str]:
    """Resolve ``host`` through the system's resolver (an IP literal stays as it is)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return list(dict.fromkeys(_address(str(info[4][0]), port) for info in infos))
    return [_address(str(ip), port)]


def needs_resolving(settings: EtcdSettings) -> bool:
    """Whether the plan depends on DNS: a list of members with a host name among them."""
    if len(settings.endpoints) == 1:
        return False  # gRPC resolves a lone name itself, again after every failure
    return any(not _is_ip(host) for host, _ in settings.host_ports)


def plan_channel(
    settings: EtcdSettings, resolve: Resolver = resolve_host, *, first: int = 0
) -> ChannelPlan:
    """One target for all members: gRPC's pick_first fails over between them.

    A list with DNS names is resolved here (gRPC's static address lists take IP
    addresses only); a name that does not resolve now is left out, as long as one does.
    The addresses start at the ``first``-th (modulo their number): pick_first keeps to a
    member that accepts connections but never answers, so the client moves the start on.
    TLS checks every member's certificate against the first endpoint's host name.
    """
    pairs = settings.host_ports
    if len(pairs) == 1:
        host, port = pairs[0]
        return ChannelPlan(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    addresses = _resolve_all(settings, resolve)
    start = first % len(addresses)
    addresses = addresses[start:] + addresses[:start]
    ipv6 = [address for address in addresses if address.startswith("[")]
    if ipv6 and len(ipv6) != len(addresses):
        raise ValueError(f"ETCD_ENDPOINTS {settings.describe()} mix IPv4 and IPv6 members")
    options = {"grpc.default_authority": pairs[0][0]}
    if settings.tls:
        options["grpc.ssl_target_name_override"] = pairs[0][0]
    return ChannelPlan(("ipv6:" if ipv6 else "ipv4:") + ",".join(addresses), options)


def open_channel(
    settings: EtcdSettings, plan: ChannelPlan, tokens: TokenInterceptor | None
) -> grpc.aio.Channel:
    """Open the planned channel (TLS for ``https://``, the token interceptor with a user)."""
    interceptors = tokens.interceptors() if tokens is not None else None
    options = list({**_CHANNEL_OPTIONS, **plan.options}.items())
    if not settings.tls:
        return grpc.aio.insecure_channel(plan.target, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(
        plan.target, _tls_credentials(settings), options=options, interceptors=interceptors
    )


def _resolve_all(settings: EtcdSettings, resolve: Resolver) -> list[str]:
    addresses: list[str] = []
    failures = []
    for host, port in settings.host_ports:
        try:
            addresses += resolve(host, port)
        except OSError as exc:
            failures.append(f"{host}: {exc}")
    if not addresses:
        raise OSError(f"no ETCD_ENDPOINTS member resolves ({'; '.join(failures)})")
    return list(dict.fromkeys(addresses))


def _tls_credentials(settings: EtcdSettings) -> grpc.ChannelCredentials:
    def read(path: Path | None) -> bytes | None:
        return path.read_bytes() if path is not None else None

    return grpc.ssl_channel_credentials(
        root_certificates=read(settings.ca_path),
        private_key=read(settings.client_key_path),
        certificate_chain=read(settings.client_cert_path),
    )


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
