"""What every lorafleet command line shares: help that shows defaults, and ``--version``.

The worker, the frontend and the ``lorafleet`` command all build their parsers with
these, so that every flag reads the same way. Must not define any flag but ``--version``.
"""

from __future__ import annotations

import argparse

from lorafleet.process.build_info import lorafleet_version

__all__ = ["HelpFormatter", "add_version"]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to each flag's help that has a default worth showing.

    None, False, empty strings and empty lists are left out: the help text says what their
    absence means.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default in ([], ""):
            return action.help
        return super()._get_help_string(action)


def add_version(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` a ``--version`` flag that prints ``<prog> <version>`` and exits."""
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {lorafleet_version()}",
        help="print the version and exit",
    )  # fmt: skip
