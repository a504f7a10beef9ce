"""Fixtures for the LoRA manager tests: a real moto S3 server on 127.0.0.1 and adapter files."""

from __future__ import annotations

import io
import json
import os
import socket
import struct
import subprocess
import sys
import tarfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from lorafleet.process.parent_death import die_with_parent

MOTO_START_TIMEOUT_S = 30.0
ACCESS_KEY_ID = "AKIALORAFLEETTEST"
SECRET_ACCESS_KEY = "lorafleet-test-secret-do-not-leak"


def adapter_files(rank: int = 4, base: str = "demo-base") -> dict[str, bytes]:
    """Return the two files of a small but complete PEFT adapter (safetensors written by hand)."""
    config = {"base_model_name_or_path": base, "peft_type": "LORA", "r": rank, "lora_alpha": 8}
    data = bytes(range(256)) * rank
    header = json.dumps(
        {"lora_A.weight": {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]}}
    ).encode()
    weights = struct.pack("<Q", len(header)) + header + data
    return {
        "adapter_config.json": json.dumps(config).encode(),
        "adapter_model.safetensors": weights,
    }


def write_adapter(path: Path, files: dict[str, bytes] | None = None) -> Path:
    """Write an adapter's files into ``path`` (created) and return it."""
    path.mkdir(parents=True, exist_ok=True)
    for name, data in (files or adapter_files()).items():
        (path / name).write_bytes(data)
    return path


def tar_gz(files: dict[str, bytes]) -> bytes:
    """A .tar.gz holding ``files`` in one folder, as adapters are often archived."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"robot/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def make_adapter() -> Callable[..., Path]:
    """Give tests ``write_adapter`` without importing a helper module."""
    return write_adapter


@pytest.fixture
def adapter_bytes() -> Callable[..., dict[str, bytes]]:
    """Give tests ``adapter_files``."""
    return adapter_files


@dataclass
class MotoServer:
    """A moto S3 server in its own process, recording every request it serves."""

    endpoint: str
    recording: Path
    process: subprocess.Popen[bytes]

    def reset_requests(self) -> None:
        """Forget the requests served so far."""
        request = urllib.request.Request(
            f"{self.endpoint}/moto-api/recorder/reset-recording", method="POST"
        )
        urllib.request.urlopen(request, timeout=10).close()

    def requests(self) -> list[str]:
        """Return ``METHOD url`` of every S3 request served since the last reset."""
        if not self.recording.exists():
            return []
        lines = self.recording.read_text().splitlines()
        return [f"{json.loads(line)['method']} {json.loads(line)['url']}" for line in lines]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_moto(workdir: Path, extra_env: dict[str, str] | None = None) -> MotoServer:
    """Start ``moto_server`` on a free port of 127.0.0.1 and wait until it answers."""
    port = _free_port()
    recording = workdir / f"moto-{port}.jsonl"
    env = {**os.environ, "MOTO_ENABLE_RECORDING": "1", "MOTO_RECORDER_FILEPATH": str(recording)}
    env.update(extra_env or {})
    binary = Path(sys.executable).with_name("moto_server")
    process = subprocess.Popen(
        die_with_parent([str(binary), "-H", "127.0.0.1", "-p", str(port)]),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = MotoServer(f"http://127.0.0.1:{port}", recording, process)
    deadline = time.monotonic() + MOTO_START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{server.endpoint}/moto-api/", timeout=1).close()
            return server
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"moto_server did not start on port {port}")


def stop_moto(server: MotoServer) -> None:
    """Terminate the server process started by :func:`start_moto`."""
    server.process.terminate()
    server.process.wait(timeout=10)


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """One S3 endpoint for the session (buckets are unique per test)."""
    server = start_moto(tmp_path_factory.mktemp("moto"))
    yield server
    stop_moto(server)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, moto: MotoServer) -> MotoServer:
    """Point the standard AWS environment (read by boto3 in the manager) at moto."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws/config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws/credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    return moto


@pytest.fixture
def bucket(moto: MotoServer) -> Any:
    """A fresh bucket on the moto server, as a boto3 Bucket resource made outside the manager."""
    s3 = boto3.resource(
        "s3",
        endpoint_url=moto.endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
    )
    created = s3.create_bucket(Bucket=f"loras-{uuid.uuid4().hex[:12]}")
    return created


@pytest.fixture
def upload(bucket: Any) -> Callable[..., str]:
    """Upload ``files`` under ``prefix`` and return the adapter's ``s3://`` URI."""

    def _upload(prefix: str, files: dict[str, bytes] | None = None) -> str:
        for name, data in (files or adapter_files()).items():
            bucket.put_object(Key=f"{prefix}/{name}", Body=data)
        return f"s3://{bucket.name}/{prefix}"

    return _upload


@pytest.fixture
def start_s3_server(tmp_path: Path) -> Iterator[Callable[..., MotoServer]]:
    """Start extra moto servers (e.g. one that checks credentials); stopped after the test."""
    started: list[MotoServer] = []

    def _start(extra_env: dict[str, str] | None = None) -> MotoServer:
        started.append(start_moto(tmp_path, extra_env))
        return started[-1]

    yield _start
    for server in started:
        stop_moto(server)


@pytest.fixture
def aws_secret() -> str:
    """The secret access key the tests use; it must never appear in a message or log."""
    return SECRET_ACCESS_KEY
