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
    """Imports under ``TYPE_CHECKING`` count: that is where a circle hides
    (``frontend.token_stream`` once imported ``Dispatcher`` back that way)."""
    assert cycles(import_graph(ROOT, typing_too=True)) == []


def test_the_check_finds_a_circle_hidden_under_type_checking(tmp_path: Path) -> None:
    package = tmp_path / "proto"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from lorafleet.proto.b import B\n")
    (package / "b.py").write_text("if TYPE_CHECKING:\n    from lorafleet.proto.a import A\n")
    assert cycles(import_graph(tmp_path)) == []
    assert cycles(import_graph(tmp_path, typing_too=True)) == [["proto.a", "proto.b"]]


def test_no_package_imports_a_later_layer_or_its_sibling() -> None:
    backwards = sorted(
        f"{name} -> {target}"
        for name, targets in import_graph(ROOT, typing_too=True).items()
        for target in targets
        if (low := LAYER[name.split(".")[0]]) < (high := LAYER[target.split(".")[0]])
        or (low == high and name.split(".")[0] != target.split(".")[0])
    )
    assert backwards == []
