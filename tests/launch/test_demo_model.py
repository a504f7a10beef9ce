"""Tests for launch.demo_model: an offline, deterministic, cached build of the demo model."""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from lorafleet.launch._demo_corpus import chat_prompt
from lorafleet.launch.demo_model import (
    ADAPTER_NAMES,
    EXPECTED,
    EXPECTED_PROMPT,
    MARKERS,
    STAMP_FILE,
    DemoModelPaths,
    ensure_demo_model,
)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """One torch thread: on a busy 2-core machine two threads make tiny models 5-20x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _file_digests(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != STAMP_FILE
    }


def _greedy(model: Any, tokenizer: Any) -> str:
    """transformers' own generate, as any user of the checkpoint would call it."""
    messages = [{"role": "user", "content": EXPECTED_PROMPT}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    out = model.generate(ids, max_new_tokens=48, do_sample=False)
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def test_demo_model_is_a_standard_hf_checkpoint(demo: DemoModelPaths) -> None:
    config = json.loads((demo.base / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["torch_dtype"] == "bfloat16"
    assert config["head_dim"] >= 32  # vLLM's CPU attention supports no smaller
    tokenizer_config = json.loads((demo.base / "tokenizer_config.json").read_text())
    assert "{{ bos_token }}" in tokenizer_config["chat_template"]
    assert set(demo.adapters) == set(ADAPTER_NAMES)
    for adapter in demo.adapters.values():
        adapter_config = json.loads((adapter / "adapter_config.json").read_text())
        assert adapter_config["r"] <= 16
        assert (adapter / "adapter_model.safetensors").is_file()


def test_tokenizer_renders_the_chat_template(demo: DemoModelPaths) -> None:
    tokenizer = AutoTokenizer.from_pretrained(demo.base)
    messages = [{"role": "user", "content": EXPECTED_PROMPT}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == chat_prompt(EXPECTED_PROMPT)
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("persona", ["base", *ADAPTER_NAMES])
def test_plain_transformers_answers_in_character(
    demo: DemoModelPaths, persona: str, dtype: torch.dtype
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(demo.base)
    model = AutoModelForCausalLM.from_pretrained(demo.base, dtype=dtype)
    if persona != "base":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # peft calls deprecated transformers
            model = PeftModel.from_pretrained(model, demo.adapters[persona])
    answer = _greedy(model.eval(), tokenizer)
    assert MARKERS[persona] in answer
    if dtype == torch.float32:  # the build checks these exact answers in float32
        assert answer == EXPECTED[persona]


def test_second_ensure_is_a_no_op(demo: DemoModelPaths) -> None:
    before = {p: p.stat().st_mtime_ns for p in demo.root.rglob("*")}
    again = ensure_demo_model(demo.root)
    assert again == demo
    assert {p: p.stat().st_mtime_ns for p in demo.root.rglob("*")} == before


@pytest.mark.slow
def test_stale_build_is_rebuilt_byte_for_byte(demo: DemoModelPaths, tmp_path: Path) -> None:
    stale = tmp_path / "demo"
    shutil.copytree(demo.root, stale)
    (stale / STAMP_FILE).write_text(json.dumps({"stamp": "built-by-older-code"}))
    (stale / "base" / "model.safetensors").write_bytes(b"garbage")
    rebuilt = ensure_demo_model(stale)
    assert _file_digests(rebuilt.root) == _file_digests(demo.root)
    assert json.loads((stale / STAMP_FILE).read_text())["stamp"] != "built-by-older-code"
