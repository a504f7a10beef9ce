"""The vllm engine's adapter table: slots, conflicts, resolution and draining of requests."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from proto.errors import CapacityError, ConflictError, InvalidRequestError, NotFoundError
from worker.engines._adapter_table import AdapterTable, check_adapter_dir


@dataclass(frozen=True)
class Handle:
    lora_int_id: int


def _table(*names: str, max_loras: int = 2) -> AdapterTable[Handle]:
    table: AdapterTable[Handle] = AdapterTable(base_model="demo", max_loras=max_loras)
    for index, name in enumerate(names, start=1):
        table.put(name, Handle(index))
    return table


def test_base_model_resolves_to_no_adapter_and_an_adapter_to_its_handle() -> None:
    table = _table("pirate")
    assert table.resolve("demo") is None
    assert table.resolve("pirate") == Handle(1)


def test_unknown_model_is_not_found_and_the_error_lists_what_is_served() -> None:
    with pytest.raises(NotFoundError, match=r"'nope'.*'demo'.*\['pirate', 'robot'\]"):
        _table("pirate", "robot").resolve("nope")


def test_adding_beyond_max_loras_is_a_capacity_error_naming_the_loaded() -> None:
    with pytest.raises(CapacityError, match=r"all 2 adapter slots.*\['pirate', 'robot'\]"):
        _table("pirate", "robot").check_new("chef", 9)


def test_same_name_and_id_again_is_no_new_work_but_another_id_conflicts() -> None:
    table = _table("pirate")
    assert table.check_new("pirate", 1) is True
    with pytest.raises(ConflictError, match="lora_id 1"):
        table.check_new("pirate", 5)
    with pytest.raises(ConflictError, match="taken by 'pirate'"):
        table.check_new("robot", 1)


def test_an_adapter_cannot_take_the_base_model_name() -> None:
    with pytest.raises(InvalidRequestError, match="base model"):
        _table().check_new("demo", 3)


def test_popped_adapter_no_longer_resolves_and_popping_it_again_is_not_found() -> None:
    table = _table("pirate")
    assert table.pop("pirate") == Handle(1)
    with pytest.raises(NotFoundError):
        table.resolve("pirate")
    with pytest.raises(NotFoundError, match="not loaded"):
        table.pop("pirate")


async def test_wait_idle_returns_once_the_running_requests_end() -> None:
    table, done = _table("pirate"), asyncio.Event()

    async def request() -> None:
        async with table.tracked("pirate", "r1"):
            await done.wait()

    task = asyncio.create_task(request())
    await asyncio.sleep(0)
    assert table.running("pirate") == ["r1"]
    waiter = asyncio.create_task(table.wait_idle("pirate", timeout_s=5))
    await asyncio.sleep(0)
    done.set()
    assert await waiter == []
    await task


async def test_wait_idle_gives_up_after_its_timeout_and_names_the_stragglers() -> None:
    table, never = _table("pirate"), asyncio.Event()

    async def request() -> None:
        async with table.tracked("pirate", "slow"):
            await never.wait()

    task = asyncio.create_task(request())
    await asyncio.sleep(0)
    assert await table.wait_idle("pirate", timeout_s=0.05) == ["slow"]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert table.running("pirate") == []


def _adapter_dir(path: Path, **config: object) -> Path:
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


def test_adapter_dir_within_the_rank_limit_passes(tmp_path: Path) -> None:
    check_adapter_dir("pirate", _adapter_dir(tmp_path, r=8, rank_pattern={}), max_rank=8)


def test_adapter_whose_rank_exceeds_the_limit_is_refused_naming_both(tmp_path: Path) -> None:
    path = _adapter_dir(tmp_path, r=8, rank_pattern={"q_proj": 32})
    with pytest.raises(InvalidRequestError, match=r"rank 32.*at most 16"):
        check_adapter_dir("big", path, max_rank=16)


def test_directory_without_adapter_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match=r"adapter_config\.json"):
        check_adapter_dir("ghost", tmp_path, max_rank=8)
