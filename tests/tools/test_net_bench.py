"""`edgeserve bench` against a real server: every request counted once, report, CSV and plot."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from net_support import net_config, server_thread
from runtime_support import config_dict, profiled_tiny_repository

from edgeserve.cli import main as cli_main
from edgeserve.errors import EdgeServeError
from edgeserve.loop import run
from edgeserve.tools.bench import (
    BenchResult,
    BenchSettings,
    Record,
    format_report,
    run_bench,
    split_rate,
    summaries,
    write_csv,
)


@pytest.fixture(scope="module")
def served_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bench") / "engines"
    profiled_tiny_repository(root)
    return root


def test_bench_counts_every_request_once_and_reports_per_model(served_root: Path, tmp_path: Path) -> None:
    with server_thread(net_config(config_dict(served_root), tmp_path)) as srv:
        settings = BenchSettings(srv.unix_url, {"tiny_a": 60.0, "tiny_b": 30.0}, duration_s=1.0, warmup_s=0.2)
        ticks: list[float] = []
        result = run(run_bench(settings, lambda elapsed, sent, answered: ticks.append(elapsed)))
        server_stats = srv.stats()
    sent = len(result.records)
    assert 30 < sent < 200  # ~90 expected at 90 requests/s for 1 s
    assert all(r.status == "ok" for r in result.records)  # 1 s SLOs on tiny models: all served in time
    rows = {s.name: s for s in summaries(result)}
    assert rows["all"].sent == sent == rows["tiny_a"].sent + rows["tiny_b"].sent
    assert rows["all"].violation_pct == 0.0 and rows["all"].unanswered == 0
    assert 0 < rows["all"].p50_ms <= rows["all"].p95_ms <= rows["all"].p99_ms
    assert server_stats.requests >= sent  # warm-up requests are served too, just not counted
    assert ticks and max(ticks) > 0.5
    report = format_report(result)
    assert report.splitlines()[0].split()[:3] == ["model", "sent", "ok"]
    assert "statuses: ok" in report
    write_csv(result, tmp_path / "bench.csv")
    with (tmp_path / "bench.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == sent


def test_bench_cli_splits_the_total_rate_and_writes_csv_and_plot(
    served_root: Path, tmp_path: Path, capsys
) -> None:
    with server_thread(net_config(config_dict(served_root), tmp_path)) as srv:
        argv = [
            "bench",
            "--target",
            srv.tcp_url,
            "--total-rate",
            "40",
            "--ratios",
            "3,1",
            "--duration",
            "0.5",
        ]
        argv += [
            "--warmup",
            "0",
            "--no-progress",
            "--csv",
            str(tmp_path / "b.csv"),
            "--plot",
            str(tmp_path / "b.png"),
        ]
        assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "tiny_a 30.0/s, tiny_b 10.0/s" in out
    assert any(line.startswith("all ") for line in out.splitlines())
    assert (tmp_path / "b.csv").stat().st_size > 0 and (tmp_path / "b.png").stat().st_size > 0


def test_rates_follow_the_ratios_and_mismatches_are_refused() -> None:
    assert split_rate(["a", "b", "c"], (3, 2, 1), 60) == {"a": 30.0, "b": 20.0, "c": 10.0}
    with pytest.raises(EdgeServeError, match="--ratios has 2 values for 3 models"):
        split_rate(["a", "b", "c"], (1, 1), 60)


def test_the_report_says_when_answers_done_in_time_reached_the_client_late() -> None:
    """viol% is the server's verdict; answers it finished in time that the client got late (its own
    queue of requests, its CPU) are named on a line of their own."""
    result = BenchResult(
        BenchSettings("unix:///x", {"m": 10.0}), {"m": 10.0}, elapsed_s=1.0, slo_ms={"m": 50.0}
    )
    result.records = [Record("m", 0.0, latency_ms=5.0, status="ok") for _ in range(90)]
    assert "client:" not in format_report(result)
    result.records += [Record("m", 0.0, latency_ms=900.0, status="ok") for _ in range(10)]
    result.records += [Record("m", 0.0, latency_ms=900.0, status="ok", late=True)]  # the server's verdict
    report = format_report(result)
    assert summaries(result)[-1].violation_pct == pytest.approx(100 / 101)
    assert "client: 10 of 101 ok answers (9.9%) came back past their deadline" in report


def test_the_late_answer_line_offers_unix_only_to_a_run_that_is_not_over_unix_already() -> None:
    for target, offered in (("unix:///x", False), ("tcp://127.0.0.1:7070", True)):
        result = BenchResult(
            BenchSettings(target, {"m": 10.0}), {"m": 10.0}, elapsed_s=1.0, slo_ms={"m": 50.0}
        )
        result.records = [Record("m", 0.0, latency_ms=900.0, status="ok") for _ in range(10)]
        report = format_report(result)
        assert "came back past their deadline" in report
        assert ("or over unix://" in report) is offered, report
