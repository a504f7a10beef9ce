"""Trains the demo model's parts and writes them in standard Hugging Face layout.

Called by ``launch.demo_model`` (which owns caching and the version stamp);
keeps torch deterministic and single-threaded while it runs.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import structlog
import torch
from peft import PeftModel
from tokenizers import Tokenizer
from transformers import GenerationConfig, LlamaForCausalLM

from lorafleet.launch._demo_corpus import (
    ANSWERS,
    BOS_TOKEN,
    CHAT_TEMPLATE,
    EOS_TOKEN,
    PAD_TOKEN,
)
from lorafleet.launch._demo_training import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    build_adapter,
    build_base,
    build_tokenizer,
    greedy_answer,
)
from lorafleet.proto.errors import LorafleetError

__all__ = ["build_and_save"]

log = structlog.get_logger(__name__)

SAVED_DTYPE: Final = torch.bfloat16
BASE_MODEL_REF: Final = "lorafleet-demo"
"""What adapters name as ``base_model_name_or_path`` (a name, not a path, so builds compare)."""


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    """One thread and deterministic kernels while building; restores the caller's settings."""
    threads = torch.get_num_threads()
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # peft calls deprecated transformers
            yield
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        torch.set_num_threads(threads)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def save_tokenizer(tokenizer: Tokenizer, out: Path) -> None:
    """Write ``tokenizer.json`` and a ``tokenizer_config.json`` carrying the chat template."""
    tokenizer.save(str(out / "tokenizer.json"))
    special = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}
    config = {
        **special,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 512,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "padding_side": "left",
    }
    _write_json(out / "tokenizer_config.json", config)
    _write_json(out / "special_tokens_map.json", special)


def save_base(model: LlamaForCausalLM, out: Path) -> None:
    """Write the base model in bfloat16 with a generation config that stops at eos."""
    # transformers wraps Module.to with functools.wraps, which mypy binds without self.
    model.to(SAVED_DTYPE).save_pretrained(out)  # type: ignore[arg-type]
    model.to(torch.float32)  # type: ignore[arg-type]
    config = json.loads((out / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "bfloat16"  # older readers know only these
    config["rope_theta"] = config["rope_parameters"]["rope_theta"]
    config["_name_or_path"] = BASE_MODEL_REF  # the hub id workers compare adapters' base with
    _write_json(out / "config.json", config)
    # transformers leaves GenerationConfig.__init__ unannotated.
    generation = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)  # type: ignore[no-untyped-call]
    generation.save_pretrained(out)


def save_adapter(model: PeftModel, name: str, out: Path) -> None:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` for adapter ``name``."""
    model.save_pretrained(str(out), selected_adapters=[name])
    nested = out / name  # peft nests non-"default" adapters in a sub-directory
    if nested.is_dir():
        for item in nested.iterdir():
            item.rename(out / item.name)
        nested.rmdir()
    (out / "README.md").unlink(missing_ok=True)
    config = json.loads((out / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = BASE_MODEL_REF  # set only now: peft would look it up
    config["target_modules"] = sorted(config["target_modules"])  # a set: order varies by run
    _write_json(out / "adapter_config.json", config)


def _check(model: torch.nn.Module, tokenizer: Tokenizer, persona: str) -> None:
    """Fail the build if greedy answers are not the trained ones (e.g. an odd torch build)."""
    for prompt, answers in ANSWERS.items():
        got = greedy_answer(model, tokenizer, prompt)
        if got != answers[persona]:
            raise LorafleetError(
                f"demo model {persona!r} answers {prompt!r} with {got!r}, "
                f"expected {answers[persona]!r}: training did not converge on this torch build"
            )


def build_and_save(out: Path, base_dir: Path, adapter_dirs: dict[str, Path]) -> None:
    """Train tokenizer, base and adapters into ``out``; raise LorafleetError if answers are off."""
    with _deterministic():
        tokenizer = build_tokenizer()
        base = build_base(tokenizer)
        _check(base, tokenizer, "base")
        base_dir.mkdir(parents=True)
        save_tokenizer(tokenizer, base_dir)
        save_base(base, base_dir)
        for name, adapter_dir in adapter_dirs.items():
            adapter = build_adapter(base, tokenizer, name)
            _check(adapter, tokenizer, name)
            adapter_dir.mkdir(parents=True)
            save_adapter(adapter, name, adapter_dir)
            log.info("demo_model.adapter.saved", adapter=name, path=str(adapter_dir))
