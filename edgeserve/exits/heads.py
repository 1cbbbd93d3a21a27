"""Exit heads as ONNX nodes, merged into a stage graph; and taking them out again (`--force`).

A head reads one or more tensors the stage passes on. Each is averaged over every axis after the
channel axis (GlobalAveragePool + Flatten; a 2-D tensor is used as it is), the results are
concatenated, and one Gemm gives the logits. GlobalAveragePool, Flatten, Concat, Cast and Gemm
have kept their signatures since opset 7, so the nodes fit the stage graph's own opset as they are
(ReduceMean is avoided: its axes moved from an attribute to an input at opset 18).

The standardisation the training used is folded into the Gemm's weights, so the exported head is
exactly pool + Gemm.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeserve.exits import TrainExitsError

HEAD_PREFIX = "train_exits"
MIN_OPSET = 7
FLOAT_TYPES = ("float32", "float16", "float64", "bfloat16")


@dataclass(frozen=True)
class HeadInput:
    """A tensor the head pools: its name and rank (batch dimension included)."""

    name: str
    rank: int
    dtype: str = "float32"


def onnx_module():
    """onnx, or the one-line error that says how to install it."""
    try:
        import onnx
    except ImportError:
        from edgeserve.errors import MissingDependencyError, install_hint

        raise MissingDependencyError(
            "edgeserve train-exits needs onnx to merge the heads into the stage graphs, and it is not "
            f"installed here: {install_hint('onnx')}"
        ) from None
    return onnx


def default_opset(model) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise TrainExitsError(
        f"graph {model.graph.name!r} imports no standard ONNX opset: heads cannot be added to it; "
        "re-export the model with a standard opset"
    )


def load_stage(path: Path):
    """The stage graph without its external weights (they stay where they are, referenced by path)."""
    onnx = onnx_module()
    return onnx.load(str(path), load_external_data=False)


def strip_outputs(model, keep: list[str]) -> list[str]:
    """Drop every graph output not in `keep` and the nodes and weights only they needed.

    Returns the names of the outputs dropped (a previous run's exit heads, for `--force`).
    """
    graph = model.graph
    dropped = [o.name for o in graph.output if o.name not in keep]
    if not dropped:
        return []
    kept_outputs = [o for o in graph.output if o.name in keep]
    del graph.output[:]
    graph.output.extend(kept_outputs)
    needed = set(keep)
    live = []
    for node in reversed(graph.node):
        if any(out in needed for out in node.output):
            live.append(node)
            needed.update(i for i in node.input if i)
            needed.update(_subgraph_inputs(node))
    live.reverse()
    del graph.node[:]
    graph.node.extend(live)
    for field in ("initializer", "sparse_initializer"):
        items = getattr(graph, field)
        kept = [t for t in items if (t.name if field == "initializer" else t.values.name) in needed]
        del items[:]
        items.extend(kept)
    value_info = [v for v in graph.value_info if v.name in needed]
    del graph.value_info[:]
    graph.value_info.extend(value_info)
    return dropped


def _subgraph_inputs(node) -> set[str]:
    """Every name a node's subgraphs (If, Loop, Scan) read: their outer-scope producers stay."""
    names: set[str] = set()
    for attribute in node.attribute:
        graphs = list(attribute.graphs) + ([attribute.g] if attribute.HasField("g") else [])
        for sub in graphs:
            for inner in sub.node:
                names.update(i for i in inner.input if i)
                names |= _subgraph_inputs(inner)
    return names


def _batch_dim(model, name: str):
    """The batch dimension (a dim_param name or a size) of graph output `name`, for the head's output."""
    for value in list(model.graph.output) + list(model.graph.value_info):
        if value.name == name and value.type.tensor_type.shape.dim:
            dim = value.type.tensor_type.shape.dim[0]
            if dim.HasField("dim_value"):
                return int(dim.dim_value)
            return dim.dim_param or "batch"
    return "batch"


def attach_head(
    model,
    inputs: list[HeadInput],
    weight: np.ndarray,
    bias: np.ndarray,
    output: str,
    exit_name: str,
) -> None:
    """Append pool + Gemm nodes reading `inputs` and a new graph output `output` (batch, classes)."""
    onnx = onnx_module()
    from onnx import TensorProto, helper, numpy_helper

    opset = default_opset(model)
    if opset < MIN_OPSET:
        raise TrainExitsError(
            f"graph {model.graph.name!r} uses opset {opset}; exit heads need opset {MIN_OPSET} or later: "
            "re-export the model with a newer opset"
        )
    taken = {n.name for n in model.graph.node} | {t.name for t in model.graph.initializer}
    taken |= {o.name for o in model.graph.output} | {i.name for i in model.graph.input}
    if output in taken:
        raise TrainExitsError(
            f"graph {model.graph.name!r} already has a tensor named {output!r}: rerun with --force to "
            "replace the heads of an earlier run"
        )
    prefix = f"{HEAD_PREFIX}/{exit_name}"
    nodes = []
    pooled: list[str] = []
    for i, tensor in enumerate(inputs):
        source = tensor.name
        if tensor.dtype != "float32":
            nodes.append(
                helper.make_node(
                    "Cast", [source], [f"{prefix}/cast{i}"], name=f"{prefix}/cast{i}", to=TensorProto.FLOAT
                )
            )
            source = f"{prefix}/cast{i}"
        if tensor.rank >= 3:
            nodes.append(
                helper.make_node("GlobalAveragePool", [source], [f"{prefix}/gap{i}"], name=f"{prefix}/gap{i}")
            )
            nodes.append(
                helper.make_node(
                    "Flatten", [f"{prefix}/gap{i}"], [f"{prefix}/flat{i}"], name=f"{prefix}/flat{i}", axis=1
                )
            )
            source = f"{prefix}/flat{i}"
        pooled.append(source)
    if len(pooled) > 1:
        nodes.append(
            helper.make_node("Concat", pooled, [f"{prefix}/features"], name=f"{prefix}/concat", axis=1)
        )
        features = f"{prefix}/features"
    else:
        features = pooled[0]
    weight_name, bias_name = f"{prefix}/weight", f"{prefix}/bias"
    nodes.append(
        helper.make_node(
            "Gemm", [features, weight_name, bias_name], [output], name=f"{prefix}/gemm", transB=1
        )
    )
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.ascontiguousarray(weight, dtype=np.float32), weight_name),
            numpy_helper.from_array(np.ascontiguousarray(bias, dtype=np.float32), bias_name),
        ]
    )
    batch = _batch_dim(model, inputs[0].name)
    model.graph.output.append(
        helper.make_tensor_value_info(output, TensorProto.FLOAT, [batch, int(weight.shape[0])])
    )
    if model.ByteSize() < 2**31 - 1:  # the checker cannot take a protobuf over 2 GiB
        onnx.checker.check_model(model)


def save_stage(model, path: Path) -> None:
    """Write next to `path` and rename over it, so a crash never leaves half a graph."""
    onnx = onnx_module()
    tmp = path.with_name(f".{path.name}.tmp")
    onnx.save_model(model, str(tmp))
    os.replace(tmp, path)
