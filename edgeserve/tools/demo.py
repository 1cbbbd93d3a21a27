"""The main job on the embedded default (CPU, ONNX Runtime), as README command 1 runs it.

Each step is the public command a user would type, printed before it runs, so the demo doubles as a
walk-through: export, profile (both cached: a second run re-uses the exported models and the measured
profiles), then `edgeserve serve` on a UNIX socket and an Open Inference Protocol HTTP port;
against each, `edgeserve bench --capacity` measures what this box takes right now and
`edgeserve bench` drives Poisson traffic at a fraction of it (--load, default 0.5); then a scrape
of the Prometheus endpoint, and a SIGTERM that stops the server cleanly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from edgeserve.errors import DEBUG_ENV, EdgeServeError, guarded, require_module
from edgeserve.net.listeners import free_port
from edgeserve.service.serve_cli import ready_urls

DEMO_MODELS = ("digits-s", "digits-m", "digits-l")
DEMO_SLO_MS = {"digits-s": 5.0, "digits-m": 8.0, "digits-l": 10.0}  # final exits take 0.1-0.4 ms at batch 1
READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Step:
    title: str
    argv: list[str]


def steps(repository: Path, plot: Path, force: bool) -> list[Step]:
    models = [arg for m in DEMO_MODELS for arg in ("--model", m)]
    eval_data = repository / "digits-test.npz"
    bindir = Path(sys.executable).parent
    again = ["--force"] if force else []
    return [
        Step(
            "export the three early-exit digits CNNs to per-stage ONNX (verified against torch)",
            [
                str(bindir / "edgeserve"),
                "export",
                "--demo",
                "--repository",
                str(repository),
                "--eval-data-out",
                str(eval_data),
                *again,
            ],
        ),
        Step(
            "profile every (model, exit, batch 1..10) cell; measure per-exit accuracy through ONNX Runtime",
            [
                str(bindir / "edgeserve-profile"),
                *models,
                "--repository",
                str(repository),
                "--eval",
                str(eval_data),
                "--plot",
                str(plot),
                "--threads",
                "1",
                *again,
            ],
        ),
    ]


def write_serve_config(
    path: Path, repository: Path, socket_path: Path, http_port: int, metrics_port: int
) -> None:
    """The demo's server: the three digits models on one ONNX Runtime thread, a UNIX socket, the
    Open Inference Protocol on `http_port` and Prometheus metrics on `metrics_port`."""
    lines = [
        f"repository = {json.dumps(str(repository.resolve()))}",
        "shutdown_timeout_s = 5.0",
        "[backend]",
        'name = "onnxruntime"',
        "threads = 1",
        "[listen]",
        f"unix = {json.dumps(str(socket_path))}",
        'unix_mode = "0600"',
        f'http = "127.0.0.1:{http_port}"',
        "[metrics]",
        f'listen = "127.0.0.1:{metrics_port}"',
    ]
    for model in DEMO_MODELS:
        lines += [f"[models.{model}]", f"slo_ms = {DEMO_SLO_MS[model]}"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _show(number: int, title: str, argv: list[str], background: bool = False) -> None:
    command = shlex.join([Path(argv[0]).name, *argv[1:]]) + (" &" if background else "")
    print(f"\n== {number}. {title}\n$ {command}", flush=True)


def _wait_ready(server: subprocess.Popen[str], timeout: float) -> str | None:
    """The ready line from the server's stdout, or None if it exits or times out first."""
    found: list[str] = []

    def read() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            if ready_urls(line) is not None:
                found.append(line.strip())
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    return found[0] if found else None


DEFAULT_LOAD = 0.5  # the benches run at half of what the box was just measured to take
CAPACITY_S = 3.0  # seconds of closed-loop traffic to measure it
METRICS_SHOWN = (
    "edgeserve_requests_total",
    "edgeserve_deadline_violations_total",
    "edgeserve_exit_total",
    "edgeserve_executor_utilization",
    "edgeserve_frontend_requests_total",
)


