"""Figures of the house: lines per package, import cycles, and the longest functions.

``python scripts/house_figures.py [ROOT]`` prints them for the tree at ROOT (default: this
repository), so that a checkout of an older commit can be measured the same way.
Imports count when they run with the module: those at module level and in class bodies,
not those inside functions or under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

PACKAGES: Final = ("proto", "process", "discovery", "fleet", "worker", "frontend", "launch",
                   "bench")  # fmt: skip


def modules(root: Path) -> dict[str, Path]:
    """Every module of the packages under ``root``, by its ``lorafleet.``-less dotted name."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        # Under lorafleet/ since issue 39; at the top level in older checkouts.
        folder = next(
            (d for d in (root / "lorafleet" / package, root / package) if d.is_dir()), None
        )
        for path in sorted(folder.rglob("*.py")) if folder else ():
            parts = path.relative_to(folder.parent).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _module_imports(tree: ast.Module, typing_too: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    def walk(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield node
            elif isinstance(node, ast.If) and (
                typing_too or "TYPE_CHECKING" not in ast.unparse(node.test)
            ):
                yield from walk(node.body)
                yield from walk(node.orelse)
            elif isinstance(node, ast.Try | ast.ClassDef):
                yield from walk(node.body)

    yield from walk(tree.body)


def import_graph(root: Path, typing_too: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports when it is imported (``typing_too``: and
    under ``if TYPE_CHECKING:``, where a circle hides from the interpreter, not the reader)."""
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _module_imports(ast.parse(path.read_text()), typing_too):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                    + ([base] if base else []))  # fmt: skip
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                target = target.removeprefix("lorafleet.")
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in graph:
        if node not in index:
            visit(node)
    return found


def package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles between packages (``worker`` imports ``frontend`` imports ``worker``)."""
    top = {name: name.split(".")[0] for name in graph}
    packages: dict[str, set[str]] = {package: set() for package in set(top.values())}
    for name, targets in graph.items():
        packages[top[name]] |= {top[t] for t in targets if top[t] != top[name]}
    return cycles(packages)


def longest_functions(root: Path, count: int = 10) -> list[tuple[int, str]]:
    """``(lines, where)`` of the longest functions and methods, longest first."""
    found = []
    for name, path in modules(root).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append(
                    (lines, f"{name}.{node.name} ({path.relative_to(root)}:{node.lineno})")
                )
    return sorted(found, reverse=True)[:count]


def main(argv: list[str]) -> int:
    """Print the figures of the tree at ``argv[0]`` (default: this repository)."""
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1]
    print("lines per package (*.py):")
    for package in PACKAGES:
        files = list((root / package).rglob("*.py")) if (root / package).is_dir() else []
        print(f"  {package:10} {sum(len(f.read_text().splitlines()) for f in files):6}"
              f"  in {len(files)} files")  # fmt: skip
    graph = import_graph(root)
    print(f"module import cycles: {len(cycles(graph))}")
    for cycle in cycles(graph):
        print("  " + " <-> ".join(cycle))
    typed = cycles(import_graph(root, typing_too=True))
    print(f"module import cycles counting TYPE_CHECKING imports: {len(typed)}")
    for cycle in typed:
        print("  " + " <-> ".join(cycle))
    print(f"package import cycles: {len(package_cycles(graph))}")
    for cycle in package_cycles(graph):
        print("  " + " <-> ".join(cycle))
    print("longest functions (lines):")
    for lines, where in longest_functions(root):
        print(f"  {lines:4}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
