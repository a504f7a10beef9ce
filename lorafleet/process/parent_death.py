"""Child processes that die with the process that started them, even when it is SIGKILLed.

``lorafleet up``, the benchmarks and the test fixtures start etcd, NATS, frontends and
workers in sessions of their own (a Ctrl-C reaches only the parent, which stops them in
order). Killed outright (``kill -9``, the OOM killer, a CI timeout), the parent stops
nothing; so each child asks for a signal when its parent dies.

- **Linux:** the child's argv is wrapped (``die_with_parent``) in a tiny launcher that
  asks for ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` and then execs the real program (same pid;
  the request survives the exec). Not a ``preexec_fn``: Python code between fork and exec
  crashes a parent that runs gRPC or torch threads. The kernel sends the signal when the
  *thread* that forked the child exits, not the process: so it is asked for only when the
  main thread starts the child (a thread pool's thread may end while its children live on).
- **Elsewhere, or a child started from another thread:** a Python child of ours (worker,
  frontend) watches its parent instead (``watch_parent``, told to by ``PARENT_PID_VARIABLE``)
  and kills itself once the parent is gone. etcd and NATS have no such fallback there.

Must not decide when children stop in an orderly shutdown: their owner does that.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Final

from lorafleet.process.pids import pid_alive

__all__ = ["PARENT_PID_VARIABLE", "die_with_parent", "parent_pid_env", "watch_parent"]

PARENT_PID_VARIABLE: Final = "LORAFLEET_PARENT_PID"
"""Set on a Python child: the pid whose death ends it (``watch_parent``)."""
WATCH_INTERVAL_S: Final = 0.5
"""How often ``watch_parent`` looks at its parent pid."""


_LAUNCHER: Final = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):  # the parent died before the request took effect\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
"""Run by ``python -I -S -c``: no site, no environment, a few milliseconds."""


def die_with_parent(argv: list[str]) -> list[str]:
    """``argv`` wrapped so that the child gets SIGKILL when this process dies; ``argv`` as it
    is where the kernel cannot (not Linux) or cannot be trusted to (off the main thread)."""
    if not sys.platform.startswith("linux"):
        return argv
    if threading.current_thread() is not threading.main_thread():
        return argv
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), *argv]


def parent_pid_env() -> dict[str, str]:
    """The variable that tells a Python child of ours to watch this process."""
    return {PARENT_PID_VARIABLE: str(os.getpid())}


def watch_parent() -> None:
    """In a child told so by ``PARENT_PID_VARIABLE``, kill this process once its parent is
    gone: the fallback of ``die_with_parent`` (a daemon thread; costs a syscall a tick)."""
    told = os.environ.get(PARENT_PID_VARIABLE, "")
    if not told.isdigit():
        return
    parent = int(told)
    if not pid_alive(parent):  # it died before we got here
        os.kill(os.getpid(), signal.SIGKILL)
    if os.getppid() != parent:
        return  # started through a wrapper process: the wrapper's parent is not ours to watch

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_INTERVAL_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()
