"""A throwaway local cluster for one benchmark: etcd, NATS, frontends and workers on free ports.

Everything lives under one temporary directory (server data, logs, adapter
folders) and is stopped by PID when the ``BenchCluster`` block ends. Benchmarks
never import ``tests``; processes start and stop through ``launch.processes``.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from lorafleet.discovery.keys import nats_subject
from lorafleet.launch.etcd_cluster import EtcdCluster, start_etcd_cluster
from lorafleet.launch.local_servers import LocalServer, free_port, start_etcd, start_nats
from lorafleet.launch.processes import (
    READY_TIMEOUT_S,
    ServiceProcess,
    frontend_argv,
    spawn_service,
    stop_services,
    worker_argv,
)

__all__ = ["BenchCluster", "Service", "make_adapter_dir", "placeholder_weights"]

NAMESPACE: Final = "bench"


@dataclass
class Service(ServiceProcess):
    """A frontend or worker process; a worker also knows its instance id and NATS subject."""

    subject: str = ""
    instance_id: int = 0


@dataclass
class BenchCluster:
    """etcd, NATS and the frontends and workers a benchmark starts; a context manager."""

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="lorafleet-bench-")))
    lease_ttl_s: int = 10
    namespace: str = NAMESPACE
    etcd_members: int = 1
    """More than one: an etcd cluster of that many members (``etcd_cluster``)."""
    etcd: LocalServer | None = None
    etcd_cluster: EtcdCluster | None = None
    nats: LocalServer | None = None
    services: list[Service] = field(default_factory=list)

    def __enter__(self) -> BenchCluster:
        if self.etcd_members > 1:
            self.etcd_cluster = start_etcd_cluster(self.root / "etcd", size=self.etcd_members)
        else:
            self.etcd = start_etcd(self.root / "servers")
        self.nats = start_nats(self.root / "servers")
        return self

    def __exit__(self, *exc_info: object) -> None:
        stop_services(reversed(self.services))
        for server in (self.nats, self.etcd):
            if server is not None:
                server.stop()
        if self.etcd_cluster is not None:
            self.etcd_cluster.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def env(self) -> dict[str, str]:
        """Environment every lorafleet process of this cluster gets."""
        assert self.nats is not None
        return {
            "ETCD_ENDPOINTS": self.etcd_endpoints,
            "NATS_SERVER": self.nats.url,
            "DYN_NAMESPACE": self.namespace,
            "DYN_LEASE_TTL": str(self.lease_ttl_s),
            "DYN_LORA_ENABLED": "true",
            "DYN_LORA_PATH": str(self.root / "lora-cache"),
        }

    @property
    def etcd_endpoints(self) -> str:
        """``ETCD_ENDPOINTS`` of this cluster's etcd: one URL, or every member's."""
        if self.etcd_cluster is not None:
            return self.etcd_cluster.endpoints
        assert self.etcd is not None
        return self.etcd.url

    def frontend(self, *args: str, wait: bool = True) -> Service:
        """Start ``python -m lorafleet.frontend`` on a free port."""
        port = free_port()
        service = self._spawn(f"frontend-{port}", frontend_argv(port=port, args=args), port)
        if wait:
            service.wait_ready()
        return service

    def worker(
        self, model: str = "demo", *args: str, engine: str = "mocker", wait: bool = True
    ) -> Service:
        """Start ``python -m lorafleet.worker`` (more flags in ``args``) on a free status port."""
        port = free_port()
        argv = worker_argv(port=port, model=model, engine=engine, args=args)
        service = self._spawn(f"worker-{port}", argv, port)
        if wait:
            self.await_worker(service)
        return service

    def await_worker(self, service: Service, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait for a worker's ``/health`` and learn its instance id and NATS subject."""
        health = service.wait_ready(timeout_s)
        service.instance_id = int(str(health["instance_id"]), 16)
        service.subject = nats_subject(self.namespace, "backend", "generate", service.instance_id)

    def adapter(self, name: str) -> str:
        """A ``file://`` URI of a placeholder adapter folder (the mocker reads no weights)."""
        return f"file://{make_adapter_dir(self.root / 'adapters', name)}"

    def _spawn(self, name: str, argv: list[str], port: int) -> Service:
        log_path = self.root / "logs" / f"{name}.log"
        spawned = spawn_service(name, argv, port, env=self.env, log_path=log_path)
        service = Service(**vars(spawned))
        self.services.append(service)
        return service


def placeholder_weights(payload: bytes) -> bytes:
    """A whole safetensors file holding ``payload`` as one ``U8`` tensor: what engines that
    read no weights (mocker) are given; workers refuse weights that are no safetensors."""
    tensor = {"dtype": "U8", "shape": [len(payload)], "data_offsets": [0, len(payload)]}
    header = json.dumps({"placeholder": tensor}).encode()
    return struct.pack("<Q", len(header)) + header + payload


def make_adapter_dir(
    root: Path, name: str, base_model: str = "demo", weights: bytes = b"\x00" * 16
) -> Path:
    """Write a PEFT-shaped adapter folder with placeholder weights; return its path. Other
    ``weights`` (the one tensor's bytes) make another version (another digest)."""
    path = root / name.replace("/", "_")
    path.mkdir(parents=True, exist_ok=True)
    config = {"base_model_name_or_path": base_model, "peft_type": "LORA", "r": 8}
    (path / "adapter_config.json").write_text(json.dumps(config))
    (path / "adapter_model.safetensors").write_bytes(placeholder_weights(weights))
    return path
