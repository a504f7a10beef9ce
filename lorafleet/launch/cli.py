"""The lorafleet command: up, status, worker, frontend, lora, keys, tenants, models.

Errors print as one line and exit 1 (LOG_LEVEL=debug keeps the traceback); Ctrl-C
prints one line and exits 130. ``lora``, ``models`` and ``status`` find the cluster of
``lorafleet up`` through its state file unless a flag or the environment says otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from lorafleet.discovery.settings import DEFAULT_ETCD_ENDPOINTS, EtcdSettings
from lorafleet.launch.alias_cli import ALIAS_ACTIONS, add_alias_flags, alias_command
from lorafleet.launch.cluster_state import ClusterState, read_state
from lorafleet.launch.fleet_status import DEFAULT_APPLY_WAIT_S
from lorafleet.launch.keys_cli import (
    add_key_flags,
    add_tenant_flags,
    keys_command,
    tenants_command,
)
from lorafleet.process.cli_help import HelpFormatter, add_version
from lorafleet.proto.adapters import SHA256_PATTERN, AdapterSpec, LoraSource
from lorafleet.proto.errors import LorafleetError
from lorafleet.proto.slo import SloTargets

__all__ = ["main"]

DEFAULT_HTTP_PORT: Final = 8000
DEFAULT_NAMESPACE: Final = "lorafleet"
INTERRUPTED_EXIT_CODE: Final = 130
DESCRIPTION: Final = (
    "Serve LLMs with dynamic LoRA adapters across a fleet: run a local cluster (up), "
    "its parts (worker, frontend), and manage adapters and models on a running one."
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lorafleet", description=DESCRIPTION,
                                     formatter_class=HelpFormatter)  # fmt: skip
    add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     help="lorafleet COMMAND --help tells more")  # fmt: skip
    _up_parser(_command(commands, "up", "run a whole local cluster until Ctrl-C"))
    _command(commands, "worker", "run a worker (lorafleet worker --help lists its flags)")
    _command(commands, "frontend", "run a frontend (lorafleet frontend --help lists its flags)")
    _lora_parser(_command(
        commands, "lora",
        "load, unload or list adapters on workers; apply or delete the fleet's desired state",
    ))  # fmt: skip
    keys = _command(commands, "keys", "create, list or revoke the API keys of tenants")
    add_key_flags(keys)
    _cluster_flags(keys, etcd=False)
    tenants = _command(commands, "tenants", "set, list or delete tenants: models and limits")
    add_tenant_flags(tenants)
    _cluster_flags(tenants, etcd=False)
    models = _command(commands, "models", "list the models a frontend serves")
    _cluster_flags(models, etcd=False)
    status = _command(commands, "status", "the cluster at a glance: servers, workers, adapters")
    _cluster_flags(status, etcd=True)
    return parser


def _command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str, text: str
) -> argparse.ArgumentParser:
    sub = commands.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".",
                              formatter_class=HelpFormatter)  # fmt: skip
    add_version(sub)
    return sub


def _up_parser(up: argparse.ArgumentParser) -> None:
    env = os.environ.get
    up.add_argument(
        "--engine",
        choices=["hf", "mocker", "vllm"],
        default="hf",
        help="worker engine; mocker needs no model and skips the demo model",
    )
    up.add_argument("--model", help="model path (default: build and use the demo model)")
    up.add_argument("--served-model-name", default="demo", help="the base model's name in the API")
    up.add_argument("--workers", type=int, default=1, help="how many workers to start")
    up.add_argument(
        "--http-port",
        type=int,
        default=int(env("DYN_HTTP_PORT", "8000")),
        help="the frontend's port (env DYN_HTTP_PORT); must be free",
    )
    up.add_argument(
        "--host",
        default="127.0.0.1",
        help="where the frontend and the workers' status ports listen: this machine only by "
        "default; 0.0.0.0 opens them to the network (set DYN_SYSTEM_AUTH_TOKEN and "
        "DYN_ADMIN_TOKEN first)",
    )
    up.add_argument(
        "--system-port",
        type=int,
        default=9345,
        help="first worker's status port; worker N uses this + N; must be free",
    )
    up.add_argument(
        "--namespace",
        default=env("DYN_NAMESPACE", DEFAULT_NAMESPACE),
        help="etcd and NATS namespace (env DYN_NAMESPACE)",
    )
    up.add_argument(
        "--state-dir",
        type=Path,
        default=_default_state_dir(),
        help="servers' data, logs and cluster.json (env LORAFLEET_STATE_DIR)",
    )
    up.add_argument("--adapter", action="append", default=[], type=_adapter, metavar="NAME=URI",
                    help="declare one more adapter for every worker (repeatable): a URI "
                         "(file://, s3://, hf://) or an absolute path; the demo model's "
                         "pirate and robot are declared too")  # fmt: skip
    up.add_argument("--engine-option", action="append", default=[], metavar="KEY=JSON",
                    help="an engine option passed to each worker as --engine-option "
                         "(repeatable; lorafleet worker --help lists them)")  # fmt: skip
    up.add_argument("--replace", action="store_true",
                    help="stop what an earlier lorafleet up in the same state dir left running "
                         "(its cluster.json names it) without asking; on a terminal up asks, "
                         "elsewhere it refuses to start without this flag")  # fmt: skip
    up.add_argument("--secure", action="store_true",
                    help="generate certificates, users and passwords under STATE_DIR/secure: "
                         "etcd with TLS and auth, NATS with authorization "
                         "(deploy/nats/auth.conf)")  # fmt: skip


def _lora_parser(lora: argparse.ArgumentParser) -> None:
    lora.add_argument("action", choices=["load", "unload", "list", "apply", "delete",
                                         *ALIAS_ACTIONS], help="what to do")  # fmt: skip
    lora.add_argument("name", nargs="?", help="the adapter's name (all but list)")
    lora.add_argument("uri", nargs="?", help="load/apply: where its files are (file://, s3://)")
    lora.add_argument(
        "--worker",
        action="append",
        help="a worker's status URL (repeatable; default: every worker in etcd)",
    )
    lora.add_argument("--base-model", help="apply: the base model the adapter was trained for")
    lora.add_argument("--replicas", type=_replicas, default=1,
                      help='apply: instances that keep it loaded, a number or "all"; '
                           "0 loads it only on demand")  # fmt: skip
    lora.add_argument(
        "--min-replicas",
        type=_replicas,
        help="apply: copies kept whatever the demand (default: --replicas)",
    )
    lora.add_argument(
        "--max-replicas",
        type=_replicas,
        help="apply: most copies demand may add (default: --replicas)",
    )
    lora.add_argument("--pinned", action="store_true", help="apply: never evict placed copies")
    lora.add_argument("--sha256", type=_sha256,
                      help="apply, load: the adapter's expected content digest "
                           "(sha256:<hex> or hex, as /v1/adapters shows it); other files "
                           "are refused")  # fmt: skip
    lora.add_argument("--replace", action="store_true",
                      help="load: swap an adapter loaded from another source to this one, make "
                           "before break (vLLM's load_inplace)")  # fmt: skip
    lora.add_argument("--ttft-p95-ms", type=float,
                      help="apply: latency target, time to first token p95 in ms; a miss "
                           "while it has demand adds a copy (up to --max-replicas)")  # fmt: skip
    lora.add_argument("--itl-p95-ms", type=float,
                      help="apply: latency target, inter-token latency p95 in ms")  # fmt: skip
    lora.add_argument("--wait-s", type=float, default=DEFAULT_APPLY_WAIT_S,
                      help="apply: how long to wait for the adapter to leave pending/loading "
                           "(0: do not wait)")  # fmt: skip
    add_alias_flags(lora)
    _cluster_flags(lora, etcd=True)


def _cluster_flags(parser: argparse.ArgumentParser, *, etcd: bool) -> None:
    """Flags that say which cluster to talk to; None means env, then state file, then default."""
    if etcd:
        parser.add_argument(
            "--etcd-endpoints",
            help="etcd URLs (env ETCD_ENDPOINTS; "
            f"else the cluster of lorafleet up; else {DEFAULT_ETCD_ENDPOINTS})",
        )
        parser.add_argument("--namespace", help="namespace (env DYN_NAMESPACE; else the "
                            f"cluster of lorafleet up; else {DEFAULT_NAMESPACE})")  # fmt: skip
    parser.add_argument("--frontend", "--url", dest="frontend",
                        help="frontend URL; admin token from DYN_ADMIN_TOKEN (env DYN_HTTP_PORT; "
                             "else the cluster of lorafleet up; else port 8000)")  # fmt: skip
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=_default_state_dir(),
        help="where lorafleet up keeps cluster.json (env LORAFLEET_STATE_DIR)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON, for scripts")


def _default_state_dir() -> Path:
    return Path(os.environ.get("LORAFLEET_STATE_DIR") or ".lorafleet")


def _adapter(value: str) -> tuple[str, str]:
    """``NAME=URI`` (or ``NAME=/absolute/path``) as a name and a source URI."""
    from lorafleet.proto.vllm_lora import lora_path_uri

    name, sep, where = value.partition("=")
    if not sep or not name or not where:
        raise argparse.ArgumentTypeError(f"{value!r} must look like NAME=URI")
    try:
        return name, lora_path_uri(where)
    except LorafleetError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _replicas(value: str) -> int | str:
    if value == "all":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{value!r} is neither a number nor "all"') from None


def _slo_targets(args: argparse.Namespace) -> SloTargets | None:
    """The latency targets given (the frontend checks their values), or None."""
    if args.ttft_p95_ms is None and args.itl_p95_ms is None:
        return None
    return SloTargets(ttft_p95_ms=args.ttft_p95_ms, itl_p95_ms=args.itl_p95_ms)


def _sha256(value: str) -> str:
    if _SHA256.fullmatch(value) is None:
        raise argparse.ArgumentTypeError(f"{value!r} is neither sha256:<64 hex> nor 64 hex")
    return value


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lorafleet`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _dispatch(argv)
    except KeyboardInterrupt:
        print("\nlorafleet: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except Exception as exc:  # one line for people; the traceback on demand
        if os.environ.get("LOG_LEVEL", "").lower() == "debug":
            raise
        command = " ".join(argv[:1] + argv[1:2] * (argv[:1] == ["lora"]))
        unexpected = "" if isinstance(exc, LorafleetError) else (
            f" ({type(exc).__name__}; LOG_LEVEL=debug shows the traceback)"
        )  # fmt: skip
        print(f"lorafleet {command}: {exc}{unexpected}", file=sys.stderr)
        return 1


def _dispatch(argv: list[str]) -> int:
    if argv[:1] == ["worker"]:
        from lorafleet.worker.__main__ import main as worker_main

        return worker_main(argv[1:])
    if argv[:1] == ["frontend"]:
        from lorafleet.frontend.__main__ import main as frontend_main

        return frontend_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "up":
        return _up(args)
    _resolve_cluster(args)
    if args.command == "lora":
        return _lora(args)
    if args.command == "keys":
        return keys_command(args)
    if args.command == "tenants":
        return tenants_command(args)
    if args.command == "status":
        from lorafleet.launch.status import print_status

        return print_status(args.etcd, args.namespace, args.frontend, as_json=args.json)
    from lorafleet.launch.admin import list_models

    return list_models(args.frontend, as_json=args.json)


def _resolve_cluster(args: argparse.Namespace) -> None:
    """Fill the cluster flags: a flag, then the environment, then cluster.json, then defaults."""
    state = read_state(args.state_dir)
    env: Mapping[str, str] = os.environ
    if "ETCD_ENDPOINTS" not in env and state is not None:
        env = {**state.etcd_env, **os.environ}
    if hasattr(args, "etcd_endpoints"):
        args.etcd = EtcdSettings.from_env(env, endpoints=args.etcd_endpoints)
        args.namespace = args.namespace or _namespace(state)
    port = os.environ.get("DYN_HTTP_PORT")
    state_url = state.frontend_url if state else None
    local = f"http://127.0.0.1:{port or DEFAULT_HTTP_PORT}"
    args.frontend = args.frontend or (local if port else state_url or local)


def _namespace(state: ClusterState | None) -> str:
    from_env = os.environ.get("DYN_NAMESPACE")
    return from_env or (state.namespace if state else DEFAULT_NAMESPACE)


def _up(args: argparse.Namespace) -> int:
    from lorafleet.launch.cluster import ClusterOptions, run_cluster
    from lorafleet.process.logs import configure_logging

    configure_logging(process="lorafleet-up")
    options = ClusterOptions(
        engine=args.engine, model=args.model, served_model_name=args.served_model_name,
        workers=args.workers, http_port=args.http_port, system_port=args.system_port,
        namespace=args.namespace, state_dir=args.state_dir, secure=args.secure, host=args.host,
        extra_adapters=dict(args.adapter), engine_options=tuple(args.engine_option),
        replace=args.replace,
    )  # fmt: skip
    return run_cluster(options)


_SHA256: Final = re.compile(SHA256_PATTERN)
_SPELLING: Final = {"name": "a NAME", "uri": "a URI", "base_model": "--base-model"}


def _lora(args: argparse.Namespace) -> int:
    from lorafleet.launch.admin import apply_adapter, delete_adapter, discover, lora_command
    from lorafleet.launch.fleet_status import print_fleet

    if args.action in ALIAS_ACTIONS:
        return alias_command(args)
    if args.more:
        print(f"lorafleet lora {args.action} takes no more than NAME and URI; "
              f"unexpected: {' '.join(args.more)}", file=sys.stderr)  # fmt: skip
        return 2
    needs = {"apply": ("name", "uri", "base_model"), "delete": ("name",),
             "load": ("name", "uri"), "unload": ("name",)}.get(args.action, ())  # fmt: skip
    if args.sha256 and args.action not in ("apply", "load"):
        print(f"lorafleet lora {args.action} takes no --sha256 (apply and load do)",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.replace and args.action != "load":
        print(f"lorafleet lora {args.action} takes no --replace (load does; apply swaps when "
              "the URI changes)", file=sys.stderr)  # fmt: skip
        return 2
    missing = [_SPELLING[field] for field in needs if not getattr(args, field)]
    if missing:
        print(f"lorafleet lora {args.action} needs {', '.join(missing)} "
              "(lorafleet lora --help)", file=sys.stderr)  # fmt: skip
        return 2
    if args.action == "apply":
        adapter = AdapterSpec(
            name=args.name, base_model=args.base_model,
            source=LoraSource(uri=args.uri, sha256=args.sha256),
            replicas=args.replicas, min_replicas=args.min_replicas,
            max_replicas=args.max_replicas, pinned=args.pinned, slo=_slo_targets(args),
        )  # fmt: skip
        return apply_adapter(args.frontend, adapter, wait_s=args.wait_s, as_json=args.json)
    if args.action == "delete":
        return delete_adapter(args.frontend, args.name)
    workers = args.worker or discover(args.etcd, args.namespace)
    code = lora_command(args.action, name=args.name, uri=args.uri, workers=workers,
                        as_json=args.json, sha256=args.sha256, replace=args.replace)  # fmt: skip
    if args.action == "list" and not args.worker:
        print_fleet(args.frontend, as_json=args.json)
    return code
