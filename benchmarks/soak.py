"""Soak: `edgeserve serve` under steady Poisson load for minutes; is anything lost, does memory grow?

Starts `edgeserve serve` as a subprocess (UNIX socket + metrics endpoint), drives Poisson traffic
over AsyncClient connections (one per model) from this process, and every `--every` seconds
samples the server's resident memory (/proc/<pid>/status VmRSS) and scrapes its /metrics. It
prints a row per sample (RSS, answers so far by status as the server counted them, cumulative
violation ratio), then a summary: requests sent against answered (nothing may be lost), answers by
status as the client saw them and as the server counted them (they must agree), the deadline
violation ratio (late `ok` answers plus `expired` ones, over all answers), and the RSS at the first
sample after the warm-up against the last one with the least-squares slope in MiB/hour. Exits 1 if
a request went unanswered or the counts differ.

    make demo                                                # once: digits models in ./engines
    .venv/bin/python benchmarks/soak.py                      # 5 minutes at ~50% of All-Final capacity
    .venv/bin/python benchmarks/soak.py --minutes 30 --plot out/soak.png
    .venv/bin/python benchmarks/soak.py --seconds 20 --rate 300   # a quick look

Defaults: the digits models of `make demo` in ./engines with the demo's SLOs (5/8/10 ms), ratios
3:2:1, ONNX Runtime on one thread (the profile's fingerprint), and a total rate of half the
All-Final capacity computed from the profile (each model at its final exit in full batches).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

from edgeserve.errors import EdgeServeError
from edgeserve.loop import run
from edgeserve.metrics.process import rss_bytes
from edgeserve.net.listeners import free_port
from edgeserve.repository import ModelRepository
from edgeserve.service.serve_cli import ready_urls
from edgeserve.tools.bench import default_ratios, split_rate
from edgeserve.tools.demo import DEMO_MODELS, DEMO_SLO_MS
from edgeserve.wire.client import AsyncClient, Reply

MIB = 2**20
STATUSES = ("ok", "expired", "rejected", "error", "invalid", "shutdown")
SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


# -- reading the endpoint -------------------------------------------------------------------------


def _unescape(match: re.Match[str]) -> str:
    return {"\\\\": "\\", '\\"': '"', "\\n": "\n"}[match.group(0)]


def read_exposition(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line of a text exposition (enough for edgeserve's)."""
    samples = []
    for line in text.splitlines():
        match = SAMPLE_RE.match(line)
        if line.startswith("#") or match is None:
            continue
        name, labels, number = match.groups()
        parsed = {k: re.sub(r'\\[\\"n]', _unescape, v) for k, v in LABEL_RE.findall(labels or "")}
        samples.append((name, parsed, float(number)))
    return samples


@dataclass(frozen=True)
class Scrape:
    """One scrape, summed over models: what the server wrote back and what its runtime answered."""

    by_status: dict[str, int]  # answers the socket frontend wrote, by status
    runtime_by_status: dict[str, int]  # of those, the ones the runtime answered (edgeserve_requests_total)
    violations: int
    rss_bytes: float  # as the server reports it (process_resident_memory_bytes)

    @classmethod
    def of(cls, text: str) -> Scrape:
        by_status: Counter[str] = Counter()
        runtime: Counter[str] = Counter()
        violations, rss = 0, math.nan
        for name, labels, value in read_exposition(text):
            if name == "edgeserve_frontend_answers_total":
                by_status[labels["status"]] += int(value)
            elif name == "edgeserve_requests_total":
                runtime[labels["status"]] += int(value)
            elif name == "edgeserve_deadline_violations_total":
                violations += int(value)
            elif name == "process_resident_memory_bytes":
                rss = value
        return cls(dict(by_status), dict(runtime), violations, rss)

    @property
    def answered(self) -> int:
        return sum(self.by_status.values())


# -- the server -----------------------------------------------------------------------------------


def write_config(
    path: Path, repository: Path, models: dict[str, float], sock: Path, metrics_port: int
) -> None:
    lines = [
        f"repository = {json.dumps(str(repository.resolve()))}",
        "[backend]",
        'name = "onnxruntime"',
        "threads = 1",
        "[listen]",
        f"unix = {json.dumps(str(sock))}",
        'unix_mode = "0600"',
        "[metrics]",
        f'listen = "127.0.0.1:{metrics_port}"',
    ]
    for model, slo_ms in models.items():
        lines += [f"[models.{json.dumps(model)}]", f"slo_ms = {slo_ms}"]
    path.write_text("\n".join(lines) + "\n")


