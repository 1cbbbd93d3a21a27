#!/usr/bin/env bash
# The GPU checks in one go (`make gpu-check`), offline, in at most about 5 minutes:
#   1. the CUDA tests: tests/runtime/backends/test_cuda_runtime.py and test_torch_cuda.py;
#   2. the torch backend against the simulator on the full ResNets, short
#      (benchmarks/accelerator.py --backend torch --device cuda, two levels of 4 s);
#   3. where `tensorrt` imports: engines for one exported ResNet at batch sizes 1 and 2
#      (build-engines --max-batch 2), served by the TensorRT backend, every exit at both batch sizes
#      checked against ONNX Runtime on the CPU.
# Then one table: step, result, seconds, note. Without a GPU every step is skipped and it exits 0;
# a step that fails makes the exit status 1. Logs under $OUT_DIR (default out/gpu-check).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT_DIR=${OUT_DIR:-out/gpu-check}
mkdir -p "$OUT_DIR"
export HF_HUB_OFFLINE=1 PIP_NO_INDEX=1 TRANSFORMERS_OFFLINE=1
rows=()
failed=0

row() { rows+=("$(printf '%-28s %-8s %6s  %s' "$1" "$2" "$3" "$4")"); }

step() {  # step NAME TIMEOUT_S LOG COMMAND...: run it, add a row
    local name=$1 limit=$2 log=$3
    shift 3
    local start=$SECONDS
    timeout "$limit" "$@" >"$log" 2>&1
    local rc=$? took=$((SECONDS - start))
    if [ $rc -eq 0 ]; then
        row "$name" ok "$took" "$(tail -n 1 "$log" | cut -c1-70)"
    else
        failed=1
        [ $rc -eq 124 ] && why="timed out after ${limit}s" || why="exit $rc, see $log"
        row "$name" FAIL "$took" "$why"
    fi
}

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
    && ! nvidia-smi -L >/dev/null 2>&1; then
    row "cuda tests" skipped - "no CUDA GPU here"
    row "torch vs simulator" skipped - "no CUDA GPU here"
    row "tensorrt vs onnxruntime" skipped - "no CUDA GPU here"
else
    step "cuda tests" 90 "$OUT_DIR/cuda_tests.log" \
        "$PY" -m pytest -q -p no:cacheprovider tests/runtime/backends/test_cuda_runtime.py \
        tests/runtime/backends/test_torch_cuda.py
    step "torch vs simulator" 150 "$OUT_DIR/torch_vs_simulator.log" \
        "$PY" benchmarks/accelerator.py --backend torch --device cuda --levels 1 3 --seconds 4 \
        --profile-repeats 10 --json "$OUT_DIR/torch_vs_simulator.json"
    if "$PY" -c "import tensorrt" 2>/dev/null; then
        step "tensorrt vs onnxruntime" 120 "$OUT_DIR/tensorrt.log" "$PY" - "$OUT_DIR/trt-repo" <<'EOF'
"""Export one ResNet, build its engines at batch 1 and 2, compare every exit with ONNX Runtime."""
import subprocess
import sys
from pathlib import Path

import numpy as np

from edgeserve.onnx_graph import sample_batch
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend
from edgeserve.runtime.backends.tensorrt import TensorRTBackend

root = Path(sys.argv[1])
edgeserve = [sys.executable, "-m", "edgeserve.cli"]
if not any(root.glob("*/manifest.json")):
    subprocess.run([*edgeserve, "export", "--model", "resnet50", "--width", "0.25", "--repository", str(root)], check=True)
subprocess.run([*edgeserve, "build-engines", "--repository", str(root), "--max-batch", "2"], check=True)
repo = ModelRepository(root)
name = repo.models()[0]
manifest = repo.load_manifest(name)
trt, ort = TensorRTBackend(repo, warmup=1), OnnxRuntimeBackend(repo, warmup=1)
trt.load(manifest)
ort.load(manifest)
worst = 0.0
for batch in (1, 2):
    feeds = sample_batch(manifest, batch)
    for exit in range(len(manifest.exits)):
        got, want = trt.run(name, exit, feeds), ort.run(name, exit, feeds)
        err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-6))
        worst = max(worst, err)
        print(f"{name} batch {batch} exit {exit}: max |trt - ort| / max |ort| = {err:.2e}")
        assert err < 1e-2, f"batch {batch} exit {exit}: TensorRT differs from ONNX Runtime by {err:.2e}"
trt.close()
print(f"{len(manifest.exits)} exits x batch 1, 2 match ONNX Runtime (worst relative error {worst:.1e})")
EOF
    else
        row "tensorrt vs onnxruntime" skipped - "tensorrt does not import here"
    fi
fi

printf '%-28s %-8s %6s  %s\n' step result s note
for r in "${rows[@]}"; do echo "$r"; done
exit $failed
