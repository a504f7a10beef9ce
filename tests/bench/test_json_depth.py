"""``bench.json_depth`` runs and reports every body it names (its figures are never timed here)."""

from __future__ import annotations

from bench.json_depth import BODIES, build_parser, run


def test_reports_each_body_and_refuses_exactly_the_deep_ones() -> None:
    args = build_parser().parse_args(["--rounds", "1", "--only", "deep"])
    results = run(args)
    assert results["bench"] == "json_depth"
    rows = {row["body"]: row for row in results["results"]}
    assert set(rows) == {name for name in BODIES if "deep" in name}
    assert all(row["refused"] and row["decode_ms"] is None for row in rows.values())
