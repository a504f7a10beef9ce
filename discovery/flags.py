"""One way to declare a command-line flag that an environment variable can also set.

The worker and the frontend run in containers configured by environment, and by hand with
flags; every flag of theirs has a variable. ``env_option`` states the pair once: the flag, its
variable, its default and its help, which names the variable. ``add_connection_flags`` holds
the flags both processes share (namespace, etcd, NATS, start-up and header timeouts), and
``connection_args`` reads them back.

An empty variable counts as unset. A variable's text is parsed as the flag's would be, and a
bad value stops the process with one usage line naming the variable, never a traceback.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Collection
from typing import Any, Final, TypedDict

from lorafleet.discovery.header_timeout import DEFAULT_HEADER_TIMEOUT_S
from lorafleet.discovery.keys import DEFAULT_NAMESPACE
from lorafleet.discovery.nats_settings import DEFAULT_NATS_SERVER
from lorafleet.discovery.settings import DEFAULT_ETCD_ENDPOINTS, EtcdSettings
from lorafleet.discovery.startup import DEFAULT_CONNECT_TIMEOUT_S

__all__ = [
    "ConnectionArgs",
    "FlagSpec",
    "add_connection_flags",
    "add_env_options",
    "connection_args",
    "env_flag",
    "env_option",
]

_TRUE: Final = {"1", "true", "yes", "on"}

FlagSpec = tuple[str, str, Any, Callable[[str], Any], str]
"""One row of a table of flags: (flag, variable, default, parser of its text, help)."""


def env_flag(name: str, default: bool = False) -> bool:
    """Read a boolean environment variable (``1``/``true``/``yes``/``on``)."""
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in _TRUE


def env_option(
    parser: argparse.ArgumentParser,
    flag: str,
    variable: str,
    default: Any = None,
    help: str = "",
    *,
    parse: Callable[[str], Any] = str,
    **extra: Any,
) -> None:
    """Add ``flag``, whose default is ``$variable`` when set, else ``default``.

    Examples::

        env_option(p, "--system-port", "DYN_SYSTEM_PORT", 9345, "status port", parse=int)
        env_option(p, "--router", "DYN_ROUTER_MODE", "round-robin", choices=["kv", ...])
    """
    named = f"env {variable}"
    raw = os.environ.get(variable)
    if raw:  # parsed here, so that a bad value's error names the variable
        default = _from_env(parser, flag, variable, raw, parse, extra.get("choices"))
    parser.add_argument(
        flag, type=parse, default=default, help=f"{help} ({named})" if help else named, **extra
    )


def _from_env(
    parser: argparse.ArgumentParser,
    flag: str,
    variable: str,
    raw: str,
    parse: Callable[[str], Any],
    choices: Collection[Any] | None,
) -> Any:
    try:
        value = parse(raw)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        parser.error(f"{variable}={raw!r} is not a valid {flag}: {exc}")
    if choices is not None and value not in choices:
        parser.error(f"{variable}={raw!r} is not a valid {flag}: choose from {sorted(choices)}")
    return value


def add_env_options(parser: argparse.ArgumentParser, specs: tuple[FlagSpec, ...]) -> None:
    """``env_option`` for each row of ``specs``, in order."""
    for flag, variable, default, parse, text in specs:
        env_option(parser, flag, variable, default, text, parse=parse)


class ConnectionArgs(TypedDict):
    """What ``add_connection_flags`` parsed, as the config fields of the same names."""

    namespace: str
    etcd: EtcdSettings
    nats_server: str
    connect_timeout_s: float
    header_timeout_s: float


def connection_args(args: argparse.Namespace) -> ConnectionArgs:
    """The connection fields of a config from parsed flags (``ETCD_AUTH_*`` and TLS from the
    environment), e.g. ``FrontendConfig(**connection_args(args), router=...)``."""
    return ConnectionArgs(
        namespace=args.namespace,
        etcd=EtcdSettings.from_env(endpoints=args.etcd_endpoints),
        nats_server=args.nats_server,
        connect_timeout_s=args.connect_timeout_s,
        header_timeout_s=args.header_timeout_s,
    )


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every process that joins a fleet has: where etcd and NATS are, and how long
    start-up waits for them (``--namespace``, ``--etcd-endpoints``, ``--nats-server``,
    ``--connect-timeout-s``, ``--header-timeout-s``)."""
    env_option(parser, "--namespace", "DYN_NAMESPACE", DEFAULT_NAMESPACE,
               "the fleet's namespace in etcd and NATS")  # fmt: skip
    env_option(parser, "--etcd-endpoints", "ETCD_ENDPOINTS", DEFAULT_ETCD_ENDPOINTS,
               "comma-separated etcd URLs")  # fmt: skip
    env_option(parser, "--nats-server", "NATS_SERVER", DEFAULT_NATS_SERVER,
               "comma-separated NATS URLs")  # fmt: skip
    env_option(parser, "--connect-timeout-s", "DYN_CONNECT_TIMEOUT_S", DEFAULT_CONNECT_TIMEOUT_S,
               "start-up wait for etcd and NATS each, then exit 1", parse=float)  # fmt: skip
    env_option(parser, "--header-timeout-s", "DYN_HEADER_TIMEOUT_S", DEFAULT_HEADER_TIMEOUT_S,
               "close connections with no request head by then", parse=float)  # fmt: skip
