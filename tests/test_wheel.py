"""The built wheel installs beside Google's client libraries: every import name it ships
starts with ``lorafleet``, and ``bench`` stays in the repository.

proto-plus (a dependency of every ``google-cloud-*`` library) installs a top-level ``proto``;
lorafleet's wheel used to install one too, and replaced it. The wheel is built from this
tree and installed with proto-plus into a fresh venv; the packages come from the package
index (pip's configuration), nothing is mocked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BESIDE = ("proto-plus", "protobuf", "msgspec", "blake3")
"""proto-plus and what importing it and ``lorafleet.proto`` needs, installed --no-deps."""

NOT_SOURCE = (".git", ".venv*", ".lorafleet", "build", "dist", "*.egg-info", "__pycache__",
              ".*_cache")  # fmt: skip

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel pip builds from this tree, as a user's ``pip install .`` would."""
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools leaves build/ and an egg-info where it builds.
    source = tmp_path_factory.mktemp("source") / "lorafleet"
    shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out),
                    str(source)], check=True, timeout=600)  # fmt: skip
    (built,) = out.glob("lorafleet-*.whl")
    return built


def test_every_name_in_the_wheel_starts_with_lorafleet_and_bench_is_left_out(
    wheel: Path,
) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/", 1)[0] for name in names} == {
        "lorafleet",
        wheel.name.split("-py3")[0] + ".dist-info",
    }
    assert not [name for name in names if "bench" in name.split("/")]
    for module in ("proto/__init__.py", "worker/config.py", "frontend/__main__.py"):
        assert f"lorafleet/{module}" in names


def test_the_wheel_installs_beside_proto_plus_and_both_import(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)  # fmt: skip
    python = venv / "bin" / "python"
    # Without PYTHONPATH: pip would take this tree's lorafleet.egg-info for an install.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    install = ["install", "-q", "--no-deps", str(wheel), *BESIDE]
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), *install],
                   check=True, timeout=600, env=env)  # fmt: skip
    check = ("import proto, lorafleet.proto; "
             "print(proto.Message.__name__, lorafleet.proto.LorafleetError.__name__)")  # fmt: skip
    # -I: neither this repository nor PYTHONPATH may stand in for what was installed.
    result = subprocess.run([str(python), "-I", "-c", check], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["Message", "LorafleetError"]
