"""One adapter's byte bound, spent as a source writes: listed sizes first, then every chunk.

It must not write or delete files; the source that writes holds it and stops when it raises.
"""

from __future__ import annotations

import threading

from lorafleet.worker.lora.errors import LoraUnavailableError, adapter_too_big

__all__ = ["ByteBudget"]


class ByteBudget:
    """``DYN_LORA_MAX_BYTES`` for one download, checked before bytes are written and as they are.

    Callable as boto3's progress callback: raising there stops the stream. ``cancelled``
    (set when the download's task is cancelled) stops the writer at its next chunk, so a
    thread that cannot be cancelled writes no more than one chunk after its task is gone.

    Example::

        budget = ByteBudget("s3://b/a.tar.gz", 8 << 20)
        budget.check(listed_size)     # before any GET
        budget(len(chunk))            # after each chunk received, before the next
    """

    def __init__(
        self, uri: str, bound: int | None, *, cancelled: threading.Event | None = None
    ) -> None:
        self._uri, self._bound, self._spent = uri, bound, 0
        self._cancelled = cancelled or threading.Event()

    def check(self, size: int) -> None:
        """Refuse ``size`` bytes (listed, declared, or written so far) over the bound."""
        if self._cancelled.is_set():
            raise LoraUnavailableError(self._uri, "the download was cancelled")
        if self._bound is not None and size > self._bound:
            raise adapter_too_big(self._uri, size, self._bound)

    def __call__(self, bytes_amount: int) -> None:
        """Spend ``bytes_amount`` more, refusing once the total is over the bound."""
        self._spent += bytes_amount
        self.check(self._spent)

    def fresh(self) -> ByteBudget:
        """The same bound and cancellation with nothing spent: an archive's contents are
        bounded on their own, apart from the archive they are extracted from."""
        return ByteBudget(self._uri, self._bound, cancelled=self._cancelled)
