"""``lorafleet up``: a whole local cluster on one machine, stopped cleanly by Ctrl-C.

Stops what an earlier ``up`` in the same state directory left running (asked on a
terminal, or ``--replace``; ``launch.leftovers``), checks its HTTP ports (a taken one
stops it before anything starts), starts etcd and NATS from the pip-installed binaries
(on other ports when 2379 or 4222 are taken), a frontend and workers as child
processes (their output prefixed by process name; all of them die with ``up``, even
on SIGKILL), confirms the workers answering are its own, records the endpoints and
pids in ``<state dir>/cluster.json`` for the other commands, declares its adapters
(the demo's, and ``--adapter`` ones) in the fleet's desired state through the
frontend's ``/v1/adapters`` with ``replicas: "all"``, as compose
does, waits until every worker has them, and prints what to try.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from urllib.parse import quote

import httpx
import msgspec

from lorafleet.discovery.client import connect_etcd
from lorafleet.discovery.keys import DEFAULT_NAMESPACE, adapters_prefix
from lorafleet.discovery.settings import EtcdSettings
from lorafleet.launch.admin import instances
from lorafleet.launch.cluster_state import ChildProcess, ClusterState, remove_state, write_state
from lorafleet.launch.errors import ClusterNotReadyError
from lorafleet.launch.file_roots import file_roots_env
from lorafleet.launch.leftovers import command_line, stop_leftovers
from lorafleet.launch.local_servers import LocalServer, free_port, start_etcd, start_nats
from lorafleet.launch.ports import is_free, require_free
from lorafleet.launch.processes import (
    ServiceProcess,
    frontend_argv,
    spawn_service,
    stop_services,
    worker_argv,
)
from lorafleet.launch.secure_nats import NatsCredentials, nats_credentials, start_secure_nats
from lorafleet.proto.adapters import AdapterSpec, LoraSource
from lorafleet.proto.errors import LorafleetError

__all__ = ["ClusterOptions", "run_cluster"]

READY_TIMEOUT_S: Final = 300.0
CHILD_STOP_TIMEOUT_S: Final = 20.0
PLACED_POLL_S: Final = 0.2
"""How often ``up`` asks the frontend whether its adapters are on every worker yet."""


@dataclass(frozen=True, kw_only=True)
class ClusterOptions:
    """What ``lorafleet up`` starts.

    Examples::

        ClusterOptions()                                   # hf worker, demo model, port 8000
        ClusterOptions(engine="mocker", workers=2)
        ClusterOptions(engine="vllm", model="/models/llama", adapters={})
        ClusterOptions(extra_adapters={"sql": "file:///adapters/sql"})   # the demo's and sql
        ClusterOptions(engine_options=("enforce_eager=true",))          # each worker's option
        ClusterOptions(secure=True)                        # NATS with authorization
        ClusterOptions(host="0.0.0.0")                     # reachable from the network
        ClusterOptions(replace=True)                       # stop an earlier run's leftovers
    """

    engine: str = "hf"
    model: str | None = None
    served_model_name: str = "demo"
    workers: int = 1
    http_port: int = 8000
    system_port: int = 9345
    host: str = "127.0.0.1"
    """Where the frontend and the workers' status ports listen: this machine only, unless
    e.g. ``0.0.0.0`` opens them to the network."""
    namespace: str = DEFAULT_NAMESPACE
    state_dir: Path = Path(".lorafleet")
    adapters: dict[str, str] | None = None
    """Adapters to declare by name and URI; None means the demo's pirate and robot (none
    with ``model`` or the mocker engine)."""
    extra_adapters: dict[str, str] = field(default_factory=dict)
    """More adapters to declare beside ``adapters`` (``--adapter NAME=URI``)."""
    engine_options: tuple[str, ...] = ()
    """``KEY=JSON`` options passed to each worker as ``--engine-option`` (``--engine-option``)."""
    extra_worker_args: tuple[str, ...] = field(default_factory=tuple)
    secure: bool = False
    """Generate certificates, users and passwords under ``state_dir/secure``: etcd with TLS
    and auth, NATS with ``deploy/nats/auth.conf``."""
    replace: bool = False
    """Stop what an earlier ``up`` in ``state_dir`` left running without asking (``--replace``)."""


def run_cluster(options: ClusterOptions) -> int:
    """Run the cluster until Ctrl-C or SIGTERM; returns the exit code."""
    # a script's `lorafleet up &` starts it with SIGINT ignored, and Python keeps that: Ctrl-C
    # and `kill -INT` must stop the cluster however it was started
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stop_leftovers(options.state_dir, replace=options.replace)
    require_free(_http_ports(options))
    model, adapters = _model_and_adapters(options)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with ExitStack() as stack:
        (etcd, etcd_settings, etcdctl_flags), nats, nats_env = _start_servers(options, stack)
        stack.callback(_forget_desired_state, etcd_settings, options.namespace)
        env = {
            **etcd_settings.env(),
            "NATS_SERVER": nats.url,
            "DYN_NAMESPACE": options.namespace,
            **file_roots_env(adapters),  # the demo and cache folders unless told otherwise
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
        started = [(server.name, server.process) for server in (etcd, nats)]
        started += [(child.name, child.process) for child in children]
        _record_state(options, stack, worker_urls, nats.url, etcd_settings, started)
        _declare_adapters(frontend.url, options, adapters)
        _print_next_steps(options, frontend.url, worker_urls, adapters, etcd, etcdctl_flags)
        try:
            while not stop.is_set() and all(c.process.poll() is None for c in children):
                stop.wait(0.5)
        except KeyboardInterrupt:
            pass
        print("\nstopping lorafleet ...", flush=True)
    print("stopped: no process left, nothing left in etcd", flush=True)
    return 0


def _record_state(
    options: ClusterOptions, stack: ExitStack, worker_urls: list[str], nats_url: str,
    etcd: EtcdSettings, started: list[tuple[str, subprocess.Popen[bytes]]],
) -> None:  # fmt: skip
    """Write ``cluster.json`` once the workers proved their own; removed when ``stack`` ends."""
    processes = [ChildProcess(name=name, pid=process.pid, command=_program(process.pid))
                 for name, process in started]  # fmt: skip
    state = ClusterState(
        pid=os.getpid(), namespace=options.namespace,
        frontend_url=f"http://127.0.0.1:{options.http_port}", worker_urls=worker_urls,
        nats_url=nats_url, etcd_env=etcd.env(),
        instance_ids=_own_instances(worker_urls, etcd, options.namespace), processes=processes,
    )  # fmt: skip
    write_state(options.state_dir, state)
    stack.callback(remove_state, options.state_dir)


def _program(pid: int) -> str:
    """The program ``pid`` runs now, as ``ps`` shows it (after any launcher's exec)."""
    return command_line(pid).split(" ", 1)[0]


def _http_ports(options: ClusterOptions) -> dict[str, int]:
    """The ports a user chose (or the defaults): taken ones stop ``lorafleet up``."""
    workers = {
        f"worker-{index} status": options.system_port + index for index in range(options.workers)
    }
    return {"frontend HTTP": options.http_port, **workers}


def _model_and_adapters(options: ClusterOptions) -> tuple[str, dict[str, str]]:
    """The model to serve and every adapter to declare (its own, then ``extra_adapters``)."""
    model, adapters = _model_and_own_adapters(options)
    return model, {**adapters, **options.extra_adapters}


def _model_and_own_adapters(options: ClusterOptions) -> tuple[str, dict[str, str]]:
    if options.model is not None:
        return options.model, dict(options.adapters or {})
    if options.engine == "mocker":  # needs no weights: skip the demo model and its adapters
        return options.served_model_name, dict(options.adapters or {})
    from lorafleet.launch.demo_model import ensure_demo_model

    print("building the demo model (cached after the first time; about 15 s) ...", flush=True)
    started = time.monotonic()
    demo = ensure_demo_model()
    print(f"demo model ready in {time.monotonic() - started:.0f} s: {demo.base}", flush=True)
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
    from lorafleet.launch.secure_etcd import start_secure_etcd

    secure = start_secure_etcd(data, data / "servers", port=port)
    return secure.server, secure.settings, secure.etcdctl_flags()


def _port_or_free(preferred: int) -> int:
    return preferred if is_free(preferred) else free_port()


def _frontend_argv(options: ClusterOptions) -> list[str]:
    return frontend_argv(port=options.http_port, host=options.host)


def _worker_argv(options: ClusterOptions, model: str, port: int) -> list[str]:
    engine_options = [arg for option in options.engine_options
                      for arg in ("--engine-option", option)]  # fmt: skip
    extra = ["--served-model-name", options.served_model_name, "--enable-lora",
             "--advertise-host", "127.0.0.1", "--system-host", options.host, *engine_options,
             *options.extra_worker_args]  # fmt: skip
    return worker_argv(port=port, model=model, engine=options.engine, args=extra)


def _spawn(name: str, argv: list[str], port: int, env: dict[str, str]) -> ServiceProcess:
    return spawn_service(name, argv, port, env={**env, "DYN_LORA_ENABLED": "true"}, log_path=None)


def _wait_ready(children: list[ServiceProcess]) -> None:
    for child in children:
        try:
            child.wait_ready(READY_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as exc:
            message = f"{child.name} did not start; see the log lines above"
            raise ClusterNotReadyError(message) from exc


def _own_instances(worker_urls: list[str], etcd: EtcdSettings, namespace: str) -> list[str]:
    """The workers' instance ids, each confirmed registered in this cluster's etcd (waited
    for as the workers' own starts wait: a TLS handshake on a busy machine may fail once)."""
    listed = asyncio.run(instances(etcd, namespace, wait_s=READY_TIMEOUT_S))
    registered = {f"{i.instance_id:x}" for i in listed}
    ids = []
    for url in worker_urls:
        instance_id = httpx.get(f"{url}/health", timeout=5).json().get("instance_id", "")
        if instance_id not in registered:
            raise ClusterNotReadyError(
                f"the worker answering at {url} (instance {instance_id or '?'}) is not one "
                f"this cluster started: another process took its port"
            )
        ids.append(instance_id)
    return ids


def _declare_adapters(frontend_url: str, options: ClusterOptions, adapters: dict[str, str]) -> None:
    """Declare each adapter for every worker (``replicas: "all"``), then wait until every
    worker has it; a failed load ends ``up`` with the worker's error."""
    token = os.environ.get("DYN_ADMIN_TOKEN")
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    for name, uri in adapters.items():
        spec = AdapterSpec(name=name, base_model=options.served_model_name,
                           source=LoraSource(uri=uri), replicas="all")  # fmt: skip
        response = httpx.post(f"{frontend_url}/v1/adapters", content=msgspec.json.encode(spec),
                              headers=headers, timeout=30)  # fmt: skip
        if not response.is_success:
            raise ClusterNotReadyError(f"declaring adapter {name} failed: {response.text}")
    for name in adapters:
        _wait_placed(frontend_url, name, options.workers)


def _forget_desired_state(etcd: EtcdSettings, namespace: str) -> None:
    """Delete the desired state once every child stopped: it has no lease, and ``up`` leaves
    nothing in etcd (its next run starts a fresh etcd anyway)."""

    async def forget() -> None:
        client = await connect_etcd(etcd)
        try:
            await client.delete_prefix(adapters_prefix(namespace).encode())
        finally:
            await client.close()

    try:
        asyncio.run(forget())
    except LorafleetError as exc:  # etcd already gone: its data dir is wiped on the next run
        print(f"could not clear the desired adapters: {exc}", file=sys.stderr, flush=True)


def _wait_placed(frontend_url: str, name: str, workers: int) -> None:
    """Wait until ``workers`` instances have adapter ``name``; raise on its failed load."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    url = f"{frontend_url}/v1/adapters/{quote(name)}"
    while time.monotonic() < deadline:
        status = httpx.get(url, timeout=10).json()
        if status.get("state") == "failed":
            error = status["error"]
            raise ClusterNotReadyError(
                f"loading adapter {name} failed on instance {error['instance']}: "
                f"{error['code']}: {error['message']}"
            )
        if len(status.get("instances", [])) >= workers:
            return
        time.sleep(PLACED_POLL_S)  # a CLI asking a frontend: no event to wait for
    raise ClusterNotReadyError(f"adapter {name} was not on every worker after {READY_TIMEOUT_S} s")


def _print_next_steps(
    options: ClusterOptions,
    frontend_url: str,
    worker_urls: list[str],
    adapters: dict[str, str],
    etcd: LocalServer,
    etcdctl_flags: str,
) -> None:
    etcdctl = Path(sys.executable).parent / "etcdctl"
    lorafleet = Path(sys.executable).parent / "lorafleet"
    default_state = options.state_dir.resolve() == Path(".lorafleet").resolve()
    state_flag = "" if default_state else f" --state-dir {options.state_dir.resolve()}"
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
        f"  {lorafleet} status{state_flag}",
        f"  {lorafleet} lora list{state_flag}",
        f"Logs: prefixed by process above; etcd and NATS logs in {etcd.data_dir}",
        f"lorafleet on your PATH: source {Path(sys.executable).parent}/activate",
        "Press Ctrl-C to stop everything.",
        "",
    ]
    print("\n".join(lines), flush=True)
