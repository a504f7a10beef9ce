"""The worker's command line, where every flag also has an environment variable."""

from __future__ import annotations

import argparse
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from discovery.cli_help import HelpFormatter, add_version
from discovery.header_timeout import DEFAULT_HEADER_TIMEOUT_S
from discovery.keys import DEFAULT_NAMESPACE
from discovery.nats_settings import DEFAULT_NATS_SERVER
from discovery.settings import DEFAULT_ETCD_ENDPOINTS, EtcdSettings
from discovery.startup import DEFAULT_CONNECT_TIMEOUT_S
from worker.engine import EngineConfig
from worker.engines import ENGINE_KINDS
from worker.placement import PlacementPolicy

__all__ = ["WorkerConfig", "parse_worker_args"]

_TRUE: Final = {"1", "true", "yes", "on"}


def env_flag(name: str, default: bool = False) -> bool:
    """Read a boolean environment variable (``1``/``true``/``yes``/``on``)."""
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in _TRUE


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Everything a worker process needs, validated once at start.

    Examples::

        WorkerConfig(engine="mocker", engine_config=EngineConfig(model="demo"))
        WorkerConfig(engine="hf", engine_config=EngineConfig(model="/m", enable_lora=True),
                     lora_enabled=True, system_port=9345)
    """

    engine: str
    engine_config: EngineConfig
    namespace: str = DEFAULT_NAMESPACE
    component: str = "backend"
    endpoint: str = "generate"
    etcd: EtcdSettings = field(default_factory=EtcdSettings)
    """``ETCD_ENDPOINTS`` and the ``ETCD_AUTH_*`` credentials and TLS files."""
    nats_server: str = DEFAULT_NATS_SERVER
    system_host: str = "0.0.0.0"
    system_port: int = 9345
    advertise_host: str = ""
    lease_ttl_s: int = 10
    shutdown_grace_s: float = 10.0
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    """``DYN_CONNECT_TIMEOUT_S``: how long start-up waits for each of etcd and NATS."""
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    """``DYN_HEADER_TIMEOUT_S``: status connections without a request head by then close."""
    lora_enabled: bool = False
    """``DYN_LORA_ENABLED``: with ``--enable-lora``, turns LoRA management on."""
    auth_token: str | None = field(default=None, repr=False)
    """``DYN_SYSTEM_AUTH_TOKEN``: guards LoRA writes over HTTP and every update over NATS."""
    lora_idle_unload_s: float = 300.0
    """An adapter loaded on demand and not placed here is unloaded after this long idle."""
    placement_policy: PlacementPolicy = PlacementPolicy.BOUNDED
    """``DYN_PLACEMENT_POLICY``: ``bounded`` (demand, slots, load) or ``rendezvous`` (old)."""
    lora_copy_rps: float = 10.0
    """``DYN_LORA_COPY_RPS``: requests/s per copy above which the fleet adds a copy."""
    lora_copy_cooldown_s: float = 120.0
    """``DYN_LORA_COPY_COOLDOWN_S``: low demand this long before an extra copy goes."""
    lora_demand_half_life_s: float = 30.0
    """``DYN_LORA_DEMAND_HALF_LIFE_S``: half-life of the per-adapter request rates."""

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_KINDS:
            raise ValueError(f"engine must be one of {ENGINE_KINDS}, got {self.engine!r}")
        if self.lease_ttl_s < 1:
            raise ValueError(f"lease TTL must be at least 1 s, got {self.lease_ttl_s}")
        positive = ("shutdown_grace_s", "connect_timeout_s", "header_timeout_s", "lora_copy_rps",
                    "lora_copy_cooldown_s", "lora_demand_half_life_s")  # fmt: skip
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def system_url(self) -> str:
        """Where operators reach this worker's status server."""
        host = self.advertise_host or (
            socket.gethostname() if self.system_host in ("0.0.0.0", "::") else self.system_host
        )
        return f"http://{host}:{self.system_port}"


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="lorafleet worker", formatter_class=HelpFormatter,
        description="A lorafleet worker: serves one model with one engine (mocker, hf or vllm) "
        "on a NATS subject and registers it in etcd. Every flag has an environment variable.",
    )  # fmt: skip
    add_version(p)
    add = p.add_argument
    add(
        "--engine",
        choices=ENGINE_KINDS,
        default=env("DYN_ENGINE", "mocker"),
        help="mocker needs no model; hf runs transformers; vllm runs vLLM (env DYN_ENGINE)",
    )
    add("--model", default=env("DYN_MODEL"), help="model path or name, required (env DYN_MODEL)")
    add(
        "--served-model-name",
        default=env("DYN_SERVED_MODEL_NAME"),
        help="the model's name in the API; default: --model (env DYN_SERVED_MODEL_NAME)",
    )
    add("--namespace", default=env("DYN_NAMESPACE", DEFAULT_NAMESPACE), help="env DYN_NAMESPACE")
    add("--component", default=env("DYN_COMPONENT", "backend"), help="env DYN_COMPONENT")
    add("--endpoint", default=env("DYN_ENDPOINT", "generate"), help="env DYN_ENDPOINT")
    add(
        "--etcd-endpoints",
        default=env("ETCD_ENDPOINTS", DEFAULT_ETCD_ENDPOINTS),
        help="comma-separated etcd URLs (env ETCD_ENDPOINTS)",
    )
    add("--nats-server", default=env("NATS_SERVER", DEFAULT_NATS_SERVER), help="env NATS_SERVER")
    add(
        "--system-host",
        default=env("DYN_SYSTEM_HOST", "0.0.0.0"),
        help="status server's bind address (env DYN_SYSTEM_HOST)",
    )
    add(
        "--system-port",
        type=int,
        default=int(env("DYN_SYSTEM_PORT", "9345")),
        help="status server's port: health, metrics, LoRA routes (env DYN_SYSTEM_PORT)",
    )
    add("--advertise-host", default=env("DYN_ADVERTISE_HOST", ""),
        help="host others reach the status server at; default: the bind address or hostname "
        "(env DYN_ADVERTISE_HOST)")  # fmt: skip
    add(
        "--lease-ttl",
        type=int,
        default=int(env("DYN_LEASE_TTL", "10")),
        help="etcd lease TTL in seconds (env DYN_LEASE_TTL)",
    )
    add(
        "--shutdown-grace",
        type=float,
        default=float(env("DYN_SHUTDOWN_GRACE", "10")),
        help="seconds in-flight requests get to finish on SIGTERM (env DYN_SHUTDOWN_GRACE)",
    )
    add(
        "--connect-timeout-s",
        type=float,
        default=float(env("DYN_CONNECT_TIMEOUT_S", str(DEFAULT_CONNECT_TIMEOUT_S))),
        help="start-up wait for etcd and NATS, then exit 1 (env DYN_CONNECT_TIMEOUT_S)",
    )
    add(
        "--header-timeout-s",
        type=float,
        default=float(env("DYN_HEADER_TIMEOUT_S", str(DEFAULT_HEADER_TIMEOUT_S))),
        help="close status connections with no request head by then (env DYN_HEADER_TIMEOUT_S)",
    )
    add("--enable-lora", action="store_true", default=env_flag("DYN_ENABLE_LORA"),
        help="serve LoRA adapters (env DYN_ENABLE_LORA); LoRA management also needs "
        "DYN_LORA_ENABLED=true in the environment")  # fmt: skip
    add(
        "--max-loras",
        type=int,
        default=int(env("DYN_MAX_LORAS", "4")),
        help="adapters loaded at once (env DYN_MAX_LORAS)",
    )
    add(
        "--max-lora-rank",
        type=int,
        default=int(env("DYN_MAX_LORA_RANK", "64")),
        help="largest adapter rank accepted (env DYN_MAX_LORA_RANK)",
    )
    add(
        "--lora-idle-unload-s",
        type=float,
        default=float(env("DYN_LORA_IDLE_UNLOAD_S", "300")),
        help="unload an on-demand adapter idle this long (env DYN_LORA_IDLE_UNLOAD_S)",
    )
    _add_placement_flags(add, env)
    add(
        "--context-length",
        type=int,
        default=int(env("DYN_CONTEXT_LENGTH", "2048")),
        help="tokens of prompt plus output (env DYN_CONTEXT_LENGTH)",
    )
    add(
        "--mocker-time-per-token-s",
        type=float,
        default=float(env("DYN_MOCKER_TIME_PER_TOKEN_S", "0")),
        help="mocker: delay per token (env DYN_MOCKER_TIME_PER_TOKEN_S)",
    )
    add(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="engine-specific option, e.g. fail_add_adapter='\"broken.*\"' (repeatable)",
    )
    return p


