"""Session fixtures: real etcd and NATS servers from the pip-installed binaries.

Where a Docker engine exists and ``LORAFLEET_TEST_CONTAINERS=1``, the same
fixtures start them with testcontainers instead.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

import pytest

from lorafleet.discovery.client import EtcdClient, connect_etcd
from lorafleet.launch.local_servers import LocalServer, start_etcd, start_nats
from tests.containers import container_servers

if TYPE_CHECKING:
    from lorafleet.launch.demo_model import DemoModelPaths


@pytest.fixture(scope="session")
def servers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("servers")


@contextlib.contextmanager
def _shared_server(
    name: str, start: Callable[[Path], LocalServer], data_dir: Path
) -> Iterator[str]:
    """A session-wide server: a container when LORAFLEET_TEST_CONTAINERS=1, else the binary."""
    if os.environ.get("LORAFLEET_TEST_CONTAINERS") == "1":
        with container_servers(name) as url:
            yield url
        return
    server = start(data_dir)
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def etcd_url(servers_dir: Path) -> Iterator[str]:
    """URL of a shared etcd for the whole session."""
    with _shared_server("etcd", start_etcd, servers_dir / "etcd-shared") as url:
        yield url


@pytest.fixture(scope="session")
def nats_url(servers_dir: Path) -> Iterator[str]:
    """URL of a shared NATS server for the whole session."""
    with _shared_server("nats", start_nats, servers_dir / "nats-shared") as url:
        yield url


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[LocalServer]:
    """An etcd of this test alone, for tests that stop or restart it."""
    server = start_etcd(tmp_path / "etcd-own")
    yield server
    server.stop()


@pytest.fixture
async def etcd(etcd_url: str) -> AsyncIterator[EtcdClient]:
    client = await connect_etcd(etcd_url)
    yield client
    await client.close()


@pytest.fixture(scope="session")
def demo(pytestconfig: pytest.Config) -> DemoModelPaths:
    """The demo model, built once into the repository's ignored ``.lorafleet/`` (then cached)."""
    from lorafleet.launch.demo_model import (
        ensure_demo_model,  # torch loads only for tests that need it
    )

    return ensure_demo_model(pytestconfig.rootpath / ".lorafleet" / "demo")


@pytest.fixture
def namespace() -> str:
    """A namespace of this test alone, so tests sharing etcd never see each other."""
    return f"t{uuid.uuid4().hex[:10]}"


def pytest_configure(config: pytest.Config) -> None:
    """Logs of in-process servers go to stderr, as in production."""
    from lorafleet.process.logs import configure_logging

    configure_logging(process="tests", level="warning")


IN_CI: Final = os.environ.get("CI", "").lower() in ("1", "true", "yes")
"""CI sets CI=true. There every tool a test needs is installed (the Makefile's targets
install them) and the run is root, so a skipped test would be a check that never ran."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Report a failure even when CPython 3.11.7's AST bug (python/cpython#106905) breaks
    pytest's source-reading traceback: CI once lost a whole run to that INTERNALERROR.
    From then on failures show native tracebacks, which read no source through ``ast``.
    In CI, a skip is reported as a failure that names its reason."""
    try:
        report: pytest.TestReport = yield
    except SystemError as exc:
        if "AST constructor recursion depth mismatch" not in str(exc):
            raise
        item.config.option.tbstyle = "native"
        report = pytest.TestReport.from_item_and_call(item, call)
    return _skip_fails_in_ci(report)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """In CI, a module skipped whole (``importorskip``, ``allow_module_level``) fails too."""
    return _skip_fails_in_ci((yield))


_Report = TypeVar("_Report", pytest.TestReport, pytest.CollectReport)


def _skip_fails_in_ci(report: _Report) -> _Report:
    """Under CI, turn a skip (not an expected failure) into a failure naming its reason."""
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        _, _, reason = report.longrepr if isinstance(report.longrepr, tuple) else ("", 0, "")
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (CI=true), where every test must run: {reason}"
    return report
