"""Desired-state records: validation names the bad field, encoding round-trips readably."""

from __future__ import annotations

import pytest

from lorafleet.proto.adapters import (
    AdapterSpec,
    AdapterStatus,
    LoraSource,
    decode_adapter_spec,
    encode_adapter_spec,
    validate_adapter_spec,
)
from lorafleet.proto.errors import InvalidRequestError


def _spec(**changes: object) -> AdapterSpec:
    fields: dict[str, object] = {
        "name": "org/pirate", "base_model": "demo",
        "source": LoraSource(uri="s3://bucket/pirate"), "replicas": 0,
    }  # fmt: skip
    return AdapterSpec(**(fields | changes))  # type: ignore[arg-type]


@pytest.mark.parametrize("replicas", [0, 3, "all"])
def test_valid_specs_pass_unchanged(replicas: int | str) -> None:
    spec = _spec(replicas=replicas)
    assert validate_adapter_spec(spec) is spec


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"name": "../etc"}, "name '../etc'"),
        ({"name": "demo"}, "base model's name"),
        ({"base_model": " "}, "base_model"),
        ({"replicas": -1}, "replicas"),
        ({"source": LoraSource(uri="/no/scheme")}, "source.uri"),
        ({"source": LoraSource(uri="s3://")}, "source.uri"),
    ],
)
def test_invalid_specs_are_refused_naming_the_field(changes: dict, named: str) -> None:
    with pytest.raises(InvalidRequestError, match=named.replace(".", r"\.")):
        validate_adapter_spec(_spec(**changes))


def test_spec_round_trips_as_indented_json() -> None:
    raw = encode_adapter_spec(_spec(pinned=True))
    assert b'\n  "name": "org/pirate"' in raw
    assert decode_adapter_spec(raw) == _spec(pinned=True)


def test_status_is_a_spec_with_where_it_is_loaded() -> None:
    status = AdapterStatus(
        name="a", base_model="demo", source=LoraSource(uri="file:///a"), instances=["1f"]
    )
    assert isinstance(status, AdapterSpec)
    assert (status.replicas, status.instances, status.warnings) == (1, ["1f"], [])
