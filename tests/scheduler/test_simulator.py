"""The discrete-event simulator: hand-checked timelines, conservation, determinism, arrivals, metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgeserve.errors import EdgeServeError
from edgeserve.fingerprint import Fingerprint
from edgeserve.profile import ProfileCell, ProfileTable
from edgeserve.scheduler.accuracy import paper_accuracy
from edgeserve.scheduler.arrivals import bursty, poisson, replay
from edgeserve.scheduler.latency import LatencyModel
from edgeserve.scheduler.metrics import summarize
from edgeserve.scheduler.policies import POLICIES, make_policy
from edgeserve.scheduler.service import ServiceTimes
from edgeserve.scheduler.simulator import DROPPED, FINISHED, TaskLog, simulate
from edgeserve.scheduler.synthetic import paper_gpu_profiles


def _one_model_profile(ms_by_batch: list[float], exit_names: tuple[str, ...] = ("final",)) -> ProfileTable:
    table = ProfileTable(
        model="tiny",
        exit_names=exit_names,
        max_batch=len(ms_by_batch),
        fingerprint=Fingerprint(backend="test", device="test"),
        graphs_sha256="test",
    )
    for e in range(len(exit_names)):
        for b, ms in enumerate(ms_by_batch, start=1):
            table.add(ProfileCell.from_samples(e, b, [ms * (e + 1)] * 5))
    return table


def _replay_file(tmp_path: Path, rows: list[tuple[float, str]]) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text("time_s,model\n" + "".join(f"{t},{m}\n" for t, m in rows))
    return path


def test_hand_checked_timeline_with_deterministic_service_times(tmp_path: Path) -> None:
    # One model, final exit, 10 ms at batch 1 and 15 ms at batch 2, budget 20 ms, All-Final.
    # t=0: task 0 arrives, GPU idle -> runs alone, done at 10 ms (latency 10 ms).
    # t=1, 2 ms: tasks 1, 2 queue; at 10 ms they run as a batch of 2, done at 25 ms:
    #   latencies 24 and 23 ms > 20 ms -> both late. Violation ratio 2/3.
    table = _one_model_profile([10.0, 15.0])
    latency = LatencyModel.from_profiles([table])
    trace = replay(_replay_file(tmp_path, [(0.0, "tiny"), (0.001, "tiny"), (0.002, "tiny")]), ["tiny"], 1.0)
    log = simulate(make_policy("all-final", latency), trace, ServiceTimes([table], "quantile"), [0.020])
    assert np.allclose(log.start, [0.0, 0.010, 0.010])
    assert np.allclose(log.latency * 1000, [10.0, 24.0, 23.0])
    assert log.batch.tolist() == [1, 2, 2] and log.batches == 2
    overall = summarize(log, latency.names, (table.exit_names,))[0]
    assert (overall.finished, overall.late, overall.dropped) == (3, 2, 0)
    assert overall.violation_ratio == pytest.approx(2 / 3)
    assert overall.exit_mix == {"final": 1.0}


def test_a_dispatch_overhead_delays_every_batch_and_keeps_the_accelerator_busy(tmp_path: Path) -> None:
    # As above with 1 ms of dispatch overhead: task 0 starts at 1 ms, ends at 11 ms; tasks 1 and 2
    # are decided on at 11 ms, start at 12 ms and end at 27 ms (latencies 26 and 25 ms).
    table = _one_model_profile([10.0, 15.0])
    latency = LatencyModel.from_profiles([table])
    trace = replay(_replay_file(tmp_path, [(0.0, "tiny"), (0.001, "tiny"), (0.002, "tiny")]), ["tiny"], 1.0)
    service = ServiceTimes([table], "quantile")
    log = simulate(make_policy("all-final", latency), trace, service, [0.020], dispatch_overhead_s=0.001)
    assert np.allclose(log.start, [0.001, 0.012, 0.012])
    assert np.allclose(log.latency * 1000, [11.0, 26.0, 25.0])
    with pytest.raises(ValueError, match="dispatch_overhead_s"):
        simulate(make_policy("all-final", latency), trace, service, [0.020], dispatch_overhead_s=-1e-3)


def test_warmup_tasks_are_excluded_from_metrics(tmp_path: Path) -> None:
    table = _one_model_profile([10.0, 15.0])
    latency = LatencyModel.from_profiles([table])
    trace = replay(_replay_file(tmp_path, [(0.0, "tiny"), (0.001, "tiny"), (0.002, "tiny")]), ["tiny"], 1.0)
    log = simulate(make_policy("all-final", latency), trace, ServiceTimes([table], "quantile"), [0.020])
    overall = summarize(log, latency.names, (table.exit_names,), warmup_tasks=1)[0]
    assert overall.tasks == 2 and overall.late == 2 and overall.violation_ratio == 1.0


def _assert_conserved(log: TaskLog, n_arrivals: int, max_batch: int) -> None:
    assert log.state.size == n_arrivals
    assert set(np.unique(log.state).tolist()) <= {FINISHED, DROPPED}
    done = log.state == FINISHED
    assert np.all(log.start[done] >= log.arrival[done])
    assert np.all(log.finish[done] > log.start[done])
    assert np.all((log.batch[done] >= 1) & (log.batch[done] <= max_batch))
    assert np.all(log.exit[~done] == -1) and np.all(np.isnan(log.start[~done]))
    # One accelerator, no preemption: batches never overlap in time.
    starts, ends = np.unique(np.stack([log.start[done], log.finish[done]], axis=1), axis=0).T
    assert np.all(starts[1:] >= ends[:-1] - 1e-12)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_arrival_finishes_or_is_dropped_exactly_once(policy: str) -> None:
    tables = paper_gpu_profiles(samples=20)
    latency = LatencyModel.from_profiles(tables)
    trace = poisson([900.0, 600.0, 300.0], duration_s=1.0, seed=3)  # past saturation: queues build up
    log = simulate(make_policy(policy, latency), trace, ServiceTimes(tables), [0.05] * 3, seed=1)
    _assert_conserved(log, len(trace), 10)


def test_same_seed_gives_identical_runs_and_another_seed_does_not() -> None:
    tables = paper_gpu_profiles(samples=20)
    latency = LatencyModel.from_profiles(tables)
    service = ServiceTimes(tables)

    def run(seed: int) -> TaskLog:
        trace = bursty([300.0, 200.0, 100.0], duration_s=1.0, seed=seed)
        return simulate(make_policy("stability", latency), trace, service, [0.05] * 3, seed=seed)

    first, again, other = run(0), run(0), run(1)
    for field in ("arrival", "finish", "exit", "batch", "state"):
        assert np.array_equal(getattr(first, field), getattr(again, field), equal_nan=True)
    assert first.arrival.size != other.arrival.size or not np.array_equal(first.arrival, other.arrival)


def test_poisson_and_bursty_traffic_have_the_requested_mean_rate() -> None:
    steady = poisson([400.0, 100.0], duration_s=20.0, seed=0)
    bursts = bursty([400.0, 100.0], duration_s=20.0, seed=0, peak=4.0, mean_on_s=0.1)
    for trace in (steady, bursts):
        counts = np.bincount(trace.models, minlength=2) / 20.0
        assert counts == pytest.approx([400.0, 100.0], rel=0.15)
        assert np.all(np.diff(trace.times) >= 0) and trace.times.max() < 20.0
    # Bursty traffic is burstier: its per-10-ms counts vary much more than Poisson's.
    bins = np.arange(0, 20.01, 0.01)
    assert np.var(np.histogram(bursts.times, bins)[0]) > 2 * np.var(np.histogram(steady.times, bins)[0])


def test_replay_reads_a_timestamp_file_and_names_bad_rows(tmp_path: Path) -> None:
    trace = replay(_replay_file(tmp_path, [(0.5, "b"), (0.1, "a"), (0.3, "b")]), ["a", "b"])
    assert trace.times.tolist() == [0.1, 0.3, 0.5] and trace.models.tolist() == [0, 1, 1]
    with pytest.raises(EdgeServeError, match=r"trace.csv:2: model 'c'"):
        replay(_replay_file(tmp_path, [(0.1, "c")]), ["a", "b"])
    with pytest.raises(EdgeServeError, match="no such replay file"):
        replay(tmp_path / "missing.csv", ["a"])


def test_metrics_per_model_and_accuracy_follow_the_exits_used() -> None:
    tables = paper_gpu_profiles(samples=20)
    latency = LatencyModel.from_profiles(tables)
    accuracy = paper_accuracy({t.model: t.exit_names for t in tables})
    trace = poisson([60.0, 40.0, 20.0], duration_s=2.0, seed=0)
    log = simulate(make_policy("all-early", latency), trace, ServiceTimes(tables), [0.05] * 3)
    overall, *per_model = summarize(log, latency.names, tuple(t.exit_names for t in tables), accuracy, 10)
    assert [m.scope for m in per_model] == ["ResNet50", "ResNet101", "ResNet152"]
    assert sum(m.tasks for m in per_model) == overall.tasks == len(trace) - 10
    assert overall.exit_mix == {"layer1": 1.0}
    # All-Early: every task scores its model's layer1 accuracy (7.64 / 7.39 / 7.29 %).
    assert per_model[2].mean_accuracy == pytest.approx(0.0729)
    assert 0.0729 < overall.mean_accuracy < 0.0764
    assert overall.violation_ratio == 0.0 and overall.p95_ms < 5.0
    assert overall.throughput_rps == pytest.approx(len(trace) / 2.0, rel=0.15)


def test_a_task_draws_the_same_quantile_of_its_cell_whatever_the_policy() -> None:
    # Common random numbers: the service time of a batch is its cell's sample at the quantile
    # position of the batch's first task. Sparse arrivals (every task runs alone), two policies
    # that serve every task at different exits: each task's rank within its cell is the same.
    tables = paper_gpu_profiles(samples=50, cv=0.5)  # wide: no two samples round to the same value
    latency = LatencyModel.from_profiles(tables)
    trace = poisson([5.0, 5.0, 5.0], duration_s=4.0, seed=2)
    ranks = []
    for policy in ("all-early", "all-final"):
        log = simulate(make_policy(policy, latency), trace, ServiceTimes(tables), [0.5] * 3, seed=4)
        assert np.all(log.batch == 1)
        rank = []
        for task in range(len(trace)):
            cell = tables[int(log.model[task])].cells[(int(log.exit[task]), 1)]
            took_ms = (log.finish - log.start)[task] * 1000.0
            rank.append(int(np.argmin(np.abs(np.sort(cell.samples_ms) - took_ms))))
        ranks.append(rank)
    assert len(set(ranks[0])) > 20  # the draws do vary
    assert ranks[0] == ranks[1]


def test_quantile_positions_spread_over_a_cells_samples_keep_its_distribution() -> None:
    table = _one_model_profile([10.0])
    table.add(ProfileCell.from_samples(0, 1, [3.0, 1.0, 4.0, 1.5, 9.0]))  # replaces the 10 ms cell
    service = ServiceTimes([table])
    drawn = [service.draw(0, 0, 1, u) for u in np.arange(0.0, 1.0, 0.1)]  # uniform positions
    assert sorted(drawn) == [s / 1000.0 for s in [1.0, 1.0, 1.5, 1.5, 3.0, 3.0, 4.0, 4.0, 9.0, 9.0]]
    assert service.draw(0, 0, 1, 0.0) == 0.001 and service.draw(0, 0, 1, 0.999999) == 0.009
