"""The worker's settings, each declared once: its command line, its variables, its
``--help``, its checks and the README's table all come from these fields.

``WorkerConfig`` adds the worker's own settings to the ones every process shares
(``ConnectionSettings``), and holds two groups declared beside the code that reads them:
``EngineConfig`` (``lorafleet/worker/engine.py``: model, LoRA slots, engine options),
``LoRAManagerConfig`` (``lorafleet/worker/lora/config.py``: the adapter cache and sources,
``DYN_LORA_*``) and ``PlacementSettings`` (``lorafleet/worker/placement.py``: the
``--lora-copy-*`` knobs). Adding a setting is one ``setting(...)`` field on the class that uses
it (``lorafleet/process/settings.py``).
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated

from lorafleet.discovery.connection_settings import ConnectionSettings
from lorafleet.process.cli_help import HelpFormatter, add_version
from lorafleet.process.settings import AT_LEAST_ONE, PORT, POSITIVE, setting
from lorafleet.process.settings_cli import add_settings, parse_settings
from lorafleet.worker.engine import EngineConfig
from lorafleet.worker.engines import ENGINE_KINDS
from lorafleet.worker.lora.config import LoRAManagerConfig
from lorafleet.worker.placement import PlacementSettings

__all__ = ["WorkerConfig", "build_parser", "parse_worker_args"]


@dataclass(frozen=True, kw_only=True)
class WorkerConfig(ConnectionSettings):
    """Everything a worker process needs, validated once at start.

    Examples::

        WorkerConfig(engine="mocker", engine_config=EngineConfig(model="demo"))
        WorkerConfig(engine="hf", engine_config=EngineConfig(model="/m", enable_lora=True),
                     lora_enabled=True, system_port=9345)
    """

    engine: str = setting(
        "mocker", flag="--engine", env="DYN_ENGINE", choices=ENGINE_KINDS,
        help="mocker needs no model weights; hf runs transformers; vllm runs vLLM",
    )  # fmt: skip
    engine_config: EngineConfig
    component: str = setting(
        "backend", flag="--component", env="DYN_COMPONENT",
        help="the middle part of the worker's etcd keys and NATS subject",
    )  # fmt: skip
    endpoint: str = setting(
        "generate", flag="--endpoint", env="DYN_ENDPOINT",
        help="the last part of the worker's etcd keys and NATS subject",
    )  # fmt: skip
    system_host: str = setting(
        "0.0.0.0", flag="--system-host", env="DYN_SYSTEM_HOST",
        help="the status server's bind address",
    )  # fmt: skip
    system_port: Annotated[int, PORT] = setting(
        9345, flag="--system-port", env="DYN_SYSTEM_PORT",
        help="the status server's port: health, metrics, LoRA routes",
    )  # fmt: skip
    advertise_host: str = setting(
        "", flag="--advertise-host", env="DYN_ADVERTISE_HOST",
        help="the host in the instance record's system_url; default: the bind address, or the "
        "hostname",
    )  # fmt: skip
    lease_ttl_s: Annotated[int, AT_LEAST_ONE] = setting(
        10, flag="--lease-ttl", env="DYN_LEASE_TTL",
        help="etcd lease TTL in seconds: a killed worker's keys vanish after this",
    )  # fmt: skip
    shutdown_grace_s: Annotated[float, POSITIVE] = setting(
        10.0, flag="--shutdown-grace", env="DYN_SHUTDOWN_GRACE",
        help="seconds in-flight requests get to finish after SIGTERM; the process exits within "
        "the grace plus about 2 s",
    )  # fmt: skip
    lora_enabled: bool = setting(
        False, env="DYN_LORA_ENABLED",
        help="with --enable-lora, turns LoRA management on; also mounts /v1/loras and vLLM's "
        "LoRA routes",
    )  # fmt: skip
    auth_token: str | None = setting(
        None, env="DYN_SYSTEM_AUTH_TOKEN", secret=True,
        help="when set, the worker's LoRA writes (HTTP and NATS) need Authorization: Bearer "
        "<token>; unset, they are open",
        more="A frontend sends it with its on-demand loads, so set the workers' value there too.",
    )  # fmt: skip
    lora: LoRAManagerConfig = field(default_factory=LoRAManagerConfig)
    placement: PlacementSettings = field(default_factory=PlacementSettings)

    @property
    def system_url(self) -> str:
        """Where operators reach this worker's status server."""
        host = self.advertise_host or (
            socket.gethostname() if self.system_host in ("0.0.0.0", "::") else self.system_host
        )
        return f"http://{host}:{self.system_port}"


def build_parser() -> argparse.ArgumentParser:
    """The worker's command line: one flag per setting that has one."""
    parser = argparse.ArgumentParser(
        prog="lorafleet worker", formatter_class=HelpFormatter,
        description="A lorafleet worker: serves one model with one engine (mocker, hf or vllm) "
        "on a NATS subject and registers it in etcd. Every flag has an environment variable.",
    )  # fmt: skip
    add_version(parser)
    add_settings(parser, WorkerConfig)
    return parser


def parse_worker_args(argv: Sequence[str] | None = None) -> WorkerConfig:
    """Build a ``WorkerConfig`` from flags and environment; exits with usage on bad input."""
    return parse_settings(build_parser(), WorkerConfig, argv)
