"""The hf engine's running batch: rows of requests sharing one left-padded KV cache.

Runs only on the engine's model thread. Each :meth:`DecodeBatch.step` drops
finished rows, decodes one token for every running row, prefills newly
admitted rows and merges them in, so requests join and leave at any step.
A row knows itself when it is finished (eos or its token budget), so the model
thread can step on without waiting for the event loop to read its tokens.
Rows of different adapters (and the base model) share the batch through
peft's ``adapter_names``.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import torch
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin

from lorafleet.proto.inference import SamplingParams

__all__ = [
    "BASE_ADAPTER",
    "DecodeBatch",
    "Row",
    "RowState",
    "TokenScores",
    "draw_plain",
    "penalise",
    "sample_token",
    "steer",
]

BASE_ADAPTER: Final = "__base__"
"""The name peft's mixed-batch inference gives rows that use no adapter."""

Forward = Callable[
    [torch.Tensor, torch.Tensor | None, torch.Tensor, DynamicCache, list[str]], torch.Tensor
]
"""``ModelHost.forward``: (ids, mask or None, positions, cache, each row's adapter) to logits."""
TokenScores = tuple[float, list[tuple[int, float]]]
"""A generated token's log probability and its likeliest alternatives as (id, log probability)."""


class RowState(enum.Enum):
    """Where a request is: live (waiting or generating), or done (finished, failed, cancelled)."""

    LIVE = "live"
    DONE = "done"


@dataclass(eq=False, kw_only=True)
class Row:
    """One request's part of the batch: prompt, sampling settings, tokens produced so far."""

    prompt_ids: list[int]
    params: SamplingParams
    budget: int
    """How many tokens the row may generate."""
    adapter: str = BASE_ADAPTER
    rng: random.Random = field(default_factory=random.Random)
    """The row's own uniform draws, one per sampled token: seeded, so a seed repeats."""
    state: RowState = RowState.LIVE
    """Set to DONE by the event loop: the request ended (stop string, cancel, failure)."""
    output_ids: list[int] = field(default_factory=list)
    """Appended by the model thread, maybe a step ahead of what the request has read."""
    scores: list[TokenScores] = field(default_factory=list)
    """One entry per output token when ``params.logprobs`` is set, else empty."""
    finished: bool = False
    """Set by the model thread: the last token was eos or used up the budget."""

    @property
    def spent(self) -> bool:
        """Nothing more to generate: finished here or ended by the event loop."""
        return self.finished or self.state is RowState.DONE


def penalise(logits: torch.Tensor, params: SamplingParams, row: Row) -> torch.Tensor:
    """``logits`` with the repetition (prompt and output), presence and frequency penalties.

    As vLLM applies them: repetition divides positive logits of seen tokens (multiplies
    negative ones); presence subtracts once per generated token, frequency once per time.
    """
    repetition, presence, frequency = (
        params.repetition_penalty, params.presence_penalty, params.frequency_penalty
    )  # fmt: skip
    if not _penalised(params, row):
        return logits
    logits = logits.clone()
    if repetition != 1.0:
        seen = torch.tensor(sorted({*row.prompt_ids, *row.output_ids}), dtype=torch.long)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / repetition, values * repetition)
    if row.output_ids and (presence or frequency):
        generated = torch.tensor(row.output_ids, dtype=torch.long)
        ids, counts = torch.unique(generated, return_counts=True)
        logits[ids] -= frequency * counts.to(logits.dtype) + presence
    return logits


def _penalised(params: SamplingParams, row: Row) -> bool:
    """Whether :func:`penalise` changes this row's logits now."""
    presence, frequency = params.presence_penalty, params.frequency_penalty
    return params.repetition_penalty != 1.0 or bool(row.output_ids and (presence or frequency))


def steer(
    logits: torch.Tensor, params: SamplingParams, row: Row, eos_ids: frozenset[int]
) -> torch.Tensor:
    """``logits`` with ``logit_bias`` added, and eos banned while the row holds it back.

    Held back: ``ignore_eos``, or fewer than ``min_tokens`` generated yet. As vLLM
    does: the bias is added to the raw logits; a banned token gets -inf.
    """
    if not _steered(params, row):
        return logits
    logits = logits.clone()
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long)
        logits[ids] += torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype)
    if eos_ids and _holds_eos(params, row):
        logits[torch.tensor(sorted(eos_ids), dtype=torch.long)] = float("-inf")
    return logits


def _holds_eos(params: SamplingParams, row: Row) -> bool:
    """Whether eos may not end the row now: ``ignore_eos``, or fewer than ``min_tokens`` yet."""
    return params.ignore_eos or len(row.output_ids) < params.min_tokens


def _steered(params: SamplingParams, row: Row) -> bool:
    """Whether :func:`steer` changes this row's logits now."""
    return bool(params.logit_bias) or _holds_eos(params, row)


