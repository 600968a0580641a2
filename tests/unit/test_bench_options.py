"""The benchmark harness's pure logic (bench/run.py, bench/workloads.py, bench/l1.py):
latency percentiles, the rate list and count options, workload aliases, and the rows
of the L1, latency and idle-memory tables. The benchmarks themselves are not run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import run as bench_run  # noqa: E402
import workloads  # noqa: E402
from l1 import lavinmq_body  # noqa: E402


def test_percentiles_are_nearest_rank() -> None:
    samples = [i * 1_000_000 for i in range(1, 101)]  # 1..100 ms, shuffled below
    got = workloads.percentiles_ms(samples[::-1])
    assert got["p50_ms"] == 50.0
    assert got["p99_ms"] == 99.0  # not the maximum: 99 of 100 samples are at or below 99 ms
    assert got["max_ms"] == 100.0
    assert got["mean_ms"] == pytest.approx(50.5)
    assert got["samples"] == 100


def test_percentiles_of_one_and_none() -> None:
    assert workloads.percentiles_ms([]) == {}
    one = workloads.percentiles_ms([2_500_000])
    assert one["p50_ms"] == one["p99_ms"] == one["max_ms"] == 2.5


@pytest.mark.parametrize(("spec", "rates"), [
    ("10000,50000", (10000, 50000)), ("10k, 50K", (10000, 50000)), ("5000,", (5000,)),
])
def test_parse_rates(spec: str, rates: tuple[int, ...]) -> None:
    assert workloads.parse_rates(spec) == rates


@pytest.mark.parametrize("spec", ["", ",", "0", "-5", "fast", "1.5k"])
def test_parse_rates_rejects(spec: str) -> None:
    with pytest.raises(ValueError):
        workloads.parse_rates(spec)


def test_options_reach_settings() -> None:
    args = bench_run.parse_args(["--latency-rates", "10k,50k", "--idle-queues", "10000",
                                 "--idle-connections", "1000", "--l1-publishers", "2"])
    assert args.latency_rates == (10000, 50000)
    assert (args.idle_queues, args.idle_connections, args.l1_publishers) == (10000, 1000, 2)
    defaults = bench_run.parse_args([])
    assert defaults.latency_rates is None
    assert (defaults.idle_queues, defaults.idle_connections, defaults.l1_publishers) == (100_000, 10_000, 1)
    with pytest.raises(SystemExit):
        bench_run.parse_args(["--latency-rates", "soon"])


def test_aliases() -> None:
    assert bench_run.resolve_workloads("l1") == ["l1-16b", "l1-1k"]
    assert bench_run.resolve_workloads("memory,g") == ["idle-queues", "idle-connections", "l1-16b", "l1-1k"]
    all_ = bench_run.resolve_workloads("all")
    assert "l1-16b" in all_ and "latency" in all_
    assert "idle-queues" not in all_  # opt-in: minutes on RabbitMQ


def test_lavinmq_body() -> None:
    assert lavinmq_body(16) == bytes(range(64, 80))
    assert lavinmq_body(30)[26:] == bytes([90, 64, 65, 66])  # i % 27 + 64 wraps after 27


def _l1(published: int, consumed: int, cpu_us: float) -> dict:
    return {"section": workloads.L1_SECTION, "published_msg_per_s": published, "consumed_msg_per_s": consumed,
            "broker_cpu_us_per_msg": cpu_us, "broker_cpu_pct": 100.0, "consumer_cpu_pct": 61.0,
            "publisher_cpu_pct": [3.0, 4.0], "backlog_at_end": published - consumed}


def test_tables_of_new_sections() -> None:
    results = {
        "leveret": {"rows": {
            "l1-16b publish": _l1(1000, 900, 10.0), "l1-16b consume": _l1(1000, 900, 11.1),
            "latency @10000/s": {"target_rate": 10000, "achieved_rate": 9990.0, "msg_per_s": 9985.0,
                                 "write_gap_max_ms": 1.5, "p50_ms": 0.2, "p99_ms": 0.45, "max_ms": 3.0,
                                 "broker_cpu_us_per_msg": 20.0},
            "idle queues": {"section": workloads.MEMORY_SECTION, "messages": 100_000, "msg_per_s": 7000.0,
                            "rss_before_mb": 50.0, "rss_after_mb": 600.0, "rss_bytes_per_item": 5700.0},
        }},
        "rabbitmq": {"rows": {
            "idle queues": {"section": workloads.MEMORY_SECTION, "messages": 100_000, "msg_per_s": 400.0,
                            "rss_before_mb": 150.0, "rss_after_mb": 2600.0, "rss_bytes_per_item": 26000.0},
        }},
    }
    assert bench_run.l1_rows(results) == [
        ["l1-16b", "leveret", "1,000", "900", "10.00", "11.10", "100", "61", "3 + 4", "100"]]
    assert bench_run.latency_rows(results) == [
        ["latency @10000/s", "leveret", "9,990", "9,985", "1.5", "0.200", "0.450", "3.00", "20.0"]]
    memory = bench_run.memory_rows(results)
    assert ["idle queues (100,000): bytes each", "5,700", "26,000", "0.22"] in memory
    assert ["idle queues (100,000): created per s", "7,000", "400", "17.50"] in memory
    # memory rows stay out of the msg/s table; L1 and latency rows are in it
    main = [r[0] for r in bench_run.table_rows(results)]
    assert main == ["l1-16b publish", "l1-16b consume", "latency @10000/s"]
