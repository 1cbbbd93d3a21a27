"""Full-width early-exit ResNet50/101/152 (CIFAR 32x32 stem) on the CPU: latency per exit and disk size.

Prints p50/p95 at batch 1 and 10 for every exit through the ONNX Runtime backend, and the repository's
size on disk (per-stage graphs, weights stored once) next to the per-exit monolithic export that repeats
every shallow stage's weights in each deeper exit's graph.

    .venv/bin/python benchmarks/resnet_cpu.py                    # ~10 min on 2 cores
    .venv/bin/python benchmarks/resnet_cpu.py --models resnet50 --repeats 10 --threads 1

Weights are random (no pretrained weights offline): latency and size do not depend on them.
Generated graphs go to a temporary folder (hundreds of MiB) and are deleted at the end unless
--keep DIR is given.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from edgeserve.export.models import ModelRequest, build_model
from edgeserve.export.onnx_export import export_model, export_monolithic_exits
from edgeserve.profile import CellStats
from edgeserve.profiler.measure import time_cell
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend

MIB = 1 << 20


def tree_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["resnet50", "resnet101", "resnet152"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per cell (after 3 warm-up runs)")
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads (default: cores - 1)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the exported repository here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="edgeserve-bench-"))
    root = args.keep or work / "engines"
    repository = ModelRepository(root)
    latency_rows: list[str] = []
    size_rows: list[str] = []
    totals = [0, 0]
    try:
        for model_name in args.models:
            request = ModelRequest(model=model_name, stem="cifar")
            name = request.repository_name()
            t0 = time.perf_counter()
            built = build_model(request)
            manifest = export_model(built.module, name, repository, verify_batches=(1, 2), log=None)
            export_s = time.perf_counter() - t0
            staged = tree_size(repository.model_dir(name) / "onnx")
            mono = sum(export_monolithic_exits(built.module, work / "mono" / name).values())
            shutil.rmtree(work / "mono" / name)
            totals[0] += staged
            totals[1] += mono
            ratio = mono / staged
            size_rows.append(
                f"{name:<18} {staged / MIB:>10.1f} {mono / MIB:>14.1f} {ratio:>7.2f}x {export_s:>9.0f}"
            )
            del built

            backend = OnnxRuntimeBackend(repository, threads=args.threads, warmup=1)
            backend.load(manifest)
            rng = np.random.default_rng(0)
            for e, exit_spec in enumerate(manifest.exits):
                cells = []
                for b in args.batches:
                    x = rng.standard_normal((b, *manifest.input.shape), dtype=np.float32)
                    stats = CellStats.of(np.asarray(time_cell(backend, name, e, x, args.repeats, warmup=3)))
                    cells.append(f"{stats.p50_ms:>9.2f} {stats.p95_ms:>9.2f} {stats.cv:>6.1%}")
                latency_rows.append(f"{name:<18} {exit_spec.name:<7} " + "  ".join(cells))
                print(latency_rows[-1], flush=True)
            threads = backend.fingerprint().threads
            backend.close()
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)

    head = "  ".join(f"{f'b={b} p50':>9} {f'b={b} p95':>9} {'CV':>6}" for b in args.batches)
    print(f"\nLatency, ms (ONNX Runtime CPU, {threads} thread(s), {args.repeats} timed runs per cell)")
    print(f"{'model':<18} {'exit':<7} {head}")
    print("\n".join(latency_rows))
    print("\nSize on disk, MiB")
    print(f"{'model':<18} {'per-stage':>10} {'per-exit mono':>14} {'ratio':>8} {'export s':>9}")
    print("\n".join(size_rows))
    print(f"{'all':<18} {totals[0] / MIB:>10.1f} {totals[1] / MIB:>14.1f} {totals[1] / totals[0]:>7.2f}x")


if __name__ == "__main__":
    main()
