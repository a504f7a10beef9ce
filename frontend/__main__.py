"""``python -m lorafleet.frontend``: run the OpenAI-compatible frontend with uvicorn.

Every flag has an environment variable (``DYN_HTTP_PORT``, ``DYN_NAMESPACE``,
``ETCD_ENDPOINTS``, ``NATS_SERVER``, ...) so containers configure it without
a command line. The admin token comes only from ``DYN_ADMIN_TOKEN``, the
workers' token only from ``DYN_SYSTEM_AUTH_TOKEN`` (never flags: command lines
are visible to every user of the machine).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Final

import uvicorn
from litestar import Litestar

from lorafleet.discovery.connection_flags import add_connection_flags, connection_args
from lorafleet.frontend.app import create_app
from lorafleet.frontend.config import (
    DEFAULT_HTTP_PORT,
    DEFAULT_ON_DEMAND_TIMEOUT_S,
    DEFAULT_SHUTDOWN_GRACE_S,
    FrontendConfig,
)
from lorafleet.frontend.dispatcher import DispatchSettings
from lorafleet.frontend.errors import framing_error_body
from lorafleet.frontend.on_demand import DEFAULT_ON_DEMAND_QUEUE
from lorafleet.frontend.request_body import DEFAULT_BODY_TIMEOUT_S
from lorafleet.frontend.router import ROUTERS
from lorafleet.process.cli_help import HelpFormatter, add_version
from lorafleet.process.flags import FlagSpec, add_env_options, env_option
from lorafleet.process.header_timeout import with_header_timeout
from lorafleet.process.logs import configure_logging
from lorafleet.process.uvicorn_server import UvicornServer

__all__ = ["build_parser", "config_from_args", "main"]


_FLAGS: Final[tuple[FlagSpec, ...]] = (
    ("--http-host", "DYN_HTTP_HOST", "0.0.0.0", str, ""),
    ("--http-port", "DYN_HTTP_PORT", DEFAULT_HTTP_PORT, int, ""),
    ("--stall-timeout-s", "DYN_STALL_TIMEOUT_S", 1.0, float,
     "silence after which a worker is pinged"),
    ("--max-attempts", "DYN_MAX_ATTEMPTS", 3, int, "instances tried per request"),
    ("--migration-limit", "DYN_MIGRATION_LIMIT", 3, int,
     "times one stream may continue on another instance when its own is lost; 0: never"),
    ("--on-demand-timeout-s", "DYN_ON_DEMAND_TIMEOUT_S", DEFAULT_ON_DEMAND_TIMEOUT_S, float,
     "how long a request for a cold adapter waits for its load"),
    ("--on-demand-queue", "DYN_ON_DEMAND_QUEUE", DEFAULT_ON_DEMAND_QUEUE, int,
     "requests that may wait for one adapter's on-demand load; 429 beyond"),
    ("--shutdown-grace", "DYN_SHUTDOWN_GRACE", DEFAULT_SHUTDOWN_GRACE_S, float,
     "on SIGTERM, cancel requests still running after this"),
    ("--body-timeout-s", "DYN_BODY_TIMEOUT_S", DEFAULT_BODY_TIMEOUT_S, float,
     "answer 408 to a request whose body has not all arrived this long after its head"),
)  # fmt: skip
"""The frontend's own flags; ``add_connection_flags`` adds those it shares with workers."""


def build_parser() -> argparse.ArgumentParser:
    """The frontend's flags; each defaults to its environment variable."""
    parser = argparse.ArgumentParser(
        prog="lorafleet frontend", formatter_class=HelpFormatter,
        description="Run the OpenAI-compatible frontend. Every flag has an environment variable.",
    )  # fmt: skip
    add_version(parser)
    add_connection_flags(parser)
    add_env_options(parser, _FLAGS)
    env_option(parser, "--router", "DYN_ROUTER_MODE", "round-robin", choices=sorted(ROUTERS))
    return parser


def config_from_args(args: argparse.Namespace) -> FrontendConfig:
    """A validated config from parsed flags (raises ValueError naming the bad one)."""
    return FrontendConfig(
        **connection_args(args),
        router=args.router,
        http_host=args.http_host,
        http_port=args.http_port,
        dispatch=DispatchSettings(
            stall_s=args.stall_timeout_s,
            max_attempts=args.max_attempts,
            migration_limit=args.migration_limit,
        ),
        on_demand_timeout_s=args.on_demand_timeout_s,
        on_demand_queue=args.on_demand_queue,
        shutdown_grace_s=args.shutdown_grace,
        body_timeout_s=args.body_timeout_s,
        admin_token=os.environ.get("DYN_ADMIN_TOKEN") or None,
        worker_token=os.environ.get("DYN_SYSTEM_AUTH_TOKEN") or None,
    )


class _ExplainedStartupFailure(logging.Filter):
    """Drops uvicorn's copy of the traceback of a start-up failure that the lifespan
    already logged as one line saying what to do (``frontend cannot start``)."""

    def __init__(self, app: Litestar) -> None:
        super().__init__()
        self._app = app

    def filter(self, record: logging.LogRecord) -> bool:
        explained = getattr(self._app.state, "startup_error", None) is not None
        return not (explained and "Traceback (most recent call last)" in record.getMessage())


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, configure logging and serve until SIGTERM/SIGINT."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    configure_logging(process="frontend")
    app = create_app(config)
    logging.getLogger("uvicorn.error").addFilter(_ExplainedStartupFailure(app))
    server = UvicornServer(
        uvicorn.Config(
            app, host=config.http_host, port=config.http_port, loop="uvloop",
            http=with_header_timeout(config.header_timeout_s, framing_error_body),
            lifespan="on", access_log=False, log_config=None, server_header=False,
            # uvicorn types it int, yet hands it to asyncio.wait_for: fractions work.
            timeout_graceful_shutdown=config.shutdown_grace_s,  # type: ignore[arg-type]
        ),
        on_signal=app.state.stopping.set,
    )  # fmt: skip
    try:
        server.run()
    except SystemExit:  # uvicorn's way of saying the lifespan failed
        return 1
    fatal = getattr(app.state, "fatal_error", None)  # set when NATS is lost for good
    return 0 if server.started and fatal is None else 1


if __name__ == "__main__":
    sys.exit(main())
