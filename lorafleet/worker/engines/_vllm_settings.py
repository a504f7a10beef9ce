"""Turns lorafleet's engine config and requests into vLLM's arguments, without importing vLLM.

Pure functions, so the main test suite checks them in a venv that has no vLLM.
Edit together with ``worker.engines.vllm``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from lorafleet.proto.errors import InvalidRequestError
from lorafleet.proto.inference import FinishReason, SamplingParams, TokenLogprob, TopLogprob
from lorafleet.worker.engine import EngineConfig
from lorafleet.worker.engines._vllm_base_rows import ISOLATE_OPTION, MASK_OPTION

__all__ = [
    "VLLM_LORA_RANKS",
    "engine_kwargs",
    "finish_reason",
    "model_max_len",
    "sampling_kwargs",
    "token_logprobs",
    "vllm_lora_rank",
]

VLLM_LORA_RANKS: Final = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM accepts for ``max_lora_rank``; others are rounded up."""
_OWN_OPTIONS: Final = frozenset({ISOLATE_OPTION, MASK_OPTION})
_FINISH_REASONS: Final[Mapping[str, FinishReason]] = {
    "stop": "stop",
    "length": "length",
    "abort": "cancelled",
    "error": "error",
}


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts that is at least ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    largest = VLLM_LORA_RANKS[-1]
    raise InvalidRequestError(f"max_lora_rank {rank} exceeds vLLM's largest ({largest})")


def model_max_len(model: str) -> int | None:
    """``max_position_embeddings`` of a local Hugging Face model directory, if it states one."""
    try:
        value = json.loads((Path(model) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def engine_kwargs(config: EngineConfig) -> dict[str, Any]:
    """Keyword arguments for vLLM's ``AsyncEngineArgs``.

    The context length is ``config.context_length`` capped at what a local
    model's config allows (vLLM refuses a longer one). ``config.options`` pass
    through to vLLM (e.g. ``dtype``, ``enforce_eager``, ``max_num_seqs``,
    ``kv_cache_memory_bytes``, ``max_model_len``) except lorafleet's own, and
    override the defaults derived from the config.
    """
    limit = model_max_len(config.model)
    kwargs: dict[str, Any] = {
        "model": config.model,
        "served_model_name": config.model_name,
        "max_model_len": min(config.context_length, limit or config.context_length),
        "disable_log_stats": True,
    }
    if config.enable_lora:
        kwargs |= {
            "enable_lora": True,
            "max_loras": config.max_loras,
            "max_cpu_loras": config.max_loras,
            "max_lora_rank": vllm_lora_rank(config.max_lora_rank),
        }
    passed = {key: value for key, value in config.options.items() if key not in _OWN_OPTIONS}
    return kwargs | passed


def sampling_kwargs(sampling: SamplingParams) -> dict[str, Any]:
    """Keyword arguments for vLLM's ``SamplingParams`` (without the output kind)."""
    if sampling.max_tokens < 1:
        raise InvalidRequestError(f"max_tokens must be at least 1, got {sampling.max_tokens}")
    return {
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "stop": list(sampling.stop),
        "seed": sampling.seed,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "repetition_penalty": sampling.repetition_penalty,
        "logprobs": sampling.logprobs,
        "ignore_eos": sampling.ignore_eos,
        "min_tokens": sampling.min_tokens,
        "logit_bias": dict(sampling.logit_bias) or None,
    }


def token_logprobs(
    token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any]] | None, top: int
) -> list[TokenLogprob]:
    """The wire's log probabilities from vLLM's (one ``{token_id: Logprob}`` per token).

    Each map holds the sampled token and the ``top`` likeliest, which carry ranks 1..top.
    """
    if not logprobs:
        return []
    out = []
    for token_id, candidates in zip(token_ids, logprobs, strict=True):
        chosen = candidates[token_id]
        ranked = sorted(
            (c for c in candidates.values() if c.rank is not None and 1 <= c.rank <= top),
            key=lambda c: c.rank,
        )
        alternatives = [TopLogprob(token=c.decoded_token or "", logprob=c.logprob) for c in ranked]
        out.append(
            TokenLogprob(token=chosen.decoded_token or "", logprob=chosen.logprob, top=alternatives)
        )
    return out


def finish_reason(reason: str | None) -> FinishReason:
    """Map vLLM's finish reason onto the wire's; a missing or unknown one counts as an error."""
    return _FINISH_REASONS.get(reason or "", "error")