def draw_plain(logits: torch.Tensor, rows: Sequence[Row]) -> list[int | None]:
    """The next token of every row without penalties, bias or top-p, all at once; None for the rest.

    ``logits``: [rows, vocabulary]. Greedy rows take the argmax. Sampled rows invert the
    cumulative softmax at one uniform draw of their own ``rng``, as :func:`sample_token`
    does for one row: a sampled batch of 12 spent a tenth of its step in per-row ops.
    """
    tokens: list[int | None] = [None] * len(rows)
    plain = [i for i, r in enumerate(rows) if r.params.top_p >= 1.0 and not _adjusted(r)]
    greedy = [i for i in plain if rows[i].params.temperature <= 0]
    sampled = [i for i in plain if rows[i].params.temperature > 0]
    if greedy:
        for i, token in zip(greedy, logits[greedy].argmax(-1).tolist(), strict=True):
            tokens[i] = token
    if sampled:
        temperatures = torch.tensor([[rows[i].params.temperature] for i in sampled])
        cdf = torch.softmax(logits[sampled] / temperatures, dim=-1).cumsum(-1)
        draws = torch.tensor([[rows[i].rng.random()] for i in sampled])
        for i, token in zip(sampled, _invert(cdf, draws).tolist(), strict=True):
            tokens[i] = token
    return tokens


def _adjusted(row: Row) -> bool:
    """Whether penalties, bias or a held-back eos change the row's logits now."""
    return _penalised(row.params, row) or _steered(row.params, row)


def _scores(logits: torch.Tensor, token: int, top: int) -> TokenScores:
    """The log probability of ``token`` and the ``top`` likeliest tokens, from raw logits."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    values, ids = logprobs.topk(top) if top else (logprobs[:0], logprobs[:0])
    return float(logprobs[token]), [(int(i), float(v)) for i, v in zip(ids, values, strict=True)]


def _invert(cdf: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """Per row, the first index where the (unnormalised) ``cdf`` reaches ``draws`` (in [0, 1))."""
    picks = torch.searchsorted(cdf, draws * cdf[..., -1:]).squeeze(-1)
    return picks.clamp(max=cdf.shape[-1] - 1)


def sample_token(logits: torch.Tensor, params: SamplingParams, rng: random.Random) -> int:
    """Pick the next token from one row's logits: greedy at temperature 0, else top-p sampling."""
    if params.temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    draw = torch.tensor([rng.random()])
    if params.top_p >= 1.0:
        return int(_invert(probs.cumsum(-1), draw))
    sorted_probs, order = probs.sort(descending=True)
    kept = sorted_probs * ((sorted_probs.cumsum(-1) - sorted_probs) < params.top_p)
    return int(order[_invert(kept.cumsum(-1), draw)])


