"""The batch and shape rules of edgeserve.onnx_graph.infer on tiny graphs written with onnx.helper."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from edgeserve.errors import RepositoryError
from edgeserve.onnx_graph import infer


def graph(path: Path, nodes, inputs, outputs, opsets=(("", 17),)) -> Path:
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs),
        opset_imports=[helper.make_opsetid(d, v) for d, v in opsets],
    )
    model.ir_version = 9
    onnx.save_model(model, str(path))
    return path


def value(name: str, dims: list, elem: int = TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def test_fixed_first_dimension_is_the_batch(tmp_path: Path) -> None:
    path = graph(tmp_path / "g.onnx", [helper.make_node("Relu", ["x"], ["y"])], [value("x", [1, 3, 8, 8])],
                 [value("y", [1, 3, 8, 8])])  # fmt: skip
    manifest = infer(path, "g").manifest
    assert manifest.batch == 1 and manifest.max_batch == 1
    assert manifest.input.shape == (3, 8, 8) and manifest.input.batched
    assert manifest.stages[0].outputs[0].shape == (3, 8, 8)


def test_several_inputs_and_dtypes(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "f"], ["y"]),
        helper.make_node("Greater", ["y", "x"], ["mask"]),
    ]
    path = graph(tmp_path / "g.onnx", nodes,
                 [value("x", ["n", 4]), value("ids", ["n", 4], TensorProto.INT64)],
                 [value("y", ["n", 4]), value("mask", ["n", 4], TensorProto.BOOL)])  # fmt: skip
    manifest = infer(path, "g").manifest
    assert [(t.name, t.shape, t.dtype) for t in manifest.inputs] == [
        ("x", (4,), "float32"),
        ("ids", (4,), "int64"),
    ]
    assert [(t.name, t.dtype) for t in manifest.stages[0].outputs] == [("y", "float32"), ("mask", "bool")]
    assert manifest.batch is None and manifest.max_batch is None


def test_outputs_that_do_not_follow_the_batch_serve_at_batch_1(tmp_path: Path) -> None:
    flatten = helper.make_node("Flatten", ["x"], ["y"], axis=0)  # [n, 4] -> [1, 4n]
    path = graph(tmp_path / "g.onnx", [flatten], [value("x", ["n", 4])], [value("y", ["a", "b"])])
    inference = infer(path, "g")
    assert inference.manifest.max_batch == 1
    assert inference.manifest.stages[0].outputs[0].batched is False
    assert any(
        "'y'" not in note and "y [" in note and "one sample at a time" in note for note in inference.notes
    )


def test_shape_option_errors(tmp_path: Path) -> None:
    relu = helper.make_node("Relu", ["image"], ["y"])
    path = graph(
        tmp_path / "g.onnx", [relu], [value("image", ["n", 3, "h", "w"])], [value("y", ["n", 3, "h", "w"])]
    )
    with pytest.raises(RepositoryError, match="did you mean 'image'"):
        infer(path, "g", {"imag": (None, 3, 32, 32)})
    with pytest.raises(RepositoryError, match="rank 4"):
        infer(path, "g", {"image": (None, 32, 32)})
    with pytest.raises(RepositoryError, match="fixed at 3"):
        infer(path, "g", {"image": (None, 4, 32, 32)})
    manifest = infer(
        path, "g", {"image": (7, 3, 32, 48)}
    ).manifest  # a number in the batch entry: still dynamic
    assert manifest.batch is None and manifest.input.shape == (3, 32, 48)
    assert manifest.stages[0].outputs[0].shape == (3, -1, -1)


def test_operator_onnxruntime_cannot_run_is_named(tmp_path: Path) -> None:
    path = graph(tmp_path / "g.onnx", [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")],
                 [value("x", ["n", 4])], [value("y", ["n", 4])],
                 opsets=(("", 17), ("com.example", 1)))  # fmt: skip
    with pytest.raises(RepositoryError) as info:
        infer(path, "g")
    message = str(info.value)
    assert "Frobnicate" in message and "lower opset" in message
