"""``__all__`` is sorted and resolvable everywhere, and complete for the shared libraries.

The shared libraries (``proto``, ``process``, ``discovery``, ``fleet``) re-export every public
name of their modules; process packages keep their heavy modules (engines) out of ``__init__``
so that importing ``worker`` never loads torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

SHARED_LIBRARIES = [f"lorafleet.{name}" for name in ("proto", "process", "discovery", "fleet")]
PACKAGES = [*SHARED_LIBRARIES, *(f"lorafleet.{name}" for name in ("worker", "frontend", "launch"))]


def _submodules(package: str) -> list[str]:
    root = importlib.import_module(package)
    return [package] + [
        info.name
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}.")
        if not info.name.rsplit(".", 1)[-1].startswith("__")
    ]


@pytest.mark.parametrize("module_name", [m for p in PACKAGES for m in _submodules(p)])
def test_all_is_sorted_and_resolves(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = list(getattr(module, "__all__", []))
    assert exported == sorted(exported), f"{module_name}.__all__ is not sorted"
    missing = [name for name in exported if not hasattr(module, name)]
    assert not missing, f"{module_name}.__all__ names what it lacks: {missing}"


def _public_names(module: ModuleType) -> set[str]:
    return set(getattr(module, "__all__", []))


@pytest.mark.parametrize("package", SHARED_LIBRARIES)
def test_shared_library_reexports_every_public_name(package: str) -> None:
    root = importlib.import_module(package)
    for module_name in _submodules(package)[1:]:
        if module_name.rsplit(".", 1)[-1].startswith("_"):
            continue
        absent = _public_names(importlib.import_module(module_name)) - _public_names(root)
        assert not absent, f"{package}.__all__ lacks {sorted(absent)} from {module_name}"
