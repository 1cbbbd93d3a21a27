"""Two edgeserve processes on loopback, the upstream 5 ms away behind the delay proxy.

Both share this box's two cores, so the upstream serves a lighter model with the same inputs and
outputs: it stands in for a faster server (a GPU box) that can take the local box's excess.

The same seeded Poisson overload (above the local box's capacity even at its shallowest exit) is
sent to a local-only server and to one with the upstream configured: offload lowers violations.
Then the upstream is SIGKILLed mid-run: every request still gets exactly one answer, the breaker
opens and what follows is served locally.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from offload_support import (
    LoadResult,
    Process,
    free_port,
    poisson_times,
    send_poisson,
    start_proxy,
    start_serve,
    write_conv_model,
)

from edgeserve.scheduler import LatencyModel

SLO_MS = 150
RUN_S = 3.0
OVERLOAD = 2.0  # x the local capacity at the shallowest exit with full batches: an overload even
# when the profile was measured at a quieter moment than the run (shared CI machines)


@dataclass
class Setup:
    root: Path
    work: Path
    upstream: Process
    proxy_port: int
    capacity: float  # requests/s the local box serves at its shallowest exit, full batches
    inputs: np.ndarray


def _local_toml(root: Path, *, offload_to: int | None, metrics_port: int | None = None) -> str:
    text = f"""
repository = "{root}"
shutdown_timeout_s = 5
[backend]
threads = 1
warmup = 1
[scheduler]
late_tasks = "expire"
[models.conv]
slo_ms = {SLO_MS}
max_queue = 512
[listen]
tcp = "127.0.0.1:0"
max_in_flight = 512  # the whole overload reaches the server (the client keeps to the window)
"""
    if metrics_port is not None:
        text += f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n'
    if offload_to is not None:
        text += f"""
[[upstreams]]
name = "edge2"
url = "http://127.0.0.1:{offload_to}"
timeout_ms = 400
probe_interval_s = 0.2
failures_to_open = 2
cooldown_s = 0.5
[upstreams.models.conv]
"""
    return text


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("offload")
    root = work / "engines"
    table = write_conv_model(root)
    model = LatencyModel.from_profiles([table]).models[0]
    capacity = model.max_batch / model.latency(0, model.max_batch)
    upstream_root = work / "upstream-engines"
    write_conv_model(upstream_root, light=True)  # a faster server's stand-in (see write_conv_model)
    upstream = start_serve(
        f"""
repository = "{upstream_root}"
[backend]
threads = 1
warmup = 1
[models.conv]
slo_ms = {SLO_MS}
max_queue = 512
[listen]
tcp = "127.0.0.1:0"
http = "127.0.0.1:0"
""",
        work,
        "upstream",
    )
    http = upstream.url("http://").removeprefix("http://")
    proxy, proxy_port = start_proxy(http, delay_ms=5)
    inputs = np.random.default_rng(0).standard_normal((32, 3, 48, 48)).astype(np.float32)
    try:
        yield Setup(root, work, upstream, proxy_port, capacity, inputs)
    finally:
        upstream.stop()
        proxy.terminate()
        proxy.wait(10)


def _run(
    setup: Setup, toml: str, name: str, seed: int, kill_at: float | None = None
) -> tuple[LoadResult, str]:
    local = start_serve(toml, setup.work, name)
    times = poisson_times(OVERLOAD * setup.capacity, RUN_S, seed)

    async def main() -> LoadResult:
        loop = asyncio.get_running_loop()
        if kill_at is not None:
            loop.call_later(kill_at, setup.upstream.kill)
        await asyncio.sleep(0.6)  # a few health probes: the link estimate exists before the load
        return await send_poisson(local.url("tcp://"), "conv", setup.inputs, times)

    metrics = ""
    try:
        result = asyncio.run(main())
        port = re.search(r'\[metrics\]\nlisten = "127.0.0.1:(\d+)"', toml)
        if port:
            with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/metrics", timeout=5) as response:
                metrics = response.read().decode()
    finally:
        assert local.stop() == 0, local.log.read_text()[-3000:]
    return result, metrics


def test_offload_lowers_violations_under_overload(setup: Setup) -> None:
    alone, _ = _run(setup, _local_toml(setup.root, offload_to=None), "local-only", seed=1)
    helped, _ = _run(setup, _local_toml(setup.root, offload_to=setup.proxy_port), "with-offload", seed=1)
    for result in (alone, helped):
        assert not result.errors and result.answered == result.sent
    report = (
        f"capacity {setup.capacity:.0f}/s, offered {OVERLOAD}x; "
        f"local-only violations {alone.violations:.1%}, with offload {helped.violations:.1%} "
        f"({helped.upstream_share:.1%} served upstream)"
    )
    print(report)
    assert alone.upstream_share == 0.0
    assert alone.violations >= 0.10, report
    assert helped.upstream_share > 0.05, report
    assert helped.violations < 0.7 * alone.violations, report


def test_killing_the_upstream_mid_run_loses_no_request(setup: Setup) -> None:
    kill_at = 0.6 + RUN_S / 3  # after the probes, a third into the load
    metrics_port = free_port()
    toml = _local_toml(setup.root, offload_to=setup.proxy_port, metrics_port=metrics_port)
    result, metrics = _run(setup, toml, "killed", seed=2, kill_at=kill_at)
    assert not result.errors and result.answered == result.sent  # exactly one answer each
    load_kill = kill_at - 0.6
    before = [s for t, s in zip(result.sent_at, result.served_by, strict=True) if t < load_kill - 0.2]
    after = [s for t, s in zip(result.sent_at, result.served_by, strict=True) if t > load_kill + 1.0]
    assert "edge2" in before  # offload was working before the kill
    assert after and set(after) == {"local"}  # afterwards everything is served here
    state = re.search(r'edgeserve_upstream_state\{[^}]*state="closed"[^}]*\} (\d)', metrics)
    assert state is not None and state.group(1) == "0", metrics[-2000:]  # the breaker is not closed
    fallbacks = re.search(r"edgeserve_upstream_fallbacks_total\{[^}]*\} (\d+)", metrics)
    failed = re.search(r"edgeserve_upstream_failed_total\{[^}]*\} (\d+)", metrics)
    assert fallbacks and failed and int(failed.group(1)) >= 1
