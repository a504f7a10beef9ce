"""Fixtures for engine tests: the demo model, built once per session (and cached across runs)."""

from __future__ import annotations

import pytest

from launch.demo_model import DemoModelPaths, ensure_demo_model


@pytest.fixture(scope="session")
def demo(pytestconfig: pytest.Config) -> DemoModelPaths:
    """The demo model, built into the repository's ignored ``.lorafleet/`` on first use."""
    return ensure_demo_model(pytestconfig.rootpath / ".lorafleet" / "demo")
