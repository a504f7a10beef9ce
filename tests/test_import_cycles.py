"""No import cycles among lorafleet's modules, counting every import the source writes.

Imports under ``TYPE_CHECKING`` and inside functions count too: they are how a cycle hides
(``frontend.token_stream`` once imported ``Dispatcher`` back that way). A package's own
``__init__`` importing its modules is a dependency like any other, so a module importing
its package's ``__init__`` back is a cycle.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path

PACKAGES = ("proto", "process", "discovery", "fleet", "worker", "frontend", "launch")


def _modules() -> dict[str, Path]:
    """Every module of the packages by dotted name, with its source file."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        root = importlib.import_module(f"lorafleet.{package}")
        found[root.__name__] = Path(root.__file__)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{root.__name__}."):
            spec = importlib.util.find_spec(info.name)
            assert spec is not None and spec.origin is not None
            found[info.name] = Path(spec.origin)
    return found


def _imported(tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    """The lorafleet modules a module's source imports, wherever the import stands."""
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                targets.add(submodule if submodule in modules else node.module)
    return {name for name in targets if name in modules}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), or with a self-loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for target in graph[name]:
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in on_stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == name:
                    break
            if len(component) > 1 or name in graph[name]:
                components.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    return components


def test_the_packages_have_no_import_cycle() -> None:
    modules = _modules()
    graph = {
        name: _imported(ast.parse(path.read_text(), str(path)), modules)
        for name, path in modules.items()
    }
    assert _cycles(graph) == []


def test_the_check_finds_a_cycle_hidden_under_type_checking() -> None:
    modules = {"lorafleet.a": Path("a.py"), "lorafleet.b": Path("b.py")}
    a = ast.parse("from lorafleet.b import B")
    b = ast.parse("if TYPE_CHECKING:\n    from lorafleet.a import A")
    graph = {"lorafleet.a": _imported(a, modules), "lorafleet.b": _imported(b, modules)}
    assert _cycles(graph) == [["lorafleet.a", "lorafleet.b"]]