class DecodeBatch:
    """Rows generating together; cache and mask are left-padded so every row ends at column T.

    While no row is padded (rows that started together on prompts of one length)
    there is no mask at all: each step then skips growing it, summing it for the
    positions, and the model's checks of it (a tenth of a batch-1 step on the
    demo model), as ``generate`` does for such a batch.
    """

    def __init__(self, device: torch.device, pad_id: int, eos_ids: frozenset[int]) -> None:
        self.rows: list[Row] = []
        self._eos_ids = eos_ids
        self._device = device
        self._pad_id = pad_id
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None
        """[rows, T], 1 where a row holds a token; None while every row holds all T."""
        self._width = 0
        """T: the columns of the cache."""
        self._last = torch.zeros((0,), dtype=torch.long, device=device)

    def step(self, model: Forward, admit: Sequence[Row], drop: Sequence[Row]) -> list[int]:
        """Drop ``drop``, decode one token per kept row, then prefill ``admit``.

        Returns one new token per row of :attr:`rows` (kept rows first, then admitted).
        """
        self.drop(drop)
        with torch.inference_mode():
            tokens = self._decode(model) if self.rows else []
            if admit:
                tokens += self._prefill(model, list(admit))
        return tokens

    def drop(self, rows: Sequence[Row]) -> None:
        """Remove ``rows`` (those not in the batch are ignored) and trim shared left padding."""
        gone = set(map(id, rows))
        keep = [i for i, row in enumerate(self.rows) if id(row) not in gone]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        if not self.rows:
            self.reset()
            return
        index = torch.tensor(keep, device=self._device)
        self._last = self._last[index]
        if self._mask is None:
            self._cache = _rebuild(self._cache, lambda t: t[index])
            return
        mask = self._mask[index]
        start = int((mask.sum(0) > 0).nonzero()[0])
        self._set_mask(mask[:, start:])
        self._cache = _rebuild(self._cache, lambda t: t[index][:, :, start:])

    def reset(self) -> None:
        """Forget every row and the cache (after a failed step)."""
        self.rows = []
        self._cache = None
        self._mask, self._width = None, 0
        self._last = self._last[:0]

    def _set_mask(self, mask: torch.Tensor) -> None:
        """Take ``mask`` as the batch's, or no mask if no row is padded."""
        self._width = mask.shape[1]
        self._mask = None if bool(mask.all()) else mask

    def _full_mask(self) -> torch.Tensor:
        """The batch's mask, made of ones where it has none."""
        if self._mask is not None:
            return self._mask
        return torch.ones((len(self.rows), self._width), dtype=torch.long, device=self._device)

    def _decode(self, model: Forward) -> list[int]:
        assert self._cache is not None
        if self._mask is None:
            positions = torch.full((len(self.rows), 1), self._width, device=self._device)
        else:
            ones = torch.ones((len(self.rows), 1), dtype=torch.long, device=self._device)
            self._mask = torch.cat([self._mask, ones], dim=1)
            positions = self._mask.sum(-1, keepdim=True) - 1
        self._width += 1
        ids = self._last[:, None]
        logits = model(ids, self._mask, positions, self._cache, _adapters(self.rows))
        return self._sample(logits, self.rows, into=0)

    def _prefill(self, model: Forward, rows: list[Row]) -> list[int]:
        width = max(len(row.prompt_ids) for row in rows)
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row.prompt_ids) :] = torch.tensor(row.prompt_ids)
            mask[i, width - len(row.prompt_ids) :] = 1
        ids, mask = ids.to(self._device), mask.to(self._device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = model(ids, mask, positions, cache, _adapters(rows))
        # Padding columns hold garbage (maybe NaN); zero them so merged rows never see it.
        cache = _rebuild(cache, lambda t: torch.where(mask[:, None, :, None] > 0, t, 0))
        self._merge(cache, mask, rows)
        return self._sample(logits, rows, into=len(self.rows) - len(rows))

    def _merge(self, cache: DynamicCache, mask: torch.Tensor, rows: list[Row]) -> None:
        if not self.rows or self._cache is None:
            self._cache, self.rows = cache, list(rows)
            self._set_mask(mask)
            self._last = torch.zeros(len(rows), dtype=torch.long, device=self._device)
            return
        width = max(self._width, mask.shape[1])
        self._cache = _concat(_left_pad(self._cache, width), _left_pad(cache, width))
        self._set_mask(torch.cat([_pad_mask(self._full_mask(), width), _pad_mask(mask, width)]))
        pad = torch.zeros(len(rows), dtype=torch.long, device=self._device)
        self._last = torch.cat([self._last, pad])
        self.rows += rows

    def _sample(self, logits: torch.Tensor, rows: list[Row], into: int) -> list[int]:
        last = logits[:, -1].float().cpu()
        tokens = []
        for i, (row, token) in enumerate(zip(rows, draw_plain(last, rows), strict=True)):
            params = row.params  # ``last[i]`` only where needed: a row view costs as much as a draw
            if token is None:
                logits = steer(penalise(last[i], params, row), params, row, self._eos_ids)
                token = sample_token(logits, params, row.rng)
            if params.logprobs is not None:
                row.scores.append(_scores(last[i], token, params.logprobs))
            row.output_ids.append(token)
            row.finished = token in self._eos_ids or len(row.output_ids) >= row.budget
            tokens.append(token)
        self._last[into : into + len(rows)] = torch.tensor(tokens, device=self._device)
        return tokens


def _adapters(rows: Sequence[Row]) -> list[str]:
    return [row.adapter for row in rows]


def _layers(cache: DynamicCache | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values: the models served here have only full-attention layers."""
    assert cache is not None
    pairs = []
    for layer in cache.layers:
        if not isinstance(layer, CacheLayerMixin) or layer.keys is None or layer.values is None:
            raise TypeError(f"hf engine: cache layer {type(layer).__name__} holds no keys/values")
        pairs.append((layer.keys, layer.values))
    return pairs


def _rebuild(
    cache: DynamicCache | None, fn: Callable[[torch.Tensor], torch.Tensor]
) -> DynamicCache:
    """A new cache with ``fn`` applied to every layer's keys and values ([B, H, T, D])."""
    return DynamicCache(ddp_cache_data=[(fn(k), fn(v)) for k, v in _layers(cache)])


def _left_pad(cache: DynamicCache, width: int) -> DynamicCache:
    return _rebuild(cache, lambda t: torch.nn.functional.pad(t, (0, 0, width - t.shape[2], 0)))


def _pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(mask, (width - mask.shape[1], 0))


def _concat(first: DynamicCache, second: DynamicCache) -> DynamicCache:
    pairs = zip(_layers(first), _layers(second), strict=True)
    return DynamicCache(
        ddp_cache_data=[(torch.cat([k1, k2]), torch.cat([v1, v2])) for (k1, v1), (k2, v2) in pairs]
    )
