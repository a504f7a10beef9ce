"""Safetensors by content: files fed as bytes, each judged as the safetensors library judges it."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

from lorafleet.fleet.safetensors_file import safetensors_problem

NAME = "adapter_model.safetensors"


def _file(header: object, data: bytes = b"", *, length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def _u8(begin: int, end: int, shape: list[int] | None = None) -> dict[str, object]:
    return {"dtype": "U8", "shape": [end - begin] if shape is None else shape,
            "data_offsets": [begin, end]}  # fmt: skip


BAD = {
    "a 10-byte file whose header length is 2^40": (
        struct.pack("<Q", 1 << 40) + b"{}",
        "is not a safetensors file (its first 8 bytes declare a header of 1099511627776 bytes",
    ),
    "a header claiming a tensor of 2^40 bytes": (
        _file({"w": _u8(0, 1 << 40)}, b"\0" * 4),
        "is truncated, or its header lies (",
    ),
    "a tensor ending one byte past the file": (
        _file({"a": _u8(0, 4), "b": _u8(4, 9)}, b"\0" * 8),
        "is truncated, or its header lies (",
    ),
    "the text of /etc/passwd": (
        b"root:x:0:0:root:/root:/bin/bash\n",
        "is not a safetensors file (its first 8 bytes declare a header of",
    ),
    "fewer than 8 bytes": (b"\1\2", "is not a safetensors file (2 bytes"),
    "a header length of 0": (b"\0" * 16, "declare a header of 0 bytes"),
    "a header that is no JSON object": (_file(b"[1, 2]"), "its header is not a JSON object"),
    "a header cut short": (_file({"w": _u8(0, 4)})[:20], "is truncated (in its header)"),
    "a header that is no JSON": (_file(b"{nope"), "its header is not valid JSON"),
    "a tensor without offsets": (
        _file({"w": {"dtype": "U8", "shape": [4]}}, b"\0" * 4),
        "tensor 'w' has no valid dtype, shape and data_offsets",
    ),
    "a shape that needs more bytes than the offsets give": (
        _file({"w": _u8(0, 4, shape=[2, 4])}, b"\0" * 4),
        "tensor 'w' has no valid dtype, shape and data_offsets",
    ),
    "a gap between two tensors": (
        _file({"a": _u8(0, 4), "b": _u8(6, 8)}, b"\0" * 8),
        "tensor 'b' does not start where the one before ends",
    ),
    "bytes after the last tensor": (
        _file({"a": _u8(0, 4)}, b"\0" * 6),
        "is not a safetensors file (2 bytes follow its last tensor)",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_file_that_is_no_whole_safetensors_file_is_refused_as_the_library_refuses_it(
    tmp_path: Path, case: str
) -> None:
    data, problem = BAD[case]
    weights = tmp_path / NAME
    weights.write_bytes(data)

    found = safetensors_problem(weights)

    assert found is not None and found.startswith(NAME) and problem in found, found
    with pytest.raises(Exception):  # noqa: B017 - the library's own error (SafetensorError)
        safetensors.numpy.load(data)


def test_files_the_library_writes_pass_with_metadata_many_dtypes_or_no_tensor(
    tmp_path: Path,
) -> None:
    tensors = {
        "lora_A.weight": np.ones((8, 64), dtype=np.float32),
        "lora_B.weight": np.zeros((64, 8), dtype=np.float16),
        "mask": np.array([True, False, True]),
        "ids": np.arange(5, dtype=np.int64),
    }
    for n, saved in enumerate([tensors, {}]):
        weights = tmp_path / f"{n}.safetensors"
        weights.write_bytes(safetensors.numpy.save(saved, metadata={"format": "pt"}))

        assert safetensors_problem(weights) is None