# A child that ended on Ctrl-C: its own `interrupted` (130) or killed by the SIGINT itself.
INTERRUPTED = (130, -signal.SIGINT)


def _interrupted(code: int) -> int:
    """`code`, unless the child ended on Ctrl-C: then the demo is interrupted too (exit 130)."""
    if code in INTERRUPTED:
        raise KeyboardInterrupt
    return code


def _bench_argv(target: str, *options: str) -> list[str]:
    return [str(Path(sys.executable).parent / "edgeserve"), "bench", "--target", target, *options]


def _capacity(number: int, what: str, target: str) -> float | None:
    """`edgeserve bench --capacity`: the ok answers/s this box serves right now in a closed loop."""
    argv = _bench_argv(target, "--capacity", "--duration", f"{CAPACITY_S:g}", "--warmup", "1")
    _show(number, f"measure what this box can take over {what} right now (closed loop)", argv)
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
    print(done.stdout, end="", flush=True)
    _interrupted(done.returncode)
    match = re.search(r"capacity (\d+(?:\.\d+)?) requests/s", done.stdout)
    return float(match.group(1)) if done.returncode == 0 and match else None


def _bench(number: int, what: str, target: str, out: Path, rate: float, duration: float, name: str) -> int:
    bench = _bench_argv(
        target,
        "--total-rate",
        f"{rate:g}",
        "--duration",
        f"{duration:g}",
        "--warmup",
        "2",
        "--csv",
        str(out / f"{name}.csv"),
        "--plot",
        str(out / f"{name}.png"),
    )
    _show(number, f"drive Poisson traffic (3:2:1) over {what} and report deadline violations", bench)
    t0 = time.perf_counter()
    code = _interrupted(subprocess.call(bench))
    print(f"   ({time.perf_counter() - t0:.1f} s)", flush=True)
    return code


def _rate(capacity: float | None, load: float, fixed: float | None, what: str) -> float:
    """--total-rate when given, else `load` x the measured capacity; says which and why."""
    if fixed is not None:
        print(f"   driving {what} at --total-rate {fixed:g} requests/s (fixed; capacity not used)")
        return fixed
    if capacity is None or capacity <= 0:
        raise DemoError(f"could not measure the capacity over {what}; see the output above")
    rate = max(1.0, round(load * capacity))
    print(
        f"   driving {what} at {load:g} x {capacity:.0f} = {rate:g} requests/s (--load {load:g}): "
        "the capacity depends on this box's cores, what else runs on them and the backend's threads"
    )
    return rate


def _show_metrics(number: int, url: str) -> None:
    """What a Prometheus scrape sees after both runs (docs/metrics.md lists every metric)."""
    pattern = "|".join(METRICS_SHOWN)
    print(f"\n== {number}. scrape the Prometheus endpoint\n$ curl -s {url} | grep -E '^({pattern})'")
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(METRICS_SHOWN) and not line.endswith(" 0") and not line.endswith(" 0.0"):
            print(f"   {line}")
    print("   (the server counts every request since it started, the benches' warm-up seconds included)")


