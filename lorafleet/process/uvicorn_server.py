"""uvicorn's ``Server`` with SIGTERM and SIGINT handled as a lorafleet process needs them.

uvicorn's own handlers re-raise the signal once the server is done, so a process cannot
exit 0 on SIGTERM, and they replace any handler the process installed. The frontend and the
worker's status server both serve through this class.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Final

import uvicorn

__all__ = ["UvicornServer"]

_EXIT_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)


class UvicornServer(uvicorn.Server):
    """uvicorn that never re-raises the signal that stopped it.

    With ``on_signal`` it handles SIGTERM and SIGINT itself: ``on_signal()``, then a
    graceful exit (the frontend: ``on_signal`` also stops a start-up still waiting for NATS
    or etcd). Without, it installs no handler at all and leaves the signals to its owner,
    which sets ``should_exit`` (the worker runtime, tests)::

        UvicornServer(config, on_signal=stopping.set)  # the process's own server
        UvicornServer(config)                          # one server among other duties
    """

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self._on_signal = on_signal

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._on_signal is not None:
            self._on_signal()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if self._on_signal is None:
            yield
            return
        loop = asyncio.get_running_loop()
        for sig in _EXIT_SIGNALS:
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in _EXIT_SIGNALS:
                loop.remove_signal_handler(sig)
