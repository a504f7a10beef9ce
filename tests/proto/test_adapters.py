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
from lorafleet.proto.slo import SloTargets


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
        ({"slo": SloTargets(ttft_p95_ms=-5)}, "slo.ttft_p95_ms"),
        ({"slo": SloTargets(ttft_p95_ms=0)}, "slo.ttft_p95_ms"),
        ({"slo": SloTargets(itl_p95_ms=1e9)}, "slo.itl_p95_ms"),
        ({"slo": SloTargets(itl_p95_ms=float("nan"))}, "slo.itl_p95_ms"),
    ],
)
def test_invalid_specs_are_refused_naming_the_field(changes: dict, named: str) -> None:
    with pytest.raises(InvalidRequestError, match=named.replace(".", r"\.")):
        validate_adapter_spec(_spec(**changes))


def test_spec_round_trips_as_indented_json() -> None:
    raw = encode_adapter_spec(_spec(pinned=True))
    assert b'\n  "name": "org/pirate"' in raw
    assert decode_adapter_spec(raw) == _spec(pinned=True)


def test_latency_targets_round_trip_and_a_spec_without_them_reads_as_before() -> None:
    spec = validate_adapter_spec(_spec(slo=SloTargets(ttft_p95_ms=300, itl_p95_ms=40.5)))
    assert decode_adapter_spec(encode_adapter_spec(spec)) == spec
    assert b'"slo": {\n    "ttft_p95_ms": 300,' in encode_adapter_spec(spec)
    assert decode_adapter_spec(encode_adapter_spec(_spec())).slo is None


def test_status_is_a_spec_with_where_it_is_loaded() -> None:
    status = AdapterStatus(
        name="a", base_model="demo", source=LoraSource(uri="file:///a"), instances=["1f"]
    )
    assert isinstance(status, AdapterSpec)
    assert (status.replicas, status.instances, status.warnings) == (1, ["1f"], [])
