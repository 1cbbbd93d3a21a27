"""One composed graph per exit against the chain of stage sessions, alone and beside a busy loop.

The ONNX Runtime backend composes a small model's stages 0..k into one graph per exit
(runtime/backends/exit_graphs.py): a batch is one `run` and one return to Python instead of one per
stage. Each return waits for the GIL when another thread holds it, as the server's event loop does
under load. This loads the models twice (`compose=False` and the default), runs every model's
deepest exit at `--batch` through `backend.run_outputs`, the two backends alternating per
repetition, first alone, then beside a thread that runs Python for `--hold-us` at a time between
GIL releases (a stand-in for a busy event loop), and prints the median microseconds per batch.

    make demo                                               # once: digits models in ./engines
    .venv/bin/python benchmarks/compose_exits.py            # ~30 s
    .venv/bin/python benchmarks/compose_exits.py --repository /tmp/rvs/engines --batch 4
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgeserve.onnx_graph import sample_batch
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend


def busy_python(hold_s: float, stop: threading.Event) -> None:
    """Pure Python for hold_s at a time, then a GIL release (time.sleep(0)), like a loop's callbacks."""
    while not stop.is_set():
        end = time.perf_counter() + hold_s
        while time.perf_counter() < end:
            pass
        time.sleep(0)


def medians(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():  # alternating: drift and caches hit both alike
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(v)) * 1e6 for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repository", type=Path, default=Path("engines"))
    parser.add_argument("--model", action="append", help="repeatable (default: every model)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--hold-us", type=float, default=50.0, help="the busy thread's GIL hold (default 50)")
    args = parser.parse_args()

    repository = ModelRepository(args.repository)
    names = args.model or repository.models()
    backends = {
        "chain": OnnxRuntimeBackend(repository, threads=args.threads, providers=["cpu"], compose=False),
        "composed": OnnxRuntimeBackend(repository, threads=args.threads, providers=["cpu"]),
    }
    cases = []
    for name in names:
        manifest = repository.load_manifest(name)
        for backend in backends.values():
            backend.load(manifest)
        exit = len(manifest.exits) - 1
        feeds = sample_batch(manifest, args.batch)
        if manifest.exits[exit].stage not in backends["composed"].composed_stages(name):
            print(f"{name}: its deepest exit is not composed (one stage, over the size limit, or refused)")
        cases.append((name, exit, manifest.exits[exit].stage + 1, feeds))

    print(f"median us per batch of {args.batch} at the deepest exit, {args.repeats} alternating repetitions")
    print(
        f"{'model':14s} {'stages':>6s} {'chain':>8s} {'composed':>9s} {'ratio':>6s}   beside a busy thread:"
    )
    print(f"{'':14s} {'':6s} {'':8s} {'':9s} {'':6s}   {'chain':>8s} {'composed':>9s} {'ratio':>6s}")
    for name, exit, stages, feeds in cases:
        runs = {
            label: (lambda b=backend, n=name, e=exit, f=feeds: b.run_outputs(n, e, f))
            for label, backend in backends.items()
        }
        alone = medians(runs, args.repeats)
        stop = threading.Event()
        spinner = threading.Thread(target=busy_python, args=(args.hold_us / 1e6, stop), daemon=True)
        spinner.start()
        try:
            busy = medians(runs, args.repeats)
        finally:
            stop.set()
            spinner.join()
        print(
            f"{name:14s} {stages:6d} {alone['chain']:8.0f} {alone['composed']:9.0f} "
            f"{alone['composed'] / alone['chain']:6.2f}   {busy['chain']:8.0f} {busy['composed']:9.0f} "
            f"{busy['composed'] / busy['chain']:6.2f}"
        )


if __name__ == "__main__":
    main()
