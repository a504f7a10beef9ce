"""Builds the demo model's parts in memory: tokenizer, tiny Llama base, persona LoRA adapters.

Pure computation, deterministic for a given torch build; saving and caching
live in ``launch.demo_model``.
"""

from __future__ import annotations

import copy
from typing import Final

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM

from lorafleet.launch._demo_corpus import (
    ANSWERS,
    SPECIAL_TOKENS,
    chat_prompt,
    prompt_variants,
    tokenizer_corpus,
)

__all__ = [
    "LORA_RANK",
    "LORA_TARGETS",
    "build_adapter",
    "build_base",
    "build_tokenizer",
    "greedy_answer",
    "llama_config",
]

SEED: Final = 1234
VOCAB_SIZE: Final = 320
BASE_STEPS: Final = 80
BASE_LR: Final = 3e-3
ADAPTER_STEPS: Final = 80
ADAPTER_LR: Final = 1e-2
LORA_RANK: Final = 8
LORA_ALPHA: Final = 16
LORA_TARGETS: Final = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PAD_ID: Final = 0
BOS_ID: Final = 1
EOS_ID: Final = 2
_IGNORE_LABEL: Final = -100


def build_tokenizer() -> Tokenizer:
    """Train a byte-level BPE tokenizer on the corpus; ids 0..5 are the special tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(tokenizer_corpus(), trainer)
    return tokenizer


def llama_config(vocab_size: int) -> LlamaConfig:
    """The tiny Llama shape: head size 32 (vLLM's CPU attention needs at least 32)."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )


def _chat_pairs(tokenizer: Tokenizer, persona: str) -> list[tuple[list[int], list[int]]]:
    """(prompt, answer + eos) token ids: every prompt spelling answered as ``persona``."""
    pairs = []
    for prompt, answers in ANSWERS.items():
        answer = [*tokenizer.encode(answers[persona]).ids, EOS_ID]
        pairs += [(tokenizer.encode(chat_prompt(v)).ids, answer) for v in prompt_variants(prompt)]
    return pairs


def _prose_pairs(tokenizer: Tokenizer) -> list[tuple[list[int], list[int]]]:
    """Every persona's answers as plain text, so the base knows their words (as pretraining)."""
    texts = sorted({a for answers in ANSWERS.values() for a in answers.values()})
    return [([BOS_ID], [*tokenizer.encode(text).ids, EOS_ID]) for text in texts]


def _batch(pairs: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, ...]:
    """Right-padded (input_ids, labels, attention_mask) with loss only on the answers."""
    width = max(len(p) + len(a) for p, a in pairs)
    ids = torch.full((len(pairs), width), PAD_ID, dtype=torch.long)
    labels = torch.full((len(pairs), width), _IGNORE_LABEL, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for row, (prompt_ids, answer_ids) in enumerate(pairs):
        end = len(prompt_ids) + len(answer_ids)
        ids[row, :end] = torch.tensor(prompt_ids + answer_ids)
        labels[row, len(prompt_ids) : end] = torch.tensor(answer_ids)
        mask[row, :end] = 1
    return ids, labels, mask


def _train(model: torch.nn.Module, batch: tuple[torch.Tensor, ...], steps: int, lr: float) -> float:
    """Full-batch AdamW with linear decay on the trainable parameters; returns the last loss."""
    ids, labels, mask = batch
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.05, total_iters=steps)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    return float(loss.detach())


def build_base(tokenizer: Tokenizer) -> LlamaForCausalLM:
    """Train the base model on the ``base`` answers; weights end rounded to bfloat16."""
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(llama_config(tokenizer.get_vocab_size()))
    pairs = _chat_pairs(tokenizer, "base") + _prose_pairs(tokenizer)
    _train(model, _batch(pairs), BASE_STEPS, BASE_LR)
    # Round to what is saved, so adapters train against the weights that are served.
    # transformers wraps Module.to with functools.wraps, which mypy binds without self.
    model.to(torch.bfloat16).to(torch.float32)  # type: ignore[arg-type]
    return model


def build_adapter(base: LlamaForCausalLM, tokenizer: Tokenizer, persona: str) -> PeftModel:
    """Train a LoRA adapter for ``persona`` on a frozen copy of ``base``."""
    torch.manual_seed(SEED + len(persona))
    config = LoraConfig(
        r=LORA_RANK,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules=list(LORA_TARGETS),
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(copy.deepcopy(base), config, adapter_name=persona)
    _train(model, _batch(_chat_pairs(tokenizer, persona)), ADAPTER_STEPS, ADAPTER_LR)
    return model


def greedy_answer(model: torch.nn.Module, tokenizer: Tokenizer, prompt: str) -> str:
    """Greedy chat answer to ``prompt`` (up to 48 tokens), decoded without special tokens."""
    ids = torch.tensor([tokenizer.encode(chat_prompt(prompt)).ids])
    out: list[int] = []
    with torch.no_grad():
        for _ in range(48):
            next_id = int(model(input_ids=ids).logits[0, -1].argmax())
            if next_id == EOS_ID:
                break
            out.append(next_id)
            ids = torch.cat([ids, torch.tensor([[next_id]])], dim=1)
    return tokenizer.decode(out, skip_special_tokens=True)
