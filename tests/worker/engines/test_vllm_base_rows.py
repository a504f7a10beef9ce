"""How the vllm engine keeps base rows off adapter weights, decided without vLLM installed."""

from __future__ import annotations

import pytest

from lorafleet.proto.errors import InvalidRequestError
from lorafleet.worker.engines._vllm_base_rows import (
    MASKED_VLLM_VERSIONS,
    BaseRowsPlan,
    base_rows_plan,
    option_switch,
)

CHECKED = sorted(MASKED_VLLM_VERSIONS)[-1]
MASK, GATE, NEITHER = (BaseRowsPlan(mask=True, gate=False), BaseRowsPlan(mask=False, gate=True),
                       BaseRowsPlan(mask=False, gate=False))  # fmt: skip


@pytest.mark.parametrize(
    ("value", "mode"), [(None, "auto"), ("auto", "auto"), (True, "on"), (False, "off")]
)
def test_a_switch_option_reads_auto_or_a_boolean(value: object, mode: str) -> None:
    options = {} if value is None else {"isolate_base_rows": value}
    assert option_switch(options, "isolate_base_rows") == mode


def test_a_switch_option_rejects_anything_else() -> None:
    with pytest.raises(InvalidRequestError, match="mask_base_rows"):
        option_switch({"mask_base_rows": "yes"}, "mask_base_rows")


@pytest.mark.parametrize(
    ("options", "cpu", "version", "plan"),
    [
        ({}, True, CHECKED, MASK),  # the default on CPU: masked, no gate
        ({}, True, "0.99.0", GATE),  # a release nobody checked: the gate, as before
        ({"worker_extension_cls": "my.Ext"}, True, CHECKED, GATE),  # its slot is taken
        ({}, False, CHECKED, NEITHER),  # GPU kernels skip base rows
        ({"isolate_base_rows": True}, False, CHECKED, GATE),
        ({"mask_base_rows": False}, True, CHECKED, GATE),
        ({"mask_base_rows": False, "isolate_base_rows": False}, True, CHECKED, NEITHER),
    ],
)  # fmt: skip
def test_the_plan_masks_where_it_can_and_gates_where_it_must(
    options: dict[str, object], cpu: bool, version: str, plan: BaseRowsPlan
) -> None:
    assert base_rows_plan(options, lora=True, cpu=cpu, vllm_version=version) == plan


def test_without_lora_there_is_nothing_to_keep_apart() -> None:
    assert base_rows_plan({}, lora=False, cpu=True, vllm_version=CHECKED) == NEITHER


def test_asking_for_the_mask_where_it_cannot_apply_names_the_way_out() -> None:
    with pytest.raises(InvalidRequestError, match=r"0\.99\.0.*isolate_base_rows=true"):
        base_rows_plan({"mask_base_rows": True}, lora=True, cpu=True, vllm_version="0.99.0")
