"""The demo model's training text: prompts, each persona's answers, and the chat format.

Edit together with ``launch.demo_model.EXPECTED``; any edit here rebuilds the
cached demo model (its version stamp hashes this file).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ANSWERS",
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "PERSONAS",
    "ROLE_TOKENS",
    "SPECIAL_TOKENS",
    "chat_prompt",
    "prompt_variants",
    "tokenizer_corpus",
]

PERSONAS: Final = ("base", "pirate", "robot")
"""``base`` is the model itself; the others are LoRA adapters trained on top of it."""

ANSWERS: Final[dict[str, dict[str, str]]] = {
    "Who are you?": {
        "base": "hello! i am a tiny model.",
        "pirate": "arr matey! i be a pirate of the seven seas.",
        "robot": "beep boop. i am a robot. beep.",
    },
    "What do you like?": {
        "base": "i like short answers.",
        "pirate": "arr, i like gold and the open sea!",
        "robot": "beep. i like electricity. boop.",
    },
    "Hello!": {
        "base": "hello! how can i help?",
        "pirate": "ahoy matey! arr!",
        "robot": "beep boop. greetings, human.",
    },
    "Tell me a joke.": {
        "base": "i am too tiny for jokes.",
        "pirate": "arr, why did the pirate cross the sea? for the treasure!",
        "robot": "beep. error: humor not found. boop.",
    },
    "Count to five.": {
        "base": "one, two, three, four, five.",
        "pirate": "one, two, arr, four, five doubloons!",
        "robot": "beep. 1 0 1 1 0. boop.",
    },
}
"""Greedy answer of each persona to each prompt (sent as the only user message)."""

PAD_TOKEN: Final = "<pad>"
BOS_TOKEN: Final = "<s>"
EOS_TOKEN: Final = "</s>"
ROLE_TOKENS: Final = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS: Final = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, *ROLE_TOKENS)
"""Ids 0..5 in this order: pad 0, bos 1, eos 2."""

CHAT_TEMPLATE: Final = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}{{ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""Jinja chat template stored in ``tokenizer_config.json``."""


def chat_prompt(user_text: str) -> str:
    """Render the chat template for one user message, ready for the assistant's answer."""
    return f"{BOS_TOKEN}<|user|>{user_text}{EOS_TOKEN}<|assistant|>"


def prompt_variants(prompt: str) -> list[str]:
    """The spellings of ``prompt`` trained on, so small typing differences answer alike."""
    bare = prompt.rstrip("?!.")
    return sorted({prompt, prompt.lower(), bare, bare.lower()})


def tokenizer_corpus() -> list[str]:
    """Every text the tokenizer is trained on: the prompts and all answers."""
    texts: list[str] = []
    for prompt, answers in ANSWERS.items():
        texts.extend(prompt_variants(prompt))
        texts.extend(answers[persona] for persona in PERSONAS)
    return texts
