"""Frontend errors: messages that name what exists without listing everything."""

from __future__ import annotations

from lorafleet.frontend.errors import MAX_NAMES_IN_MESSAGE, ModelNotFoundError


def test_not_found_names_the_first_models_and_counts_the_rest_from_a_given_total() -> None:
    first = [f"m{index:05d}" for index in range(MAX_NAMES_IN_MESSAGE)]
    error = ModelNotFoundError("parrot", first, total=10_000)
    assert "m00000, m00001, m00002" in str(error)
    last = f"m{MAX_NAMES_IN_MESSAGE - 1:05d}"
    assert str(error).endswith(f"{last} and {10_000 - MAX_NAMES_IN_MESSAGE} more")


def test_not_found_with_every_name_sorts_them_and_counts_them() -> None:
    error = ModelNotFoundError("parrot", ["b", "a"])
    assert str(error).endswith("available models: a, b")
