"""``bench.prefix``'s workloads: shared system prompts, multi-turn chats, and no shared prefix.

Texts are words drawn from a seeded vocabulary, so a run is the same every time and the
mocker's word tokenizer counts them one token each. A workload is a list of jobs; a job is
one conversation of one or more turns, run in order by one client (a single-turn job is a
plain request). ``ideal_hits`` counts the prompt tokens a perfect router would find cached:
each block computed once in the whole fleet (``fleet.kv_blocks``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from lorafleet.fleet.kv_blocks import block_hashes, version_key, words_tokens

__all__ = ["Job", "Sizes", "WORKLOADS", "build_jobs", "ideal_hits"]

VOCABULARY: Final = tuple(f"w{index}" for index in range(4096))
WORKLOADS: Final = ("shared", "multiturn", "unique")
"""(a) shared system prompts, (b) multi-turn chats, (c) no shared prefix (the control)."""


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """The workloads' sizes (the issue's by default)."""

    prefixes: int = 32
    prefix_words: int = 2000
    questions: int = 8
    question_words: int = 24
    conversations: int = 64
    turns: int = 6
    opening_words: int = 600
    unique_requests: int = 256
    unique_words: int = 600


@dataclass
class Job:
    """One conversation: its model and the user messages of its turns (after an optional
    system prompt); the answers are added as the turns are answered."""

    model: str
    system: str
    users: list[str]
    answers: list[str] = field(default_factory=list)

    def messages(self, turn: int) -> list[dict[str, str]]:
        """The chat messages of ``turn``: the system prompt, then every earlier exchange."""
        messages = [{"role": "system", "content": self.system}] if self.system else []
        for index in range(turn + 1):
            messages.append({"role": "user", "content": self.users[index]})
            if index < turn:
                messages.append({"role": "assistant", "content": self.answers[index]})
        return messages


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(VOCABULARY, k=words))


def build_jobs(workload: str, models: Sequence[str], sizes: Sizes, seed: int = 0) -> list[Job]:
    """The jobs of ``workload``, in the random order clients take them."""
    rng = random.Random(f"{workload}-{seed}")
    if workload == "shared":
        prompts = [(models[i % len(models)], _text(rng, sizes.prefix_words))
                   for i in range(sizes.prefixes)]  # fmt: skip
        jobs = [Job(model=model, system=prompt, users=[_text(rng, sizes.question_words)])
                for model, prompt in prompts for _ in range(sizes.questions)]  # fmt: skip
    elif workload == "multiturn":
        jobs = [
            Job(model=models[i % len(models)], system="",
                users=[_text(rng, sizes.opening_words if turn == 0 else sizes.question_words)
                       for turn in range(sizes.turns)])
            for i in range(sizes.conversations)
        ]  # fmt: skip
    elif workload == "unique":
        jobs = [Job(model=models[i % len(models)], system="",
                    users=[_text(rng, sizes.unique_words)])
                for i in range(sizes.unique_requests)]  # fmt: skip
    else:
        raise ValueError(f"unknown workload {workload!r}; choose one of {', '.join(WORKLOADS)}")
    rng.shuffle(jobs)
    return jobs


def ideal_hits(sent: Sequence[tuple[str, list[dict[str, str]], str]], block_size: int) -> int:
    """Prompt tokens found cached if every block were computed once in the fleet and kept:
    each request's leading blocks that an earlier request's prompt or answer already had.

    ``sent``: (model, messages, answer) of every request, in the order they were sent.
    """
    seen: set[int] = set()
    hits = 0
    for model, messages, answer in sent:
        tokens = words_tokens(message["content"] for message in messages)
        hashes = block_hashes(tokens, block_size, version_key(model))
        hits += next((i for i, h in enumerate(hashes) if h not in seen), len(hashes)) * block_size
        seen.update(
            block_hashes([*tokens, *words_tokens([answer])], block_size, version_key(model))
        )
    return hits