def start_server(config: Path, log: Path, timeout_s: float = 120.0) -> subprocess.Popen[str]:
    """`edgeserve serve` in the background; returns once it printed its ready line."""
    serve = [str(Path(sys.executable).parent / "edgeserve"), "serve", "--config", str(config)]
    with log.open("w") as err:
        server = subprocess.Popen(serve, stdout=subprocess.PIPE, stderr=err, text=True)
    ready = threading.Event()

    def wait_ready() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            if ready_urls(line) is not None:
                ready.set()
        # keep reading until EOF so the server never blocks on a full pipe

    threading.Thread(target=wait_ready, daemon=True).start()
    if not ready.wait(timeout_s):
        server.kill()
        server.wait()
        raise EdgeServeError(f"`edgeserve serve` did not become ready in {timeout_s:.0f} s; see {log}")
    return server


def stop_server(server: subprocess.Popen[str]) -> int:
    server.send_signal(signal.SIGTERM)
    try:
        return server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        return server.wait()


# -- load and sampling ----------------------------------------------------------------------------


@dataclass
class Tally:
    """What the client saw: every request sent is answered (by status) or still pending."""

    sent: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    late: int = 0
    failed: int = 0  # the connection broke before the answer
    pending: set[asyncio.Future[Reply]] = field(default_factory=set)
    past_slo: int = 0  # `ok` answers back at this client after the SLO from their send (its view)

    @property
    def answered(self) -> int:
        return sum(self.by_status.values())

    def record(
        self, future: asyncio.Future[Reply], sent_at: float = math.inf, slo_s: float = math.inf
    ) -> None:
        self.pending.discard(future)
        if future.cancelled() or future.exception() is not None:
            self.failed += 1
            return
        reply = future.result()
        self.by_status[reply.status] += 1
        self.late += reply.status == "ok" and reply.late
        self.past_slo += reply.status == "ok" and time.monotonic() - sent_at > slo_s


@dataclass(frozen=True)
class Sample:
    t_s: float
    rss_mib: float
    sent: int
    scrape: Scrape


async def _arrivals(
    client: AsyncClient, model: str, rate: float, pool: list[np.ndarray], end: float, tally: Tally, seed: int
) -> None:
    draw = random.Random(seed)
    slo_s = float(client.models[model]["slo_ms"]) / 1000.0
    due = time.monotonic() + draw.expovariate(rate)
    while due < end:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        future = client.send(model, pool[draw.randrange(len(pool))])
        tally.sent += 1
        tally.pending.add(future)
        future.add_done_callback(functools.partial(tally.record, sent_at=time.monotonic(), slo_s=slo_s))
        due += draw.expovariate(rate)


def _row(sample: Sample) -> str:
    s = sample.scrape
    ratio = s.violations / s.answered if s.answered else 0.0
    counts = "".join(f"{s.by_status.get(k, 0):>10}" for k in ("ok", "expired", "rejected"))
    other = s.answered - sum(s.by_status.get(k, 0) for k in ("ok", "expired", "rejected"))
    head = f"{sample.t_s:>7.0f} {sample.rss_mib:>8.1f} {sample.sent:>10} {s.answered:>10}"
    return f"{head}{counts}{other:>7} {100 * ratio:>7.3f}"


HEADER = (
    f"{'t_s':>7} {'rss_MiB':>8} {'sent':>10} {'answered':>10}{'ok':>10}{'expired':>10}{'rejected':>10}"
    f"{'other':>7} {'viol%':>7}"
)


