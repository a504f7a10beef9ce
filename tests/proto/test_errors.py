"""The error-code tables that the frontend and the worker's status server share."""

from __future__ import annotations

import pytest

from lorafleet.proto.errors import error_code, http_status


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, "invalid_request"),
        (404, "not_found"),
        (405, "method_not_allowed"),
        (408, "request_timeout"),
        (413, "payload_too_large"),
        (415, "invalid_request"),  # any other client error
        (500, "internal_error"),
        (503, "internal_error"),  # any server error the framework answered itself
    ],
)
def test_a_framework_s_http_error_gets_its_code(status: int, code: str) -> None:
    assert error_code(status) == code


def test_the_codes_of_statuses_map_back_to_those_statuses() -> None:
    for status in (404, 408, 413):
        assert http_status(error_code(status)) == status
