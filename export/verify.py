"""Check exported stage graphs against torch: chain them in ONNX Runtime, compare every exit.

Plain onnxruntime InferenceSessions on the CPU (one thread, the steadiest), deliberately not the
serving backend: the check must not depend on the code it is meant to vouch for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from edgeserve.export.early_exit import EarlyExitModel, exit_stages, forward_exit
from edgeserve.export.errors import ExportError


@dataclass(frozen=True)
class ExitCheck:
    """max |onnxruntime - torch| over the logits of one exit at one batch size."""

    exit_name: str
    batch: int
    max_abs_diff: float


def open_sessions(paths: Sequence[Path]) -> list[ort.InferenceSession]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return [ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for p in paths]


def run_chain(sessions: Sequence[ort.InferenceSession], x: np.ndarray) -> list[np.ndarray | None]:
    """Run every stage in turn, feeding `features` on; the logits of each stage (None without a head)."""
    logits: list[np.ndarray | None] = []
    for session in sessions:
        names = [o.name for o in session.get_outputs()]
        outputs = dict(zip(names, session.run(None, {"x": x}), strict=True))
        logits.append(outputs.get("logits"))
        x = outputs.get("features", x)
    return logits


@torch.no_grad()
def compare_with_torch(
    model: EarlyExitModel, paths: Sequence[Path], batches: Sequence[int], seed: int = 0
) -> list[ExitCheck]:
    """For every batch size and every exit: ORT chained stages vs `forward_exit` in torch."""
    stages = exit_stages(model)
    sessions = open_sessions(paths)
    rng = np.random.default_rng(seed)
    checks = []
    for batch in batches:
        x = rng.standard_normal((batch, *model.input_shape), dtype=np.float32)
        ort_logits = run_chain(sessions, x)
        for index, (name, stage) in enumerate(zip(model.exit_names, stages, strict=True)):
            expected = forward_exit(model, torch.from_numpy(x), index).numpy()
            got = ort_logits[stage]
            if got is None or got.shape != expected.shape:
                shape = None if got is None else got.shape
                raise ExportError(
                    f"{paths[stage]}: logits of shape {shape} at exit {name!r} (batch {batch}); torch gives "
                    f"{expected.shape}. The stage graph does not match the model; re-export with --force"
                )
            checks.append(ExitCheck(name, batch, float(np.max(np.abs(got - expected)))))
    return checks


def format_checks(checks: Sequence[ExitCheck]) -> str:
    """A small table: one row per exit, one column per batch size."""
    batches = sorted({c.batch for c in checks})
    names = list(dict.fromkeys(c.exit_name for c in checks))
    diff = {(c.exit_name, c.batch): c.max_abs_diff for c in checks}
    width = max(len(n) for n in [*names, "exit"])
    lines = [f"  {'exit':<{width}}" + "".join(f"{'batch ' + str(b):>10}" for b in batches)]
    lines += [f"  {n:<{width}}" + "".join(f"{diff[(n, b)]:>10.1e}" for b in batches) for n in names]
    return "\n".join(lines)
