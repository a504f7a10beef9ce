"""Validate compose.secure.yaml (NATS authorization, etcd auth) with Compose v2.

`config` resolves the override on top of compose.yaml in every profile without a Docker
engine: every process that talks to NATS or etcd must get its own credentials, and a
missing password must stop Compose before anything starts, naming the variable.
"""

import subprocess
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from compose_cli import REPO, SECURE_FILE, compose, resolved

from lorafleet.launch.compose_secrets import (
    COMPOSE_SECRETS,
    DEFAULT_SECRETS_PATH,
    write_compose_secrets,
)

PROFILES: Final = [None, "gpu", "mocker"]
NATS_USER_BY_SERVICE: Final = {
    "adapters": "admin",
    "frontend": "frontend",
    "worker": "worker",
    "worker-vllm": "worker",
    "worker-mocker": "worker",
}
"""Every service that talks to NATS or etcd, and its user in deploy/nats/auth.conf."""
SECRETS: Final = {name: f"lf{name.lower()}-value" for name in COMPOSE_SECRETS}


def _project(profile: str | None, env: dict[str, str] = SECRETS) -> dict[str, Any]:
    args = ["--profile", profile] if profile else []
    return resolved(*args, overrides=(SECURE_FILE,), env=env)


@pytest.mark.parametrize("profile", PROFILES)
def test_every_process_gets_its_own_credentials(profile: str | None) -> None:
    services = _project(profile)["services"]
    present = set(NATS_USER_BY_SERVICE) & set(services)
    assert present, profile
    for name in present:
        env, role = services[name]["environment"], NATS_USER_BY_SERVICE[name]
        assert env["NATS_AUTH_USERNAME"] == role, name
        assert env["NATS_AUTH_PASSWORD"] == SECRETS[f"LORAFLEET_NATS_{role.upper()}_PASSWORD"]
        assert env["ETCD_AUTH_USERNAME"] == "lorafleet", name
        assert env["ETCD_AUTH_PASSWORD"] == SECRETS["LORAFLEET_ETCD_PASSWORD"], name
        condition = services[name]["depends_on"]["etcd-auth"]["condition"]
        assert condition == "service_completed_successfully", name


def test_nats_runs_with_the_authorization_config() -> None:
    nats = _project(None)["services"]["nats"]
    config = nats["command"][nats["command"].index("-c") + 1]
    (mount,) = [v for v in nats["volumes"] if v["target"] == config]
    assert Path(mount["source"]) == REPO / "deploy" / "nats" / "auth.conf"
    assert mount["read_only"] is True
    for role in ("admin", "frontend", "worker"):
        variable = f"LORAFLEET_NATS_{role.upper()}_PASSWORD"
        assert nats["environment"][variable] == SECRETS[variable]
    assert nats["environment"]["LORAFLEET_NATS_SUBJECTS"] == "lorafleet.>"


def test_etcd_auth_job_waits_for_etcd_and_creates_root() -> None:
    services = _project(None)["services"]
    job = services["etcd-auth"]
    assert job["environment"]["ETCD_ROOT_PASSWORD"] == SECRETS["LORAFLEET_ETCD_ROOT_PASSWORD"]
    assert job["environment"]["ETCD_AUTH_PASSWORD"] == SECRETS["LORAFLEET_ETCD_PASSWORD"]
    assert job["depends_on"]["etcd"]["condition"] == "service_healthy"
    assert job["build"]["target"] == "etcd-auth"
    assert "FROM slim AS etcd-auth" in (REPO / "Dockerfile").read_text()


def test_worker_token_is_required_and_shared_with_frontends() -> None:
    services = _project(None)["services"]
    for name in ("worker", "frontend"):
        token = services[name]["environment"]["DYN_SYSTEM_AUTH_TOKEN"]
        assert token == SECRETS["DYN_SYSTEM_AUTH_TOKEN"], name


@pytest.mark.parametrize("missing", COMPOSE_SECRETS)
def test_a_missing_secret_fails_naming_its_variable(missing: str) -> None:
    env = {name: value for name, value in SECRETS.items() if name != missing}
    result = compose("config", "-q", overrides=(SECURE_FILE,), env=env)
    assert result.returncode != 0
    assert f"set {missing}" in result.stderr


def test_no_secret_value_is_checked_in() -> None:
    """Every password or token the override sets is a required variable, never a value."""
    text = SECURE_FILE.read_text()
    document = yaml.safe_load(text)
    blocks = [v for k, v in document.items() if k.startswith("x-") and isinstance(v, dict)]
    blocks += [s.get("environment", {}) for s in document["services"].values()]
    values = {
        key: value
        for block in blocks
        if isinstance(block, dict)
        for key, value in block.items()
        if "PASSWORD" in key or "TOKEN" in key
    }
    assert values
    for key, value in values.items():
        assert value.startswith("${") and ":?" in value, key


def test_make_secrets_writes_every_variable_once(tmp_path: Path) -> None:
    path = tmp_path / "compose-secrets.env"
    assert write_compose_secrets(path)
    first = path.read_text()
    assert [line.split("=")[0] for line in first.splitlines()] == list(COMPOSE_SECRETS)
    assert path.stat().st_mode & 0o077 == 0
    assert not write_compose_secrets(path)  # kept: etcd's volume holds the first passwords
    assert path.read_text() == first
    result = compose("--env-file", str(path), "config", "-q", overrides=(SECURE_FILE,))
    assert result.returncode == 0, result.stderr


def test_the_secrets_file_is_git_ignored() -> None:
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(DEFAULT_SECRETS_PATH)], cwd=REPO, check=False
    )
    assert ignored.returncode == 0
