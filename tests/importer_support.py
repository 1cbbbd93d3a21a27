"""Running `edgeserve import` as a real subprocess, and tiny graphs written with onnx.helper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120.0


def edgeserve(*argv: str | Path) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "edgeserve.cli", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "EDGESERVE_DEBUG": ""},
        cwd=REPO,
    )
    return done.returncode, done.stdout, done.stderr


QUICK_PROFILE = ("--max-batch", "2", "--repeats", "3", "--warmup", "1", "--threads", "1")


def profile_quick(root: Path, models: list[str]) -> None:
    """`models` of the repository at `root` profiled by the profiler as a subprocess, in seconds
    (batches up to 2, 3 repeats, 1 thread)."""
    flags = [arg for model in models for arg in ("--model", model)]
    profile = subprocess.run(
        [sys.executable, "-m", "edgeserve.profiler", *flags, "--repository", str(root), *QUICK_PROFILE],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert profile.returncode == 0, profile.stderr


def one_line_error(rc: int, err: str) -> str:
    """The error line of a failed command: exit 1, one line, no traceback."""
    assert rc == 1, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("edgeserve: error: "), err
    return lines[0]


def manifest_json(repository: Path, name: str) -> dict:
    return json.loads((repository / name / "manifest.json").read_text())


def skip_graph(path: Path, external: bool = False) -> Path:
    """x [batch, 8] -> a = relu(x W1); b = a W2; c = relu(b); y = (c + a) W3 [batch, 3].

    `a` skips across a cut at `b` or `c`: the stage after the cut needs both.
    """
    rng = np.random.default_rng(0)
    weights = {
        "W1": rng.standard_normal((8, 16)).astype(np.float32),
        "W2": rng.standard_normal((16, 16)).astype(np.float32),
        "W3": rng.standard_normal((16, 3)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("MatMul", ["a", "W2"], ["b"]),
        helper.make_node("Relu", ["b"], ["c"]),
        helper.make_node("Add", ["c", "a"], ["s"]),
        helper.make_node("MatMul", ["s", "W3"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "skip",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    if external:
        onnx.save_model(
            model, str(path), save_as_external_data=True, location=f"{path.name}.data", size_threshold=0
        )
    else:
        onnx.save_model(model, str(path))
    return path


def skip_forward(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]
