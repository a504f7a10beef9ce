"""``lorafleet up``: a whole local cluster on one machine, stopped cleanly by Ctrl-C.

Starts etcd and NATS from the pip-installed binaries, a frontend and workers
as child processes (their output prefixed by process name), loads the demo
adapters through each worker's ``load_lora`` route and prints what to try.
"""

from __future__ import annotations

import shutil
import signal
import socket
import sys
import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx

from discovery.keys import DEFAULT_NAMESPACE
from discovery.settings import EtcdSettings
from launch.local_servers import LocalServer, free_port, start_etcd, start_nats
from launch.processes import (
    ServiceProcess,
    frontend_argv,
    spawn_service,
    stop_services,
    worker_argv,
)
from launch.secure_nats import NatsCredentials, nats_credentials, start_secure_nats

__all__ = ["ClusterOptions", "run_cluster"]

READY_TIMEOUT_S: Final = 300.0
CHILD_STOP_TIMEOUT_S: Final = 20.0


@dataclass(frozen=True, kw_only=True)
class ClusterOptions:
    """What ``lorafleet up`` starts.

    Examples::

        ClusterOptions()                                   # hf worker, demo model, port 8000
        ClusterOptions(engine="mocker", workers=2)
        ClusterOptions(engine="vllm", model="/models/llama", adapters={})
        ClusterOptions(secure=True)                        # NATS with authorization
    """

    engine: str = "hf"
    model: str | None = None
    served_model_name: str = "demo"
    workers: int = 1
    http_port: int = 8000
    system_port: int = 9345
    namespace: str = DEFAULT_NAMESPACE
    state_dir: Path = Path(".lorafleet")
    adapters: dict[str, str] | None = None
    """Adapters to load by name and URI; None means the demo's pirate and robot."""
    extra_worker_args: tuple[str, ...] = field(default_factory=tuple)
    secure: bool = False
    """Generate certificates, users and passwords under ``state_dir/secure``: etcd with TLS
    and auth, NATS with ``deploy/nats/auth.conf``."""


def run_cluster(options: ClusterOptions) -> int:
    """Run the cluster until Ctrl-C or SIGTERM; returns the exit code."""
    model, adapters = _model_and_adapters(options)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with ExitStack() as stack:
        (etcd, etcd_settings, etcdctl_flags), nats, nats_env = _start_servers(options, stack)
        env = {
            **etcd_settings.env(),
            "NATS_SERVER": nats.url,
            "DYN_NAMESPACE": options.namespace,
        }
        children: list[ServiceProcess] = []
        stack.callback(stop_services, children, CHILD_STOP_TIMEOUT_S)
        frontend_env = {**env, **nats_env("frontend")}
        children.append(
            _spawn("frontend", _frontend_argv(options), options.http_port, frontend_env)
        )
        for index in range(options.workers):
            port = options.system_port + index
            worker_env = {**env, **nats_env("worker")}
            children.append(
                _spawn(f"worker-{index}", _worker_argv(options, model, port), port, worker_env)
            )
        _wait_ready(children)
        frontend, workers = children[0], children[1:]
        worker_urls = [worker.url for worker in workers]
        _load_adapters(worker_urls, adapters)
        _print_next_steps(options, frontend.url, worker_urls, adapters, etcd, etcdctl_flags)
        try:
            while not stop.is_set() and all(c.process.poll() is None for c in children):
                stop.wait(0.5)
        except KeyboardInterrupt:
            pass
        print("\nstopping lorafleet ...", flush=True)
    print("stopped: no process left, nothing left in etcd", flush=True)
    return 0


def _model_and_adapters(options: ClusterOptions) -> tuple[str, dict[str, str]]:
    if options.model is not None:
        return options.model, dict(options.adapters or {})
    from launch.demo_model import ensure_demo_model

    print("building the demo model (cached after the first time) ...", flush=True)
    demo = ensure_demo_model()
    default = {name: f"file://{path}" for name, path in demo.adapters.items()}
    return str(demo.base), default if options.adapters is None else dict(options.adapters)


