"""Which lorafleet runs: the installed package's version, for build-info metrics and logs.

Shared by workers and frontends so that both report the same version string.
"""

from __future__ import annotations

import platform
from importlib import metadata

__all__ = ["lorafleet_version", "python_version"]


def lorafleet_version() -> str:
    """lorafleet's installed version, or ``"unknown"`` when run from a bare checkout."""
    try:
        return metadata.version("lorafleet")
    except metadata.PackageNotFoundError:
        return "unknown"


def python_version() -> str:
    """The interpreter's version, e.g. ``3.11.9``."""
    return platform.python_version()