async def soak(
    url: str,
    metrics_url: str,
    pid: int,
    rates: dict[str, float],
    duration_s: float,
    every_s: float,
    seed: int,
) -> tuple[Tally, list[Sample], Scrape]:
    clients = {m: await AsyncClient.connect(url) for m in rates}
    tally = Tally()
    samples: list[Sample] = []
    try:
        table = next(iter(clients.values())).models
        rng = np.random.default_rng(seed)
        pools = {
            m: [
                rng.standard_normal(table[m]["input"]["shape"]).astype(table[m]["input"]["dtype"])
                for _ in range(16)
            ]
            for m in rates
        }
        async with aiohttp.ClientSession() as http:

            async def scrape() -> Scrape:
                async with http.get(metrics_url) as response:
                    response.raise_for_status()
                    return Scrape.of(await response.text())

            start = time.monotonic()
            end = start + duration_s
            load = asyncio.gather(
                *(
                    _arrivals(clients[m], m, r, pools[m], end, tally, seed + i)
                    for i, (m, r) in enumerate(rates.items())
                )
            )
            print(HEADER, flush=True)

            async def take_sample() -> Scrape:
                rss, scraped = rss_bytes(pid), await scrape()
                sample = Sample(time.monotonic() - start, (rss or 0) / MIB, tally.sent, scraped)
                samples.append(sample)
                print(_row(sample), flush=True)
                return sample.scrape

            next_sample = start
            while not load.done():
                if time.monotonic() >= next_sample:
                    await take_sample()
                    next_sample += every_s
                await asyncio.wait({load}, timeout=max(0.0, next_sample - time.monotonic()))
            await load
            if tally.pending:  # the last answers; nothing is abandoned before this timeout
                await asyncio.wait(set(tally.pending), timeout=10.0)
            final = await take_sample()
        return tally, samples, final
    finally:
        for client in clients.values():
            await client.close()


# -- summary --------------------------------------------------------------------------------------


def slope_mib_per_hour(samples: list[Sample]) -> float:
    if len(samples) < 2:
        return math.nan
    t = np.array([s.t_s for s in samples])
    rss = np.array([s.rss_mib for s in samples])
    return float(np.polyfit(t, rss, 1)[0] * 3600.0)


def summarize(tally: Tally, samples: list[Sample], final: Scrape, warmup_s: float) -> tuple[str, bool]:
    lost = tally.sent - tally.answered
    client = {k: tally.by_status.get(k, 0) for k in STATUSES}
    server = {k: final.by_status.get(k, 0) for k in STATUSES}
    runtime = {k: final.runtime_by_status.get(k, 0) for k in STATUSES}
    violations = tally.by_status.get("expired", 0) + tally.late
    at_client = tally.answered - tally.by_status.get("ok", 0) + tally.past_slo
    steady = [s for s in samples if s.t_s >= warmup_s] or samples
    lines = [
        "",
        f"sent {tally.sent}, answered {tally.answered}, lost {lost}"
        + (f" ({tally.failed} on a broken connection)" if tally.failed else ""),
        "answers by status (client): " + ", ".join(f"{k} {v}" for k, v in client.items()),
        "answers by status (server): " + ", ".join(f"{k} {v}" for k, v in server.items()),
        "  of which the runtime's:   "
        + ", ".join(f"{k} {v}" for k, v in runtime.items())
        + "  (the rest: the frontend's own refusals, e.g. too many in flight on a connection)",
        f"deadline violations: {violations} of {tally.answered} answered = "
        f"{100 * violations / max(tally.answered, 1):.3f}% (late ok + expired; server counted "
        f"{final.violations})",
        f"judged at this client: {at_client} of {tally.answered} answered = "
        f"{100 * at_client / max(tally.answered, 1):.3f}% (not ok, or ok but back past the SLO from its "
        "send, as benchmarks/overload.py judges; the line above is the server's view)",
    ]
    if steady:
        first, last = steady[0], steady[-1]
        lines.append(
            f"server RSS: {first.rss_mib:.1f} MiB at t={first.t_s:.0f} s (first sample after the "
            f"{warmup_s:.0f} s warm-up) -> {last.rss_mib:.1f} MiB at t={last.t_s:.0f} s "
            f"({last.rss_mib - first.rss_mib:+.1f} MiB); least-squares slope "
            f"{slope_mib_per_hour(steady):+.2f} MiB/hour over {len(steady)} samples"
        )
    agree = client == server and client["ok"] == runtime["ok"] and violations == final.violations
    ok = lost == 0 and agree
    if not agree:
        lines.append("MISMATCH: the server's counters differ from what the client received")
    lines.append("PASS: nothing lost, counters agree" if ok else "FAIL")
    return "\n".join(lines), ok


