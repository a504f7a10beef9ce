"""The ``lorafleet`` command: ``up``, ``worker``, ``frontend``, ``lora``, ``models``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from discovery.errors import EtcdUnavailableError
from discovery.settings import DEFAULT_ETCD_ENDPOINTS, EtcdSettings

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="lorafleet", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="run a whole local cluster until Ctrl-C")
    up.add_argument("--engine", choices=["hf", "mocker", "vllm"], default="hf")
    up.add_argument("--model", help="model path (default: build and use the demo model)")
    up.add_argument("--served-model-name", default="demo")
    up.add_argument("--workers", type=int, default=1)
    up.add_argument("--http-port", type=int, default=int(env("DYN_HTTP_PORT", "8000")))
    up.add_argument("--system-port", type=int, default=9345, help="first worker's status port")
    up.add_argument("--namespace", default=env("DYN_NAMESPACE", "lorafleet"))
    up.add_argument("--state-dir", type=Path, default=Path(".lorafleet"))
    up.add_argument("--secure", action="store_true",
                    help="generate certificates, users and passwords under STATE_DIR/secure: "
                         "etcd with TLS and auth, NATS with authorization "
                         "(deploy/nats/auth.conf)")  # fmt: skip
    commands.add_parser("worker", help="run a worker (same flags as python -m worker)")
    commands.add_parser("frontend", help="run a frontend (same flags as python -m frontend)")
    lora = commands.add_parser(
        "lora",
        help="load, unload or list adapters on workers; apply or delete the fleet's desired state",
    )
    lora.add_argument("action", choices=["load", "unload", "list", "apply", "delete"])
    lora.add_argument("name", nargs="?")
    lora.add_argument("uri", nargs="?")
    lora.add_argument("--worker", action="append", help="a worker's status URL (repeatable)")
    lora.add_argument("--etcd-endpoints", default=env("ETCD_ENDPOINTS", DEFAULT_ETCD_ENDPOINTS))
    lora.add_argument("--namespace", default=env("DYN_NAMESPACE", "lorafleet"))
    lora.add_argument("--base-model", help="apply: the base model the adapter was trained for")
    lora.add_argument("--replicas", type=_replicas, default=1,
                      help='apply: instances that keep it loaded, a number or "all"; '
                           "0 loads it only on demand (default 1)")  # fmt: skip
    lora.add_argument("--pinned", action="store_true", help="apply: never evict placed copies")
    lora.add_argument("--frontend", default=f"http://127.0.0.1:{env('DYN_HTTP_PORT', '8000')}",
                      help="apply/delete: frontend URL (token: DYN_ADMIN_TOKEN)")  # fmt: skip
    models = commands.add_parser("models", help="list the models a frontend serves")
    models.add_argument("--url", default=f"http://127.0.0.1:{env('DYN_HTTP_PORT', '8000')}")
    return parser


def _replicas(value: str) -> int | str:
    if value == "all":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{value!r} is neither a number nor "all"') from None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lorafleet`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        from worker.__main__ import main as worker_main

        return worker_main(argv[1:])
    if argv[:1] == ["frontend"]:
        from frontend.__main__ import main as frontend_main

        return frontend_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "up":
        return _up(args)
    if args.command == "lora":
        return _lora(args)
    from launch.admin import list_models

    return list_models(args.url)


def _up(args: argparse.Namespace) -> int:
    from discovery.logs import configure_logging
    from launch.cluster import ClusterOptions, run_cluster

    configure_logging(process="lorafleet-up")
    options = ClusterOptions(
        engine=args.engine, model=args.model, served_model_name=args.served_model_name,
        workers=args.workers, http_port=args.http_port, system_port=args.system_port,
        namespace=args.namespace, state_dir=args.state_dir, secure=args.secure,
    )  # fmt: skip
    return run_cluster(options)


def _lora(args: argparse.Namespace) -> int:
    from launch.admin import AdapterApply, apply_adapter, delete_adapter, discover, lora_command

    if args.action == "apply":
        if not (args.name and args.uri and args.base_model):
            print("lorafleet lora apply needs a NAME, a URI and --base-model", file=sys.stderr)
            return 2
        adapter = AdapterApply(
            name=args.name, uri=args.uri, base_model=args.base_model,
            replicas=args.replicas, pinned=args.pinned,
        )  # fmt: skip
        return apply_adapter(args.frontend, adapter)
    if args.action == "delete":
        if not args.name:
            print("lorafleet lora delete needs a NAME", file=sys.stderr)
            return 2
        return delete_adapter(args.frontend, args.name)
    if args.action in ("load", "unload") and not args.name:
        print(f"lorafleet lora {args.action} needs a NAME", file=sys.stderr)
        return 2
    if args.action == "load" and not args.uri:
        print("lorafleet lora load needs a NAME and a URI (file://, s3://, ...)", file=sys.stderr)
        return 2
    try:
        workers = args.worker or discover(
            EtcdSettings.from_env(endpoints=args.etcd_endpoints), args.namespace
        )
    except (ValueError, EtcdUnavailableError) as exc:  # one line, no traceback
        print(f"lorafleet lora {args.action}: {exc}", file=sys.stderr)
        return 1
    return lora_command(args.action, name=args.name, uri=args.uri, workers=workers)