def serve_and_bench(
    number: int, repository: Path, out: Path, load: float, fixed_rate: float | None, duration: float
) -> int:
    """Start `edgeserve serve`, measure its capacity, drive it at `load` x that, stop it with SIGTERM."""
    bindir = Path(sys.executable).parent
    config = out / "demo-serve.toml"
    socket_dir = Path(tempfile.mkdtemp(prefix="edgeserve-demo-"))  # short path: UNIX socket names are limited
    socket_path = socket_dir / "edgeserve.sock"
    http_port, metrics_port = free_port(), free_port()
    write_serve_config(config, repository, socket_path, http_port, metrics_port)
    log_path = out / "demo-serve.log"
    serve = [str(bindir / "edgeserve"), "serve", "--config", str(config)]
    _show(number, f"start the server: UNIX socket, HTTP, metrics (log: {log_path})", serve, background=True)
    with log_path.open("w") as log:
        # Its own session: Ctrl-C reaches the demo and its bench, not the server, which the demo
        # stops itself below (else the bench's last words were "the server closed the connection").
        server = subprocess.Popen(
            serve, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True
        )
    step = number + 1
    try:
        ready = _wait_ready(server, READY_TIMEOUT_S)
        if ready is None:
            raise DemoError(f"no ready line from the server within {READY_TIMEOUT_S:.0f} s; see {log_path}")
        print(ready, flush=True)
        unix, http = f"unix://{socket_path}", f"http://127.0.0.1:{http_port}"
        code = 0
        for what, target, seconds, name in (
            ("the UNIX socket", unix, duration, "bench"),
            ("Open Inference Protocol (HTTP)", http, duration / 2, "bench-http"),
        ):
            capacity = None if fixed_rate is not None else _capacity(step, what, target)
            step += fixed_rate is None
            rate = _rate(capacity, load, fixed_rate, what)
            code = _bench(step, what, target, out, rate, seconds, name)
            step += 1
            if code != 0:
                return code
        _show_metrics(step, f"http://127.0.0.1:{metrics_port}/metrics")
        return code
    finally:
        print(f"\n== {step + 1}. stop the server\n$ kill -TERM {server.pid}", flush=True)
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        print(f"server exited with code {server.returncode}; socket removed: {not socket_path.exists()}")
        if not socket_path.exists():
            socket_dir.rmdir()


class DemoError(EdgeServeError):
    """A demo step could not run; the message says which and where to look."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgeserve.demo", description=__doc__)
    parser.add_argument(
        "--repository", type=Path, default=Path(os.environ.get("EDGESERVE_REPOSITORY", "engines"))
    )
    parser.add_argument("--plot", type=Path, default=Path("out/profile.png"))
    parser.add_argument("--force", action="store_true", help="re-export and re-profile even if cached")
    parser.add_argument(
        "--load",
        type=float,
        default=DEFAULT_LOAD,
        help=f"drive the benches at this fraction of the capacity measured first (default {DEFAULT_LOAD:g})",
    )
    parser.add_argument(
        "--total-rate",
        type=float,
        default=None,
        help="a fixed requests/s over the three models instead of --load x the measured capacity",
    )
    parser.add_argument(
        "--duration", type=float, default=10.0, help="measured seconds of traffic (default 10)"
    )
    parser.add_argument(
        "--debug", action="store_true", help=f"show the Python traceback of an error (also {DEBUG_ENV}=1)"
    )
    args = parser.parse_args(argv)
    return guarded("demo", lambda: run(args), debug=args.debug)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.load <= 2 or args.duration <= 0 or (args.total_rate is not None and args.total_rate <= 0):
        raise DemoError("--load must be in (0, 2], --duration and --total-rate positive")
    require_module("matplotlib", "the demo's plots", "run `make demo`, which installs it")
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    all_steps = steps(args.repository, args.plot, args.force)
    for number, step in enumerate(all_steps, start=1):
        _show(number, step.title, step.argv)
        t0 = time.perf_counter()
        code = _interrupted(subprocess.call(step.argv))
        if code != 0:
            print(f"demo: step {number} failed with exit code {code} (its message is above)", file=sys.stderr)
            return code
        print(f"   ({time.perf_counter() - t0:.1f} s)", flush=True)
    code = serve_and_bench(
        len(all_steps) + 1, args.repository, args.plot.parent, args.load, args.total_rate, args.duration
    )
    if code != 0:
        print(f"demo: serving failed with exit code {code}", file=sys.stderr)
        return code
    print(
        f"\ndemo finished in {time.perf_counter() - started:.1f} s; plots: {args.plot} (profile), "
        f"{args.plot.parent / 'bench.png'}, {args.plot.parent / 'bench-http.png'} (latency, exit mix)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
