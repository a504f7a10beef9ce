"""The flags every process that joins a fleet shares: where etcd and NATS are, and how long
start-up waits for them. ``add_connection_flags`` declares them, ``connection_args`` reads them
back into the config fields of the same names."""

from __future__ import annotations

import argparse
from typing import TypedDict

from lorafleet.discovery.keys import DEFAULT_NAMESPACE
from lorafleet.discovery.nats_settings import DEFAULT_NATS_SERVER
from lorafleet.discovery.settings import DEFAULT_ETCD_ENDPOINTS, EtcdSettings
from lorafleet.discovery.startup import DEFAULT_CONNECT_TIMEOUT_S
from lorafleet.process.flags import env_option
from lorafleet.process.header_timeout import DEFAULT_HEADER_TIMEOUT_S

__all__ = ["ConnectionArgs", "add_connection_flags", "connection_args"]


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
