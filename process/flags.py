"""One way to declare a command-line flag that an environment variable can also set.

The worker and the frontend run in containers configured by environment, and by hand with
flags; every flag of theirs has a variable. ``env_option`` states the pair once: the flag, its
variable, its default and its help, which names the variable.

An empty variable counts as unset. A variable's text is parsed as the flag's would be, and a
bad value stops the process with one usage line naming the variable, never a traceback.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Collection
from typing import Any, Final

__all__ = ["FlagSpec", "add_env_options", "env_flag", "env_option"]

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
