"""The benchmarks run end to end and print well-formed figures (never timed here).

Each runs as ``python -m bench.<name>`` with a tiny duration, starting its own
etcd, NATS, frontend and workers; only the shape of the JSON and the errors
that must be zero are checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from statistics import median
from typing import Any

import pytest

pytestmark = pytest.mark.slow

BENCH_TIMEOUT_S = 150


def _bench(tmp_path: Path, name: str, *args: str) -> dict[str, Any]:
    out = tmp_path / f"{name}.json"
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args, "--json", str(out)],
        capture_output=True, text=True, timeout=BENCH_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), "the table is missing"
    result = json.loads(out.read_text())
    assert result["bench"] == name
    assert {"cpus", "load_avg_1_5_15"} <= result["machine"].keys()
    return result


@pytest.mark.timeout(BENCH_TIMEOUT_S + 30)
def test_serve_reports_every_mode_and_concurrency_without_errors(tmp_path: Path) -> None:
    result = _bench(tmp_path, "serve", "--duration-s", "0.3", "--warmup-s", "0.1",
                    "--concurrency", "1", "4")  # fmt: skip
    rows = {(row["mode"], row["concurrency"]): row for row in result["results"]}
    assert set(rows) == {(m, c) for m in ("chat", "chat-stream", "nats") for c in (1, 4)}
    for (mode, _concurrency), row in rows.items():
        assert row["errors"] == 0 and row["requests_per_s"] > 0
        assert row["p50_ms"] <= row["p99_ms"]
        assert {"frontend", "workers", "client", "nats_server"} == row["cpu_ms_per_request"].keys()
        assert (row["ttft_p50_ms"] is None) == (mode == "chat")


@pytest.mark.timeout(BENCH_TIMEOUT_S + 30)
def test_lora_reports_rounds_empty_populated_and_cold_without_errors(tmp_path: Path) -> None:
    result = _bench(tmp_path, "lora", "--rounds", "3", "--adapters", "8", "--workers", "2",
                    "--samples", "5", "--cold-rounds", "2")  # fmt: skip
    assert set(result["results"]) == {"empty", "populated", "cold_mocker"}
    cold = result["results"].pop("cold_mocker")
    assert cold["rounds"] == 2 and cold["cold_p50_ms"] is not None
    for scenario in result["results"].values():
        assert scenario["rounds"] == 3 and scenario["errors"] == 0
        assert scenario["visible_p50_ms"] is not None and scenario["gone_p50_ms"] is not None
    assert result["results"]["empty"]["models_entries"] == 1  # the base model
    assert result["results"]["populated"]["models_entries"] == 9  # and eight adapters


@pytest.mark.timeout(BENCH_TIMEOUT_S + 30)
def test_failover_loses_no_request_and_no_stream_when_a_worker_is_killed(tmp_path: Path) -> None:
    result = _bench(tmp_path, "failover", "--rounds", "1", "--lease-ttl-s", "1")
    summary = result["results"]
    assert summary["failed_whole"] == 0 and summary["requests_whole"] > 0
    assert summary["failed_stream"] == 0 and summary["requests_stream"] > 0
    assert summary["streams_text_differs"] == summary["streams_usage_differs"] == 0
    assert summary["models_gone_max_s"] > 0
    (only,) = result["rounds"]
    assert only["whole"]["requests_after_kill"] > 0


@pytest.mark.timeout(BENCH_TIMEOUT_S + 30)
def test_etcd_recovery_reports_an_outage_and_a_leader_kill_that_lose_nothing(
    tmp_path: Path,
) -> None:
    result = _bench(tmp_path, "etcd_recovery", "--rounds", "1", "--outage-s", "1",
                    "--lease-ttl-s", "3")  # fmt: skip
    (outage,) = result["outage"]
    assert outage["lease_survived"] and outage["keepalive_resumed_s"] >= 0
    kill = result["leader_kill"]
    assert kill["records_unchanged"] and kill["records"] > 0
    assert kill["failed"] == 0 and kill["requests"] > 0
    (only,) = kill["kills"]
    assert only["leader_elected_s"] > 0 and only["keepalive_resumed_s"] > 0


@pytest.mark.timeout(BENCH_TIMEOUT_S + 30)
def test_scale_reports_every_figure_for_a_tiny_fleet_under_churn(tmp_path: Path) -> None:
    result = _bench(tmp_path, "scale", "--instances", "3", "--cards", "12", "--churn-per-s", "10",
                    "--churn-s", "0.5", "--samples", "3", "--route-samples", "20")  # fmt: skip
    (row,) = result["results"]
    assert (row["instances"], row["cards"]) == (3, 12)
    assert row["models_entries"] == 13  # the base model and twelve adapters
    assert row["changes"] == 5 and row["unroutable"] == 0 and row["lag_p50_ms"] is not None
    for figure in ("ready_s", "ready_base_s", "registry_build_ms", "rss_per_card_kib",
                   "route_p50_us", "route_p99_us", "models_p50_ms", "models_p99_ms", "models_bytes",
                   "lag_p99_ms", "revisions_per_s", "etcd_db_mib", "placement_ms"):  # fmt: skip
        assert row[figure] is not None, figure
    # no error and every change routable (checked above); whether churn kept its rate is a
    # timing, which this test does not judge: on a busy machine it may report falling behind
    assert result["knee"] is None and "broke" not in row


PLACEMENT_FIGURES = {
    "copies_declared", "copies_at_start", "requests", "failed", "failures", "failure_messages",
    "window_s",
    "adapter_loads", "loads_per_min", "loads_vs_on_demand", "on_demand_loads", "waited_share",
    "served_per_worker", "busiest_over_mean", "top_ttft_p50_ms", "top_ttft_p99_ms",
    "tail_ttft_p50_ms", "tail_ttft_p99_ms", "warm_ttft_p50_ms", "warm_ttft_p99_ms",
    "tail_over_warm_p99", "cpu_cores",
}  # fmt: skip
PLACEMENT_PROCESSES = {"frontend", "workers", "client", "nats_server", "etcd"}
TIMED = ("_ms", "_p99")


@pytest.mark.timeout(BENCH_TIMEOUT_S + 30)
def test_placement_reports_every_figure_for_every_policy(tmp_path: Path) -> None:
    result = _bench(tmp_path, "placement", "--workers", "2", "--slots", "2", "--adapters", "6",
                    "--duration-s", "3", "--warmup-s", "0", "--rate", "10")  # fmt: skip
    policies = result["results"]
    assert list(policies) == ["bounded", "rendezvous", "on-demand"]
    for figures in policies.values():
        assert figures.keys() == PLACEMENT_FIGURES
        assert figures["requests"] == 30
        assert len(figures["served_per_worker"]) == 2
        assert figures["cpu_cores"].keys() == PLACEMENT_PROCESSES
        # a group's TTFT is None only when all its requests failed (a 429 or 424 the fleet
        # may answer on these two slots); the base model never waits for an adapter
        counts = {key: value for key, value in figures.items() if not key.endswith(TIMED)}
        assert None not in counts.values(), figures
        assert figures["warm_ttft_p50_ms"] is not None
    assert policies["on-demand"]["copies_declared"] == 0
    assert policies["rendezvous"]["copies_declared"] == 2  # half the four slots
    assert result["targets"].keys() <= PLACEMENT_FIGURES
    assert result["bounds"]["best_online_per_min"] > 0 and result["bounds"]["belady_per_min"] > 0


@pytest.mark.timeout(BENCH_TIMEOUT_S + 30)
def test_rollout_rolls_a_bad_canary_back_switches_and_swaps_versions_without_errors(
    tmp_path: Path,
) -> None:
    result = _bench(tmp_path, "rollout", "--workers", "1", "--frontends", "2",
                    "--concurrency", "8", "--window-s", "1", "--min-requests", "5",
                    "--switch-after-s", "0.5", "--swap-settle-s", "0.5")  # fmt: skip
    canary, switch = result["results"]["canary"], result["results"]["switch"]
    assert canary["phase"] == "rolled_back" and canary["windows_until_rollback"] >= 1
    assert canary["bad_requests_failed"] > 0
    assert switch["failed"] == 0 and switch["answers_neither_version"] == 0
    assert switch["requests"] > 0
    (swap,) = result["results"]["swaps"]  # the mocker's in-place swap
    assert swap["failed"] == 0 and swap["answers_neither_version"] == 0
    assert swap["answers_old_version"] > 0 and swap["answers_new_version"] > 0


@pytest.mark.timeout(BENCH_TIMEOUT_S + 30)
def test_tenants_refuses_the_flooder_and_serves_the_others(tmp_path: Path) -> None:
    result = _bench(tmp_path, "tenants", "--duration-s", "2", "--rate", "4", "--quota", "4",
                    "--slots", "1", "--time-per-token-s", "0.02")  # fmt: skip
    phases = result["results"]
    assert set(phases) == {"open", "keys", "flood", "saturated"}
    flood = phases["flood"]["tenants"]
    assert flood["c"]["refused_429"] > 0
    assert flood["a"]["errors"] == flood["b"]["errors"] == 0
    saturated = phases["saturated"]["tenants"]  # c at 40 req/s of 160 ms each, 1 slot
    assert saturated["c"]["refused_429"] > 0
    assert saturated["a"]["errors"] == saturated["b"]["errors"] == 0
    assert phases["open"]["frontend_cpu_ms_per_request"] > 0


@pytest.mark.timeout(BENCH_TIMEOUT_S + 30)
def test_slo_adds_a_copy_and_reports_attainment_before_and_after(tmp_path: Path) -> None:
    result = _bench(tmp_path, "slo", "--after-s", "1", "--add-timeout-s", "60")
    figures = result["results"]
    assert figures["failed"] == 0
    assert figures["copy_added_after_s"] is not None
    assert figures["reason"].startswith("ttft p95 ")
    assert figures["before"]["requests"] > 0 and figures["judged_windows"]
    assert {"requests", "ttft_p50_ms", "ttft_p95_ms", "within_target"} <= figures["after"].keys()


@pytest.mark.timeout(BENCH_TIMEOUT_S + 30)
def test_prefix_reports_every_workload_and_the_workers_hits(tmp_path: Path) -> None:
    result = _bench(tmp_path, "prefix", "--routers", "prefix", "--workers", "2",
                    "--clients", "2", "--adapters", "1", "--max-tokens", "2",
                    "--prefixes", "2", "--prefix-words", "64", "--question-words", "4",
                    "--conversations", "2", "--turns", "2", "--opening-words", "64",
                    "--unique-requests", "4", "--unique-words", "64")  # fmt: skip
    runs = result["results"]
    assert set(runs) == {"shared", "multiturn", "unique"}
    for workload, by_router in runs.items():
        figures = by_router["prefix"]
        assert figures["failed"] == 0 and figures["requests"] > 0, (workload, figures)
        assert figures["frontend_cpu_ms_per_request"] >= 0  # 0 within a clock tick
    # repeats of a prompt hit the workers' own caches; prompts that share nothing never do
    assert runs["shared"]["prefix"]["hit_ratio"] > 0
    assert runs["multiturn"]["prefix"]["hit_ratio"] > 0
    assert runs["unique"]["prefix"]["hit_ratio"] == 0


@pytest.mark.timeout(BENCH_TIMEOUT_S + 30)
def test_prefix_at_once_drives_every_routers_cluster_in_the_same_round(tmp_path: Path) -> None:
    result = _bench(tmp_path, "prefix", "--at-once", "--routers", "least-inflight", "prefix",
                    "--workloads", "unique", "--workers", "2", "--adapters", "1",
                    "--max-tokens", "2", "--unique-requests", "8",
                    "--unique-words", "64")  # fmt: skip
    by_router = result["results"]["unique"]
    assert set(by_router) == {"least-inflight", "prefix"}
    for figures in by_router.values():
        assert figures["failed"] == 0 and figures["requests"] == 8, figures
    assert result["settings"]["at_once"] is True


@pytest.mark.timeout(BENCH_TIMEOUT_S + 30)
def test_prefix_open_loop_starts_every_conversation_and_runs_its_turns(tmp_path: Path) -> None:
    result = _bench(tmp_path, "prefix", "--routers", "prefix", "--workloads", "multiturn",
                    "--rate", "50", "--workers", "2", "--adapters", "1", "--max-tokens", "2",
                    "--conversations", "4", "--turns", "2", "--opening-words", "64")  # fmt: skip
    figures = result["results"]["multiturn"]["prefix"]
    assert figures["failed"] == 0 and figures["requests"] == 4 * 2, figures
    assert figures["hit_ratio"] > 0  # each second turn resends its first: it hits
    assert result["settings"]["rate"] == 50


def test_prefix_refuses_a_rate_that_is_not_positive() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.prefix", "--rate", "0"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert "'0' is not a rate" in done.stderr


@pytest.mark.timeout(BENCH_TIMEOUT_S + 30)
def test_prefix_repeats_report_medians_and_cpu_against_least_inflight_round_by_round(
    tmp_path: Path,
) -> None:
    result = _bench(tmp_path, "prefix", "--routers", "least-inflight", "prefix",
                    "--workloads", "unique", "--repeat", "2", "--workers", "2",
                    "--clients", "2", "--adapters", "1", "--max-tokens", "2",
                    "--unique-requests", "8", "--unique-words", "64")  # fmt: skip
    by_router = result["results"]["unique"]
    assert list(by_router) == ["least-inflight", "prefix"]
    for figures in by_router.values():
        runs = figures["runs"]
        assert figures["repeats"] == len(runs) == 2
        assert figures["requests"] == sum(run["requests"] for run in runs) == 16
        for key in ("ttft_p50_ms", "ttft_p90_ms", "req_per_s"):
            low, high = sorted(run[key] for run in runs)
            assert low <= figures[key] <= high, (key, figures)
    cpu = "frontend_cpu_ms_per_request"
    pairs = zip(by_router["prefix"]["runs"], by_router["least-inflight"]["runs"], strict=True)
    ratios = [prefix[cpu] / least[cpu] for prefix, least in pairs if least[cpu]]
    if ratios:  # a run can use less than one clock tick of CPU
        assert by_router["prefix"]["cpu_over_least_inflight"] == round(median(ratios), 3)


def test_prefix_router_cost_prints_every_router_for_every_workload() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.prefix_router_cost", "--repeat", "1",
         "--workloads", "unique", "shared"],
        capture_output=True, text=True, timeout=BENCH_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|")[1:4] for line in done.stdout.splitlines()[2:]]
    routers = ["least-inflight", "prefix-approx", "prefix"]
    assert [(w.strip(), r.strip()) for w, r, _ in rows] == [
        (w, r) for w in ("unique", "shared") for r in routers
    ]
    assert all(float(us) > 0 for _, _, us in rows)