def _add_placement_flags(add: Callable[..., object], env: Callable[[str, str], str]) -> None:
    """The fleet placement flags (``docs/fleet.md``), next to the other LoRA flags."""
    add("--placement-policy", choices=[p.value for p in PlacementPolicy],
        default=env("DYN_PLACEMENT_POLICY", "bounded"),
        help="bounded: copies from demand on instances with room; rendezvous: the old fixed "
        "replicas by hash alone (env DYN_PLACEMENT_POLICY)")  # fmt: skip
    add("--lora-copy-rps", type=float, default=float(env("DYN_LORA_COPY_RPS", "10")),
        help="requests/s one adapter copy serves; more demand adds a copy (a copy is "
        "prefetched at 70%% of it) (env DYN_LORA_COPY_RPS)")  # fmt: skip
    add("--lora-copy-cooldown-s", type=float,
        default=float(env("DYN_LORA_COPY_COOLDOWN_S", "120")),
        help="an extra copy is dropped after demand stayed low this long "
        "(env DYN_LORA_COPY_COOLDOWN_S)")  # fmt: skip
    add("--lora-demand-half-life-s", type=float,
        default=float(env("DYN_LORA_DEMAND_HALF_LIFE_S", "30")),
        help="half-life of the per-adapter request rates "
        "(env DYN_LORA_DEMAND_HALF_LIFE_S)")  # fmt: skip