def _start_servers(
    options: ClusterOptions, stack: ExitStack
) -> tuple[tuple[LocalServer, EtcdSettings, str], LocalServer, Callable[[str], dict[str, str]]]:
    data = options.state_dir.resolve()
    shutil.rmtree(data / "servers", ignore_errors=True)  # a fresh etcd: nothing stale
    etcd = _start_etcd(options, data)
    stack.callback(etcd[0].stop)
    nats, nats_env = _start_nats(options, data)
    stack.callback(nats.stop)
    return etcd, nats, nats_env


def _start_nats(
    options: ClusterOptions, data: Path
) -> tuple[LocalServer, Callable[[str], dict[str, str]]]:
    """NATS, and the ``NATS_AUTH_*`` variables of a role (none unless ``--secure``)."""
    port = _port_or_free(4222)
    if not options.secure:
        return start_nats(data / "servers", port=port), lambda role: {}
    credentials: NatsCredentials = nats_credentials(data)
    nats = start_secure_nats(data / "servers", credentials, namespace=options.namespace, port=port)
    return nats, credentials.client_env


def _start_etcd(options: ClusterOptions, data: Path) -> tuple[LocalServer, EtcdSettings, str]:
    """etcd, the settings its clients need and etcdctl's flags for it."""
    port = _port_or_free(2379)
    if not options.secure:
        etcd = start_etcd(data / "servers", port=port)
        return etcd, EtcdSettings.from_endpoints(etcd.url), f"--endpoints {etcd.url}"
    from launch.secure_etcd import start_secure_etcd

    secure = start_secure_etcd(data, data / "servers", port=port)
    return secure.server, secure.settings, secure.etcdctl_flags()


def _port_or_free(preferred: int) -> int:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            return free_port()


def _frontend_argv(options: ClusterOptions) -> list[str]:
    return frontend_argv(port=options.http_port, host=None)  # DYN_HTTP_HOST or all interfaces


def _worker_argv(options: ClusterOptions, model: str, port: int) -> list[str]:
    extra = ["--served-model-name", options.served_model_name, "--enable-lora",
             "--advertise-host", "127.0.0.1", *options.extra_worker_args]  # fmt: skip
    return worker_argv(port=port, model=model, engine=options.engine, args=extra)


def _spawn(name: str, argv: list[str], port: int, env: dict[str, str]) -> ServiceProcess:
    return spawn_service(name, argv, port, env={**env, "DYN_LORA_ENABLED": "true"}, log_path=None)


def _wait_ready(children: list[ServiceProcess]) -> None:
    for child in children:
        try:
            child.wait_ready(READY_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{child.name} did not start; see the log lines above") from exc


def _load_adapters(worker_urls: list[str], adapters: dict[str, str]) -> None:
    for url in worker_urls:
        for name, uri in adapters.items():
            body = {"lora_name": name, "source": {"uri": uri}}
            response = httpx.post(f"{url}/engine/update/load_lora", json=body, timeout=120)
            if response.status_code != 200:
                raise RuntimeError(f"loading {name} on {url} failed: {response.text}")


def _print_next_steps(
    options: ClusterOptions,
    frontend_url: str,
    worker_urls: list[str],
    adapters: dict[str, str],
    etcd: LocalServer,
    etcdctl_flags: str,
) -> None:
    etcdctl = Path(sys.executable).parent / "etcdctl"
    chat = (
        '{"model": "%s", "messages": [{"role": "user", "content": "Who are you?"}], '
        '"temperature": 0}'
    )
    lines = [
        "",
        "lorafleet is up. Try:",
        f"  curl -s {frontend_url}/v1/models",
        *(
            f"  curl -s {frontend_url}/v1/chat/completions -H 'Content-Type: application/json' "
            f"-d '{chat % name}'"
            for name in [options.served_model_name, *adapters]
        ),
        f"  {etcdctl} {etcdctl_flags} get --prefix v1/mdc/",
        f"  curl -s {worker_urls[0]}/v1/loras",
        f"Logs: prefixed by process above; etcd and NATS logs in {etcd.data_dir}",
        "Press Ctrl-C to stop everything.",
        "",
    ]
    print("\n".join(lines), flush=True)
