"""The compose stack's ``etcd-auth`` one-shot, run for real against a local etcd (no Docker).

compose.secure.yaml's service runs ``python -m lorafleet.launch.etcd_auth_job`` with etcdctl,
as here: these tests run that same command, so what they show about the grants holds for compose.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lorafleet.discovery.keys import KEYS_ROOT
from lorafleet.launch.local_servers import LocalServer, find_binary

SECURE_FILE = Path(__file__).resolve().parents[2] / "compose.secure.yaml"
ROOT_PASSWORD = "lfroot-test-password"
USER_PASSWORD = "lfuser-test-password"


def _run_job(etcd: LocalServer, **overrides: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "ETCD_ENDPOINTS": etcd.url,
        "ETCD_ROOT_PASSWORD": ROOT_PASSWORD,
        "ETCD_AUTH_USERNAME": "lorafleet",
        "ETCD_AUTH_PASSWORD": USER_PASSWORD,
    } | overrides
    command = [sys.executable, "-m", "lorafleet.launch.etcd_auth_job"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def _etcdctl(
    etcd: LocalServer, *args: str, user: str | None = None
) -> subprocess.CompletedProcess[str]:
    command = [str(find_binary("etcdctl")), f"--endpoints={etcd.url}"]
    command += [f"--user={user}"] if user else []
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=30)


def test_the_lorafleet_user_reaches_only_its_prefix(own_etcd: LocalServer) -> None:
    result = _run_job(own_etcd)
    assert result.returncode == 0, result.stderr
    user = f"lorafleet:{USER_PASSWORD}"
    assert _etcdctl(own_etcd, "put", f"{KEYS_ROOT}probe", "x", user=user).returncode == 0
    outside = _etcdctl(own_etcd, "put", "elsewhere/probe", "x", user=user)
    assert outside.returncode != 0
    assert "permission denied" in outside.stderr
    anonymous = _etcdctl(own_etcd, "put", f"{KEYS_ROOT}probe", "x")
    assert anonymous.returncode != 0
    root = _etcdctl(own_etcd, "put", "elsewhere/probe", "x", user=f"root:{ROOT_PASSWORD}")
    assert root.returncode == 0, root.stderr


def test_the_secure_healthcheck_passes_with_auth_on(own_etcd: LocalServer) -> None:
    assert _run_job(own_etcd).returncode == 0
    # compose.secure.yaml's etcd healthcheck (compose.yaml's `endpoint health` needs a user).
    test = yaml.safe_load(SECURE_FILE.read_text())["services"]["etcd"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "etcdctl", "--endpoints=http://127.0.0.1:2379"]
    assert _etcdctl(own_etcd, *test[3:]).returncode == 0


def test_a_second_run_changes_nothing_and_succeeds(own_etcd: LocalServer) -> None:
    assert _run_job(own_etcd).returncode == 0
    again = _run_job(own_etcd, ETCD_AUTH_PASSWORD="another")
    assert again.returncode == 0, again.stderr
    assert "already on" in again.stdout
    user = f"lorafleet:{USER_PASSWORD}"  # the first password still holds
    assert _etcdctl(own_etcd, "put", f"{KEYS_ROOT}probe", "x", user=user).returncode == 0


def test_a_root_password_etcd_does_not_know_is_one_line(own_etcd: LocalServer) -> None:
    assert _run_job(own_etcd).returncode == 0
    again = _run_job(own_etcd, ETCD_ROOT_PASSWORD="lfnot-the-first-one")
    assert again.returncode == 1
    (line,) = again.stderr.strip().splitlines()
    assert "ETCD_ROOT_PASSWORD" in line
    assert "authentication failed" in line
    assert "lfnot-the-first-one" not in again.stderr


@pytest.mark.parametrize("missing", ["ETCD_ROOT_PASSWORD", "ETCD_AUTH_PASSWORD"])
def test_a_missing_password_names_the_variable(own_etcd: LocalServer, missing: str) -> None:
    result = _run_job(own_etcd, **{missing: ""})
    assert result.returncode == 1
    assert missing in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
