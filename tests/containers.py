"""etcd and NATS in containers via testcontainers, for machines with a Docker engine.

Used by the session fixtures only when ``LORAFLEET_TEST_CONTAINERS=1``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

IMAGES: Final = {
    "etcd": ("quay.io/coreos/etcd:v3.5.17", 2379),
    "nats": ("nats:2.10-alpine", 4222),
}


@contextlib.contextmanager
def container_servers(name: str) -> Iterator[str]:
    """Run the ``name`` server in a container and yield its client URL."""
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    image, port = IMAGES[name]
    container = DockerContainer(image).with_exposed_ports(port)
    if name == "etcd":
        container = container.with_command(
            "etcd --listen-client-urls=http://0.0.0.0:2379 "
            "--advertise-client-urls=http://127.0.0.1:2379"
        )
    with container:
        wait_for_logs(container, "ready to serve client requests|Server is ready", timeout=30)
        host = container.get_container_host_ip()
        scheme = "http" if name == "etcd" else "nats"
        yield f"{scheme}://{host}:{container.get_exposed_port(port)}"
