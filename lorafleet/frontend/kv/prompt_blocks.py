"""A request's prompt as prefix-cache blocks: engine tokens where the frontend can make them,
character blocks where it cannot.

Tokens are made only when a router asks, once per request and tokenizer (``PromptBlocks``
memoises them): a request with one candidate instance, or a prompt shorter than a block,
costs no tokenization. Block hashes are made as far as a router reads them
(``fleet.kv_blocks.BlockChain``), and so are the mocker's word tokens: a prompt whose first
block nobody holds costs one block of each. ``words`` is the mocker's tokenizer; ``hf``
loads the model folder's tokenizer (``KvCacheSpec.tokenizer_path``) and applies its chat
template as the hf and vllm engines do. A tokenizer the frontend cannot load leaves the
instance to character blocks (the approximate mode), logged once per path. Why the
frontend tokenizes: ``docs/decisions.md``, "Where the frontend tokenizes".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final, Protocol

import structlog

from lorafleet.fleet.kv_blocks import BlockChain, block_hashes, iter_words_tokens, words_count
from lorafleet.proto.inference import GenerateRequest
from lorafleet.proto.kv_events import KvCacheSpec

__all__ = [
    "CHARS_PER_BLOCK",
    "HfTokenizers",
    "PromptBlocks",
    "TokenizerSource",
    "load_hf_tokenizer",
]

log = structlog.get_logger(__name__)

CHARS_PER_BLOCK: Final = 64
"""Bytes of prompt text per block of the approximate mode (no tokenizer)."""
CHARS_PER_TOKEN: Final = 4
"""Prompt characters per token where no tokenizer says (English text, most tokenizers)."""


class Tokenize(Protocol):
    """What the frontend needs of an hf tokenizer: encode text and render a chat."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


TokenizerSource = Callable[[str], Tokenize | None]
"""Gives the hf tokenizer of a model folder, or None when it cannot be loaded."""


def load_hf_tokenizer(path: str) -> Tokenize | None:
    """transformers' tokenizer of ``path``, or None (no transformers, or nothing readable)."""
    try:
        from transformers import AutoTokenizer

        tokenizer: Tokenize = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # ImportError, OSError, ValueError: all mean "cannot"
        log.warning("cannot load the tokenizer; routing approximately for its instances",
                    path=path, error=str(exc))  # fmt: skip
        return None
    return tokenizer


class HfTokenizers:
    """One tokenizer per model folder, loaded once (a failure too: logged once), in a thread
    of its own: the first load imports transformers (seconds of CPU), which must never stall
    the event loop that routes every request. Until it is ready the path has none, and its
    instances are routed approximately."""

    def __init__(self, load: TokenizerSource = load_hf_tokenizer) -> None:
        self._load = load
        self._loading: dict[str, Future[Tokenize | None]] = {}
        self._threads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")

    def get(self, path: str) -> Tokenize | None:
        """The tokenizer of ``path`` once it is loaded, else None (and its load is started)."""
        if not path:
            return None
        if path not in self._loading:
            self._loading[path] = self._threads.submit(self._load, path)
        loading = self._loading[path]
        return loading.result() if loading.done() else None


class PromptBlocks:
    """One request's prompt, hashed into blocks on demand (each kind once)."""

    def __init__(self, request: GenerateRequest, tokenizers: HfTokenizers) -> None:
        self.request = request
        self._tokenizers = tokenizers
        self._texts = _texts(request)
        self.chars = sum(len(text) for text in self._texts)
        """Characters of prompt text (a cheap bound: a token is at least one character)."""
        self._tokens: dict[str, list[int] | None] = {}
        """The hf tokens by tokenizer path."""
        self._chains: dict[tuple[str, str, str, int], BlockChain] = {}
        self._hashes: dict[str, list[int]] = {}
        self._words: int | None = None
        """How many tokens the mocker's tokenizer makes of the prompt (its words), once counted."""

    def token_count(self, spec: KvCacheSpec, *, count: bool = True) -> int | None:
        """How many tokens the engine makes of the prompt under ``spec``'s tokenizer, or
        None if unknown: its tokenizer is not loaded, or ``count`` is False and the words
        (the mocker's tokens, made lazily) are not counted yet. A route by load alone needs
        no count, and counting a 600-word prompt's words was a fifth of its route."""
        if spec.tokenizer == "words":
            if self._words is None and count:
                self._words = words_count(self._texts)
            return self._words
        tokens = self._hf_tokens(spec)
        return None if tokens is None else len(tokens)

    def token_chain(self, spec: KvCacheSpec, version: str) -> BlockChain | None:
        """The prompt's blocks as the engine names them under ``version``, hashed as far as
        they are read, or None if its tokens are unknown."""
        key = (spec.tokenizer, spec.tokenizer_path, version, spec.block_size)
        if key not in self._chains:
            if spec.tokenizer == "words":
                chunks: Iterable[list[int]] = iter_words_tokens(self._texts, spec.block_size)
            elif (tokens := self._hf_tokens(spec)) is not None:
                chunks = [tokens]
            else:
                return None
            self._chains[key] = BlockChain(chunks, spec.block_size, version,
                                           self.request.cache_salt)  # fmt: skip
        return self._chains[key]

    def char_hashes(self, version: str) -> list[int]:
        """The hash of each whole ``CHARS_PER_BLOCK`` bytes of the prompt text."""
        if version not in self._hashes:
            salt = self.request.cache_salt
            self._hashes[version] = block_hashes(self._text_bytes, CHARS_PER_BLOCK, version,
                                                 salt)  # fmt: skip
        return self._hashes[version]

    @property
    def estimated_tokens(self) -> int:
        """The prompt's tokens as its characters suggest, where they are not counted (the
        approximate mode, and the load of a prompt no candidate holds)."""
        return self.chars // CHARS_PER_TOKEN

    @property
    def text_bytes(self) -> int:
        """Bytes of the character blocks' text (the prompt, or the chat with its roles)."""
        return len(self._text_bytes)

    @functools.cached_property
    def _text_bytes(self) -> bytes:
        return _chat_text(self.request).encode()

    def _hf_tokens(self, spec: KvCacheSpec) -> list[int] | None:
        """The prompt as the hf tokenizer at ``spec.tokenizer_path`` makes it (chat template
        applied), or None while that tokenizer is not loaded."""
        path = spec.tokenizer_path
        if path not in self._tokens:
            self._tokens[path] = self._tokenize_hf(path)
        return self._tokens[path]

    def _tokenize_hf(self, path: str) -> list[int] | None:
        tokenizer = self._tokenizers.get(path)
        if tokenizer is None:
            return None
        messages = self.request.messages
        if messages is None:
            return list(tokenizer.encode(self.request.prompt or ""))
        chat = [{"role": m.role, "content": m.content} for m in messages]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        return list(tokenizer.encode(text, add_special_tokens=False))


def _texts(request: GenerateRequest) -> list[str]:
    """The prompt, or each chat message's content in order (what the mocker tokenizes)."""
    if request.messages is None:
        return [request.prompt or ""]
    return [m.content for m in request.messages]


def _chat_text(request: GenerateRequest) -> str:
    """The prompt, or every chat message's role and content: the character blocks' text."""
    if request.messages is None:
        return request.prompt or ""
    return "\0".join(f"{m.role}\0{m.content}" for m in request.messages)
