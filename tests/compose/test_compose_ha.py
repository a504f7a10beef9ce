"""Validate compose.ha.yaml (three etcd members, a three-node NATS cluster) with Compose v2.

It is an override of compose.yaml; `config` checks the merged project in every profile
without a Docker engine. The members must name one another consistently, and every
lorafleet process must list all of them, or a lost member takes the cluster's clients down.
"""

from pathlib import Path
from typing import Any, Final

import pytest
from compose_cli import HA_FILE, compose, resolved

PROFILES: Final = [None, "gpu", "mocker"]
ETCD_MEMBERS: Final = ["etcd", "etcd-2", "etcd-3"]
NATS_NODES: Final = ["nats", "nats-2", "nats-3"]
LORAFLEET_SERVICES: Final = {"frontend", "worker", "worker-vllm", "worker-mocker"}


def _project(profile: str | None) -> dict[str, Any]:
    return resolved(*(["--profile", profile] if profile else []), overrides=(HA_FILE,))


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


@pytest.mark.parametrize("profile", PROFILES)
def test_ha_override_is_valid_in_profile(profile: str | None) -> None:
    args = ["--profile", profile] if profile else []
    result = compose(*args, "config", "-q", overrides=(HA_FILE,))
    assert result.returncode == 0, result.stderr


def test_three_etcd_members_form_one_cluster() -> None:
    services = _project(None)["services"]
    clusters = set()
    for name in ETCD_MEMBERS:
        env = services[name]["environment"]
        assert env["ETCD_NAME"] == name
        assert env["ETCD_INITIAL_ADVERTISE_PEER_URLS"] == f"http://{name}:2380"
        assert env["ETCD_ADVERTISE_CLIENT_URLS"] == f"http://{name}:2379"
        assert f"{name}=http://{name}:2380" in env["ETCD_INITIAL_CLUSTER"].split(",")
        clusters.add((env["ETCD_INITIAL_CLUSTER"], env["ETCD_INITIAL_CLUSTER_TOKEN"]))
    assert len(clusters) == 1  # one cluster, named alike by every member
    assert len({services[name]["volumes"][0]["source"] for name in ETCD_MEMBERS}) == 3


def test_three_nats_nodes_route_to_one_another() -> None:
    services = _project(None)["services"]
    for name in NATS_NODES:
        command = services[name]["command"]
        assert _flag(command, "--server_name") == name
        assert _flag(command, "--cluster_name") == "lorafleet"
        routes = set(_flag(command, "--routes").split(","))
        assert routes == {f"nats://{other}:6222" for other in NATS_NODES if other != name}


@pytest.mark.parametrize("profile", PROFILES)
def test_every_lorafleet_process_lists_every_member(profile: str | None) -> None:
    services = _project(profile)["services"]
    present = LORAFLEET_SERVICES & set(services)
    assert present, profile
    for name in present:
        env, depends_on = services[name]["environment"], services[name]["depends_on"]
        etcd = env["ETCD_ENDPOINTS"].split(",")
        nats = env["NATS_SERVER"].split(",")
        assert etcd == [f"http://{member}:2379" for member in ETCD_MEMBERS], name
        assert nats == [f"nats://{node}:4222" for node in NATS_NODES], name
        for member in ETCD_MEMBERS + NATS_NODES:
            assert depends_on[member]["condition"] == "service_healthy", (name, member)


def test_a_member_missing_from_the_override_fails(tmp_path: Path) -> None:
    text = HA_FILE.read_text()
    old = "  etcd-3:\n    condition: service_healthy\n"
    assert text.count(old) == 1
    broken = tmp_path / "compose.ha.yaml"
    broken.write_text(text.replace(old, "  etcd-4:\n    condition: service_healthy\n"))
    result = compose("config", "-q", overrides=(broken,))
    assert result.returncode != 0
    assert "etcd-4" in result.stderr
