"""``python -m lorafleet.frontend``: run the OpenAI-compatible frontend with uvicorn.

Every flag has an environment variable (``DYN_HTTP_PORT``, ``DYN_NAMESPACE``,
``ETCD_ENDPOINTS``, ``NATS_SERVER``, ...) so containers configure it without
a command line (``lorafleet/frontend/config.py`` declares them). The admin token comes only from
``DYN_ADMIN_TOKEN`` or the file ``DYN_ADMIN_TOKEN_FILE`` names, the workers' token only
from ``DYN_SYSTEM_AUTH_TOKEN`` or its ``_FILE`` (never flags: command lines are visible to
every user of the machine).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import uvicorn
from litestar import Litestar

from lorafleet.frontend.app import create_app
from lorafleet.frontend.config import FrontendConfig
from lorafleet.frontend.errors import framing_error_body
from lorafleet.process.cli_help import HelpFormatter, add_version
from lorafleet.process.header_timeout import with_header_timeout
from lorafleet.process.logs import configure_logging
from lorafleet.process.parent_death import watch_parent
from lorafleet.process.settings_cli import add_settings, parse_settings, settings_from_args
from lorafleet.process.uvicorn_server import UvicornServer

__all__ = ["build_parser", "config_from_args", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The frontend's command line: one flag per setting that has one."""
    parser = argparse.ArgumentParser(
        prog="lorafleet frontend", formatter_class=HelpFormatter,
        description="Run the OpenAI-compatible frontend. Every flag has an environment variable.",
    )  # fmt: skip
    add_version(parser)
    add_settings(parser, FrontendConfig)
    return parser


def config_from_args(args: argparse.Namespace) -> FrontendConfig:
    """A validated config from parsed flags (raises ValueError naming the bad one)."""
    return settings_from_args(FrontendConfig, args)


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
    watch_parent()  # where the kernel cannot end us with our parent (process.parent_death)
    config = parse_settings(build_parser(), FrontendConfig, argv)
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
