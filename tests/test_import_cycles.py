"""The packages import one way only: no module circle, and no arrow back up the layers
``proto``, ``process`` <- ``discovery`` <- ``fleet`` <- ``worker``, ``frontend`` <- ``launch``
<- ``bench`` (``worker`` and ``frontend`` never import each other). ``scripts/house_figures.py``
prints the same graph's figures."""

from __future__ import annotations

from pathlib import Path

from scripts.house_figures import cycles, import_graph

ROOT = Path(__file__).resolve().parents[1]
LAYER = {"proto": 0, "process": 0, "discovery": 1, "fleet": 2, "worker": 3, "frontend": 3,
         "launch": 4, "bench": 5}  # fmt: skip


def test_no_module_imports_itself_round_a_circle() -> None:
    assert cycles(import_graph(ROOT)) == []


def test_no_package_imports_a_later_layer_or_its_sibling() -> None:
    backwards = sorted(
        f"{name} -> {target}"
        for name, targets in import_graph(ROOT, typing_too=True).items()
        for target in targets
        if (low := LAYER[name.split(".")[0]]) < (high := LAYER[target.split(".")[0]])
        or (low == high and name.split(".")[0] != target.split(".")[0])
    )
    assert backwards == []
