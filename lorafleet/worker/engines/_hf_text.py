"""Turns a stream of generated token ids into text deltas: whole characters only, stop strings cut.

Owned by one request of the hf engine; holds back text that could still be
an incomplete UTF-8 character or the start of a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

__all__ = ["TextStream"]

_REPLACEMENT_CHAR: Final = "\ufffd"


class TextStream:
    """Incremental detokenizer with stop strings (the stop string itself is never emitted)."""

    def __init__(
        self, tokenizer: Any, stop: Sequence[str] = (), generated: Sequence[int] = ()
    ) -> None:
        """``generated``: ids a continuation resumes after; their text counts as sent.

        They are pushed one by one, exactly as the instance that generated them did, so
        the state (held-back text, decode offsets) and every later delta are the same.
        """
        self._tokenizer = tokenizer
        # The Rust tokenizer's own decode: the transformers wrapper around it took two
        # thirds of every decode, and this runs twice per token on the event loop. Only
        # where the wrapper adds nothing (no clean-up of spaces).
        backend = getattr(tokenizer, "backend_tokenizer", None)
        clean_up = getattr(tokenizer, "clean_up_tokenization_spaces", True)
        self._backend_decode = backend.decode if backend is not None and not clean_up else None
        self._stop = [s for s in stop if s]
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._text = ""
        self._sent = 0
        self.stopped = False
        for token_id in generated:
            self.push(token_id)

    def push(self, token_id: int) -> str:
        """Add one token; return the text that is now safe to send (maybe empty)."""
        self._ids.append(token_id)
        self._text += self._decode_new()
        cut = self._find_stop()
        if cut is not None:
            self.stopped = True
            self._text = self._text[:cut]
            return self._take(len(self._text))
        return self._take(len(self._text) - self._stop_prefix_len())

    def flush(self) -> str:
        """Return whatever was held back; call once when the request ends without a stop string."""
        if not self.stopped:
            self._text += self._decode(self._ids[self._prefix_offset :])[len(self._pending()) :]
        return self._take(len(self._text))

    def _decode(self, ids: list[int]) -> str:
        if self._backend_decode is not None:
            return str(self._backend_decode(ids, skip_special_tokens=True))
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

    def _pending(self) -> str:
        return self._decode(self._ids[self._prefix_offset : self._read_offset])

    def _decode_new(self) -> str:
        """Text of the newest tokens once it no longer ends in a partial character."""
        prefix = self._pending()
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(_REPLACEMENT_CHAR):
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            return full[len(prefix) :]
        return ""

    def _find_stop(self) -> int | None:
        """Index where the earliest stop string starts in the unsent text, if any."""
        hits = []
        for stop in self._stop:
            index = self._text.find(stop, max(0, self._sent - len(stop) + 1))
            if index >= 0:
                hits.append(index)
        return min(hits) if hits else None

    def _stop_prefix_len(self) -> int:
        """Length of the longest text suffix that a stop string starts with."""
        longest = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(self._text)), longest, -1):
                if self._text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _take(self, end: int) -> str:
        end = max(end, self._sent)
        delta, self._sent = self._text[self._sent : end], end
        return delta
