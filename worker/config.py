"""The worker's command line, where every flag also has an environment variable."""

from __future__ import annotations

import argparse
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Final

from lorafleet.discovery.connection_flags import add_connection_flags, connection_args
from lorafleet.discovery.keys import DEFAULT_NAMESPACE
from lorafleet.discovery.nats_settings import DEFAULT_NATS_SERVER
from lorafleet.discovery.settings import EtcdSettings
from lorafleet.discovery.startup import DEFAULT_CONNECT_TIMEOUT_S
from lorafleet.process.cli_help import HelpFormatter, add_version
from lorafleet.process.flags import FlagSpec, add_env_options, env_flag, env_option
from lorafleet.process.header_timeout import DEFAULT_HEADER_TIMEOUT_S
from lorafleet.worker.engine import EngineConfig
from lorafleet.worker.engines import ENGINE_KINDS
from lorafleet.worker.lora_controller import IN_USE_S
from lorafleet.worker.placement import PlacementPolicy

__all__ = ["WorkerConfig", "parse_worker_args"]


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
    lora_in_use_s: float = IN_USE_S
    """``DYN_LORA_IN_USE_S``: an adapter used this recently keeps its last warm copy."""

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
        if self.lora_in_use_s < 0:
            raise ValueError(f"lora_in_use_s must not be negative, got {self.lora_in_use_s}")

    @property
    def system_url(self) -> str:
        """Where operators reach this worker's status server."""
        host = self.advertise_host or (
            socket.gethostname() if self.system_host in ("0.0.0.0", "::") else self.system_host
        )
        return f"http://{host}:{self.system_port}"


_FLAGS: Final[tuple[FlagSpec, ...]] = (
    ("--model", "DYN_MODEL", None, str,
     "model path or name, required"),
    ("--served-model-name", "DYN_SERVED_MODEL_NAME", None, str,
     "the model's name in the API; default: --model"),
    ("--component", "DYN_COMPONENT", WorkerConfig.component, str, ""),
    ("--endpoint", "DYN_ENDPOINT", WorkerConfig.endpoint, str, ""),
    ("--system-host", "DYN_SYSTEM_HOST", WorkerConfig.system_host, str,
     "status server's bind address"),
    ("--system-port", "DYN_SYSTEM_PORT", WorkerConfig.system_port, int,
     "status server's port: health, metrics, LoRA routes"),
    ("--advertise-host", "DYN_ADVERTISE_HOST", WorkerConfig.advertise_host, str,
     "host others reach the status server at; default: the bind address or hostname"),
    ("--lease-ttl", "DYN_LEASE_TTL", WorkerConfig.lease_ttl_s, int,
     "etcd lease TTL in seconds"),
    ("--shutdown-grace", "DYN_SHUTDOWN_GRACE", WorkerConfig.shutdown_grace_s, float,
     "seconds in-flight requests get to finish on SIGTERM"),
    ("--max-loras", "DYN_MAX_LORAS", EngineConfig.max_loras, int,
     "adapters loaded at once"),
    ("--max-lora-rank", "DYN_MAX_LORA_RANK", EngineConfig.max_lora_rank, int,
     "largest adapter rank accepted"),
    ("--lora-idle-unload-s", "DYN_LORA_IDLE_UNLOAD_S", WorkerConfig.lora_idle_unload_s, float,
     "unload an on-demand adapter idle this long"),
    ("--lora-copy-rps", "DYN_LORA_COPY_RPS", WorkerConfig.lora_copy_rps, float,
     "requests/s one adapter copy serves; more demand adds a copy (a copy is prefetched "
     "at 70%% of it)"),
    ("--lora-copy-cooldown-s", "DYN_LORA_COPY_COOLDOWN_S", WorkerConfig.lora_copy_cooldown_s,
     float, "an extra copy is dropped after demand stayed low this long"),
    ("--lora-demand-half-life-s", "DYN_LORA_DEMAND_HALF_LIFE_S",
     WorkerConfig.lora_demand_half_life_s, float, "half-life of the per-adapter request rates"),
    ("--lora-in-use-s", "DYN_LORA_IN_USE_S", WorkerConfig.lora_in_use_s, float,
     "an adapter that served a request this recently keeps its last warm copy (eviction)"),
    ("--context-length", "DYN_CONTEXT_LENGTH", EngineConfig.context_length, int,
     "tokens of prompt plus output"),
    ("--mocker-time-per-token-s", "DYN_MOCKER_TIME_PER_TOKEN_S", 0.0, float,
     "mocker: delay per token"),
)  # fmt: skip
"""The worker's own flags: (flag, variable, default, parser, help); defaults are the
configs' own."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lorafleet worker", formatter_class=HelpFormatter,
        description="A lorafleet worker: serves one model with one engine (mocker, hf or vllm) "
        "on a NATS subject and registers it in etcd. Every flag has an environment variable.",
    )  # fmt: skip
    add_version(p)
    add_connection_flags(p)
    add_env_options(p, _FLAGS)
    env_option(p, "--engine", "DYN_ENGINE", "mocker",
               "mocker needs no model; hf runs transformers; vllm runs vLLM",
               choices=ENGINE_KINDS)  # fmt: skip
    env_option(p, "--placement-policy", "DYN_PLACEMENT_POLICY",
               WorkerConfig.placement_policy.value,
               "bounded: copies from demand on instances with room; rendezvous: the old fixed "
               "replicas by hash alone",
               choices=[policy.value for policy in PlacementPolicy])  # fmt: skip
    p.add_argument("--enable-lora", action="store_true", default=env_flag("DYN_ENABLE_LORA"),
                   help="serve LoRA adapters (env DYN_ENABLE_LORA); LoRA management also needs "
                   "DYN_LORA_ENABLED=true in the environment")  # fmt: skip
    p.add_argument("--engine-option", action="append", default=[], metavar="KEY=JSON",
                   help="engine-specific option, e.g. fail_add_adapter='\"broken.*\"' "
                   "(repeatable)")  # fmt: skip
    return p


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
            **connection_args(args), engine=args.engine, engine_config=engine_config,
            component=args.component, endpoint=args.endpoint,
            system_host=args.system_host, system_port=args.system_port,
            advertise_host=args.advertise_host, lease_ttl_s=args.lease_ttl,
            shutdown_grace_s=args.shutdown_grace, lora_enabled=env_flag("DYN_LORA_ENABLED"),
            auth_token=os.environ.get("DYN_SYSTEM_AUTH_TOKEN") or None,
            lora_idle_unload_s=args.lora_idle_unload_s,
            placement_policy=PlacementPolicy(args.placement_policy),
            lora_copy_rps=args.lora_copy_rps, lora_copy_cooldown_s=args.lora_copy_cooldown_s,
            lora_demand_half_life_s=args.lora_demand_half_life_s, lora_in_use_s=args.lora_in_use_s,
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