def parse_worker_args(argv: list[str] | None = None) -> WorkerConfig:
    """Build a ``WorkerConfig`` from flags and environment; exits with usage on bad input."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.model:
        parser.error("--model (or DYN_MODEL) is required")
    options: dict[str, Any] = {"time_per_token_s": args.mocker_time_per_token_s}
    options |= _parse_options(parser, args.engine_option)
    try:
        engine_config = EngineConfig(
            model=args.model,
            served_model_name=args.served_model_name,
            enable_lora=args.enable_lora,
            max_loras=args.max_loras,
            max_lora_rank=args.max_lora_rank,
            context_length=args.context_length,
            options=options,
        )
        return WorkerConfig(
            engine=args.engine, engine_config=engine_config, namespace=args.namespace,
            component=args.component, endpoint=args.endpoint,
            etcd=EtcdSettings.from_env(endpoints=args.etcd_endpoints),
            nats_server=args.nats_server,
            system_host=args.system_host, system_port=args.system_port,
            advertise_host=args.advertise_host, lease_ttl_s=args.lease_ttl,
            shutdown_grace_s=args.shutdown_grace, connect_timeout_s=args.connect_timeout_s,
            header_timeout_s=args.header_timeout_s, lora_enabled=env_flag("DYN_LORA_ENABLED"),
            auth_token=os.environ.get("DYN_SYSTEM_AUTH_TOKEN") or None,
            lora_idle_unload_s=args.lora_idle_unload_s,
            placement_policy=PlacementPolicy(args.placement_policy),
            lora_copy_rps=args.lora_copy_rps, lora_copy_cooldown_s=args.lora_copy_cooldown_s,
            lora_demand_half_life_s=args.lora_demand_half_life_s,
        )  # fmt: skip
    except ValueError as exc:
        parser.error(str(exc))


def _parse_options(parser: argparse.ArgumentParser, pairs: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            parser.error(f"--engine-option {pair!r} must look like KEY=JSON")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options
