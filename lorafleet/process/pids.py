"""Whether a process id on this machine names a running process.

Both ``lorafleet up``'s state file and the adapter cache's in-use markers name their owner by
pid; this is the one check of such a pid.
"""

from __future__ import annotations

import os

__all__ = ["pid_alive"]


def pid_alive(pid: int) -> bool:
    """Return whether ``pid`` runs here (one of another user's processes counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
