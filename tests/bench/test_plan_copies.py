"""``bench.plan_copies`` times every change it names (its figures are never checked here)."""

from __future__ import annotations

from bench.plan_copies import build_parser, run


def test_reports_the_first_pass_and_each_change() -> None:
    args = build_parser().parse_args(["--instances", "5", "--adapters", "50", "--rounds", "1"])
    results = run(args)
    assert results["bench"] == "plan_copies"
    changes = [row["change"] for row in results["results"]]
    assert changes[0].startswith("first pass") and "an instance joins" in changes
    assert all(row["ms"] >= 0 for row in results["results"])