def write_plot(samples: list[Sample], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot([s.t_s / 60 for s in samples], [s.rss_mib for s in samples], marker=".")
    ax.set_xlabel("minutes")
    ax.set_ylabel("server RSS (MiB)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- command line ---------------------------------------------------------------------------------


def all_final_capacity(repository: ModelRepository, models: list[str], ratios: tuple[float, ...]) -> float:
    """Total req/s at which each model at its final exit, in full batches at the profile's mean
    latency, keeps the accelerator busy all the time (ONNX Runtime, 1 thread: the server's setup)."""
    from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend

    fingerprint = OnnxRuntimeBackend(repository, threads=1, warmup=0).fingerprint()
    seconds_per_request = 0.0
    for model, ratio in zip(models, ratios, strict=True):
        table = repository.load_profile(repository.load_manifest(model), fingerprint)
        batch = table.max_batch
        final = len(table.exit_names) - 1
        seconds_per_request += ratio / sum(ratios) * table.latency_ms(final, batch, "mean") / 1000.0 / batch
    return 1.0 / seconds_per_request


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=5.0, help="how long to drive load (default 5)")
    length.add_argument("--seconds", type=float, help="the same in seconds, for a quick smoke run")
    parser.add_argument("--rate", type=float, help="total requests/s (default: 50%% of All-Final capacity)")
    parser.add_argument(
        "--load", type=float, default=0.5, help="fraction of All-Final capacity when --rate is not given"
    )
    parser.add_argument("--repository", type=Path, default=Path("engines"))
    parser.add_argument(
        "--model", action="append", help="repeat per model (default: digits-s, digits-m, digits-l)"
    )
    parser.add_argument("--slo-ms", type=float, default=50.0, help="SLO of models other than the digits ones")
    parser.add_argument(
        "--ratios", type=float, nargs="+", help="traffic ratios (default 3 2 1 for three models)"
    )
    parser.add_argument("--every", type=float, help="seconds between samples (default: duration/30, 1..10 s)")
    parser.add_argument(
        "--warmup", type=float, help="seconds excluded from the memory trend (default: 20%%, at most 60)"
    )
    parser.add_argument("--plot", type=Path, help="write RSS over time to this PNG (matplotlib)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = args.model or list(DEMO_MODELS)
    repository = ModelRepository(args.repository)
    missing = [m for m in models if not repository.manifest_path(m).exists()]
    if missing:
        print(
            f"soak: {', '.join(missing)} not in {args.repository}; run `make demo` first (it exports "
            "and profiles the digits models into ./engines), or name others with --repository/--model",
            file=sys.stderr,
        )
        return 2
    duration = args.seconds if args.seconds is not None else args.minutes * 60.0
    every = args.every or min(10.0, max(1.0, duration / 30.0))
    warmup = args.warmup if args.warmup is not None else min(60.0, 0.2 * duration)
    ratios = tuple(args.ratios) if args.ratios else default_ratios(len(models))
    try:
        if args.rate is None:
            capacity = all_final_capacity(repository, models, ratios)
            rate = args.load * capacity
            print(
                f"All-Final capacity {capacity:.0f} req/s (profile: final exits, full batches); "
                f"load {args.load:g}"
            )
        else:
            rate = args.rate
        rates = split_rate(models, ratios, rate)
    except EdgeServeError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    slos = {m: DEMO_SLO_MS.get(m, args.slo_ms) for m in models}
    workdir = Path(tempfile.mkdtemp(prefix="edgeserve-soak-"))  # short path: UNIX socket names are limited
    config, sock, log = workdir / "serve.toml", workdir / "edgeserve.sock", workdir / "serve.log"
    metrics_port = free_port()
    write_config(config, args.repository, slos, sock, metrics_port)
    print(
        f"soak: {duration:.0f} s of Poisson load at {rate:.0f} req/s "
        f"({', '.join(f'{m} {r:.0f}/s SLO {slos[m]:g} ms' for m, r in rates.items())}); "
        f"sample every {every:g} s; server log {log}",
        flush=True,
    )
    server = start_server(config, log)
    try:
        tally, samples, final = run(
            soak(
                f"unix://{sock}",
                f"http://127.0.0.1:{metrics_port}/metrics",
                server.pid,
                rates,
                duration,
                every,
                args.seed,
            )
        )
    finally:
        code = stop_server(server)
    report, ok = summarize(tally, samples, final, warmup)
    print(report)
    print(f"server exited with code {code}")
    if args.plot is not None:
        write_plot(samples, args.plot, f"edgeserve serve RSS, {rate:.0f} req/s")
        print(f"wrote {args.plot}")
    if ok and code == 0:
        for path in (config, log):
            path.unlink(missing_ok=True)
        if not sock.exists():
            os.rmdir(workdir)
    return 0 if ok and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
