"""Which OpenAI and vLLM request fields no engine serves, and the values that change nothing.

Such a field set to anything but its neutral values is refused with a 400 that names
it and the engine (``frontend.translate``); edit ``NEUTRAL`` when an engine learns one.
docs/frontend.md's field table lists every field: honoured, forwarded or refused.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

import msgspec

__all__ = ["NEUTRAL", "unserved_field"]

NEUTRAL: Final[Mapping[str, tuple[object, ...]]] = MappingProxyType(
    {
        # OpenAI's, both request kinds
        "store": (False,),
        "metadata": ({},),
        "service_tier": ("auto", "default"),
        "prompt_cache_retention": (),
        "prompt_cache_options": (),
        # OpenAI's chat
        "audio": (),
        "function_call": ("none",),
        "functions": ([],),
        "modalities": (["text"],),
        "moderation": (),
        "parallel_tool_calls": (True, False),  # says how tools are called; none are
        "prediction": (),
        "reasoning_effort": (),
        "verbosity": (),
        "web_search_options": (),
        # OpenAI's completions
        "best_of": (1,),
        "suffix": ("",),
        # vLLM's extra sampling and template fields
        "top_k": (0, -1),
        "min_p": (0, 0.0),
        "stop_token_ids": ([],),
        "include_stop_str_in_output": (False,),
        "skip_special_tokens": (True,),
        "spaces_between_special_tokens": (True,),
        "truncate_prompt_tokens": (),
        "allowed_token_ids": (),
        "bad_words": ([],),
        "prompt_logprobs": (),
        "use_beam_search": (False,),
        "length_penalty": (1, 1.0),
        "structured_outputs": (),
        "guided_json": (),
        "guided_regex": (),
        "guided_choice": (),
        "guided_grammar": (),
        "priority": (0,),
        "logits_processors": (),
        "add_special_tokens": (),
        "return_tokens_as_token_ids": (False,),
        "add_generation_prompt": (True,),
        "continue_final_message": (False,),
        "chat_template": (),
        "chat_template_kwargs": (),
    }
)
"""Field name to the values that ask for what every engine does anyway (None always is)."""


def unserved_field(body: msgspec.Struct) -> tuple[str, object] | None:
    """The first field of ``body`` that asks for something no engine serves, and its value."""
    names, values_of = _policed_fields(type(body))
    values = values_of(body)
    if values.count(None) == len(values):  # what almost every body sends: none of them
        return None
    for name, value in zip(names, values, strict=True):
        if value is not None and not any(_same(value, n) for n in NEUTRAL[name]):
            return name, value
    return None


@functools.cache
def _policed_fields(
    body_type: type[msgspec.Struct],
) -> tuple[tuple[str, ...], Callable[[msgspec.Struct], tuple[object, ...]]]:
    """The fields of ``NEUTRAL`` that ``body_type`` declares (each request type declares
    several: ``attrgetter`` of two or more names gives a tuple), and a getter of their values
    in one C call (a loop of ``getattr`` cost twice as much per body)."""
    names = tuple(name for name in NEUTRAL if name in body_type.__struct_fields__)
    return names, operator.attrgetter(*names)


def _same(value: object, neutral: object) -> bool:
    """Equal and of one kind: ``True`` is not the neutral ``1`` of ``best_of``."""
    return type(value) is type(neutral) and value == neutral
