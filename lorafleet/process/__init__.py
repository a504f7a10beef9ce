"""What every lorafleet process needs besides its planes: settings (declared once, with
flags and variables), logs, CLI help, build info, pid checks, uvicorn protocols, the retry
backoff, the bearer-token rule and stopping background tasks.

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
from lorafleet.process.parent_death import (
    PARENT_PID_VARIABLE,
    die_with_parent,
    parent_pid_env,
    watch_parent,
)
from lorafleet.process.pids import (
    pid_alive,
)
from lorafleet.process.response_head import (
    HeadWithBodyProtocol,
)
from lorafleet.process.settings import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    PORT,
    POSITIVE,
    Declared,
    Setting,
    Settings,
    comma_list,
    declared,
    groups,
    setting,
    shown_default,
    walk,
)
from lorafleet.process.settings_cli import (
    SettingRow,
    add_settings,
    parse_settings,
    setting_rows,
    settings_from_args,
    settings_from_env,
)
from lorafleet.process.tasks import (
    RECANCEL_S,
    cancel_and_wait,
)
from lorafleet.process.uvicorn_server import (
    UvicornServer,
)

__all__ = [
    "AT_LEAST_ONE",
    "AUTHORIZATION_HEADER",
    "BadRequestBody",
    "DEFAULT_HEADER_TIMEOUT_S",
    "Declared",
    "HeadWithBodyProtocol",
    "HeaderTimeoutProtocol",
    "HelpFormatter",
    "NON_NEGATIVE",
    "PARENT_PID_VARIABLE",
    "PORT",
    "POSITIVE",
    "RECANCEL_S",
    "Setting",
    "SettingRow",
    "Settings",
    "UvicornServer",
    "add_settings",
    "add_version",
    "backoff_s",
    "bearer_header",
    "bearer_token_accepted",
    "cancel_and_wait",
    "comma_list",
    "configure_logging",
    "console_renderer",
    "declared",
    "die_with_parent",
    "groups",
    "lorafleet_version",
    "parent_pid_env",
    "parse_settings",
    "pid_alive",
    "python_version",
    "setting",
    "setting_rows",
    "settings_from_args",
    "settings_from_env",
    "shown_default",
    "walk",
    "watch_parent",
    "with_header_timeout",
]
