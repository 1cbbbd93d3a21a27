"""Does chaining stages with IO binding cost anything on the CPU compared with plain `session.run`?

The ONNX Runtime backend chains stages with IO binding on a GPU (tensors stay in device memory)
and with plain `run` on the CPU, which this measured cheaper. This runs both chains on the *same*
sessions (the backend's), alternating per repetition so drift and cache state hit both alike, and
prints medians per (exit, batch). A third column is the full `backend.run` (input validation
included).

    .venv/bin/python benchmarks/iobinding_vs_run.py --repository engines --model resnet50 --threads 1
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend, run_chain_bound, run_chain_plain


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repository", type=Path, default=Path("engines"))
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--batches", default="1,4,10")
    args = parser.parse_args()

    repository = ModelRepository(args.repository)
    manifest = repository.load_manifest(args.model)
    backend = OnnxRuntimeBackend(repository, threads=args.threads, providers=["cpu"], warmup=0)
    backend.load(manifest)
    sessions = backend.stage_sessions(args.model)
    rng = np.random.default_rng(0)
    print(
        f"{args.model}: median ms of {args.repeats} runs, {args.threads} thread(s), "
        f"onnxruntime {ort.__version__}"
    )
    print(f"{'exit':>8} {'batch':>5} {'run':>9} {'iobinding':>9} {'diff %':>7} {'backend':>9}")
    for exit, spec in enumerate(manifest.exits):
        stages = sessions[: spec.stage + 1]
        for batch in (int(b) for b in args.batches.split(",")):
            x = rng.standard_normal((batch, *manifest.input.shape)).astype(np.float32)
            feeds = {manifest.input.name: x}
            variants: dict[str, Callable[[], dict[str, np.ndarray]]] = {
                "run": lambda s=stages, f=feeds: run_chain_plain(s, f),
                "iobinding": lambda s=stages, f=feeds: run_chain_bound(s, f, "cpu"),
                "backend": lambda e=exit, x=x: backend.run_outputs(args.model, e, x),
            }
            ref = variants["run"]()
            times: dict[str, list[float]] = {name: [] for name in variants}
            for fn in variants.values():
                for name, value in fn().items():
                    np.testing.assert_allclose(value, ref[name], rtol=1e-5, atol=1e-5)
            gc.disable()
            for i in range(args.repeats + 10):
                for name, fn in variants.items():
                    start = time.perf_counter_ns()
                    fn()
                    if i >= 10:  # the first rounds are warm-up
                        times[name].append((time.perf_counter_ns() - start) / 1e6)
            gc.enable()
            run, bind, full = (float(np.median(times[n])) for n in ("run", "iobinding", "backend"))
            diff = 100 * (bind - run) / run
            print(f"{spec.name:>8} {batch:>5} {run:>9.4f} {bind:>9.4f} {diff:>+7.1f} {full:>9.4f}")


if __name__ == "__main__":
    main()
