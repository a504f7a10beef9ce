"""What every lorafleet process needs besides its planes: flags, logs, CLI help, build info,
pid checks, uvicorn protocols, the retry backoff and the bearer-token rule.

Imports no other lorafleet package, so that every other package may import it."""

from lorafleet.process.auth import (
    AUTHORIZATION_HEADER,
    bearer_header,
    bearer_token_accepted,
)
from lorafleet.process.backoff import (
    backoff_s,
)
from lorafleet.process.build_info import (
    lorafleet_version,
    python_version,
)
from lorafleet.process.cli_help import (
    HelpFormatter,
    add_version,
)
from lorafleet.process.flags import (
    FlagSpec,
    add_env_options,
    env_flag,
    env_option,
)
from lorafleet.process.header_timeout import (
    DEFAULT_HEADER_TIMEOUT_S,
    BadRequestBody,
    HeaderTimeoutProtocol,
    with_header_timeout,
)
from lorafleet.process.logs import (
    configure_logging,
    console_renderer,
)
from lorafleet.process.pids import (
    pid_alive,
)
from lorafleet.process.response_head import (
    HeadWithBodyProtocol,
)
from lorafleet.process.uvicorn_server import (
    UvicornServer,
)

__all__ = [
    "AUTHORIZATION_HEADER",
    "BadRequestBody",
    "DEFAULT_HEADER_TIMEOUT_S",
    "FlagSpec",
    "HeadWithBodyProtocol",
    "HeaderTimeoutProtocol",
    "HelpFormatter",
    "UvicornServer",
    "add_env_options",
    "add_version",
    "backoff_s",
    "bearer_header",
    "bearer_token_accepted",
    "configure_logging",
    "console_renderer",
    "env_flag",
    "env_option",
    "lorafleet_version",
    "pid_alive",
    "python_version",
    "with_header_timeout",
]
