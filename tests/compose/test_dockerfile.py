"""Check the Dockerfile's targets against compose.yaml and the requirements it installs.

Building the images needs an engine: `make test-compose` does that.
"""

import re
import subprocess
import sys
from typing import Final

from compose_cli import REPO, resolved

DOCKERFILE: Final = REPO / "Dockerfile"
REQUIREMENTS_SCRIPT: Final = REPO / "scripts" / "pyproject_requirements.py"


def requirements(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the Dockerfile's requirements script in the repository, as the build does."""
    command = [sys.executable, str(REQUIREMENTS_SCRIPT), *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)


def test_every_build_target_exists_in_dockerfile() -> None:
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", DOCKERFILE.read_text(), re.MULTILINE))
    services = resolved("--profile", "*")["services"]
    targets = {s["build"]["target"] for s in services.values() if "build" in s}
    assert targets == {"hf", "slim", "vllm"}
    assert targets <= stages


def test_the_build_context_holds_the_package() -> None:
    """An image whose context lacks ``lorafleet/`` installs nothing importable."""
    kept = {
        line[1:].strip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert "lorafleet" in kept


def test_slim_requirements_have_no_torch() -> None:
    result = requirements("--base", "s3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("boto3") for line in lines)
    assert any(line.startswith("nats-py") for line in lines)
    assert not any(line.startswith("torch") for line in lines)


def test_hf_requirements_pin_torch_without_base() -> None:
    lines = requirements("hf").stdout.splitlines()
    assert any(line.startswith("torch==") for line in lines)
    assert not any(line.startswith("nats-py") for line in lines)


def test_unknown_extra_fails_the_build() -> None:
    result = requirements("--base", "hff")
    assert result.returncode != 0
    assert "hff" in result.stderr
