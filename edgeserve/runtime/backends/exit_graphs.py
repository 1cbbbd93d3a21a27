"""One ONNX graph per exit: stages 0..k of a model composed, so a batch is one ONNX Runtime call.

Why: a chain of stage sessions returns to Python after every stage, and on a busy server each
return waits for the GIL the event loop holds. For the demo's digits CNNs (final exit = four
stages), a batch of 9 took 1.07-1.42x as long beside a Python thread holding the GIL 50 us at a
time as alone; composed, 1.01-1.19x, and 3-11 % less even alone (no per-stage call overhead, no
exit heads of earlier stages computed; benchmarks/compose_exits.py).
The price is memory: each exit's graph holds its own copy of the weights it runs, so the ONNX Runtime
backend composes only models whose stage files total at most COMPOSE_MAX_BYTES unless told otherwise
(`[backend] compose_exits`), and keeps the chain for bigger ones. TensorRT engines are built per
exit already.

Needs the `onnx` package (an install requirement); the composed graph is checked against the chain
on a sample batch when it is loaded (backends/onnxruntime.py), and any model it cannot compose keeps
its chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeserve.manifest import Manifest

# Composing copies each exit's weights: 64 MiB of stages cost at most a few times that in sessions.
COMPOSE_MAX_BYTES = 64 * 2**20


def worth_composing(manifest: Manifest, limit_bytes: int | None = COMPOSE_MAX_BYTES) -> bool:
    """Whether some exit runs more than one stage, and the stages fit the memory limit (None: any size)."""
    if not any(e.stage > 0 for e in manifest.exits):
        return False
    return limit_bytes is None or sum(s.size_bytes for s in manifest.stages) <= limit_bytes


def compose_exits(manifest: Manifest, stage_paths: Sequence[Path]) -> dict[int, bytes]:
    """A serialized ONNX model per exit stage that runs more than one stage: the stage graphs in
    order, each stage's inputs wired to the model inputs or earlier stages' passed tensors by name,
    giving that stage's exit outputs under their own names, and nothing an exit does not need.
    Raises ValueError when the stages cannot be composed (different opset versions, a feed that
    nothing provides, conflicting functions)."""
    import onnx

    protos = [onnx.load(str(path)) for path in stage_paths]
    return {
        stage: _compose(manifest, protos, stage).SerializeToString()
        for stage in sorted({e.stage for e in manifest.exits})
        if stage > 0
    }


def _compose(manifest: Manifest, protos: Sequence[Any], last: int) -> Any:
    from onnx import compose, helper

    nodes: list[Any] = []
    initializers: list[Any] = []
    functions: dict[tuple[str, str, str], Any] = {}
    opsets: dict[str, int] = {}
    model_inputs = {t.name for t in manifest.inputs}
    tensor = {name: name for name in model_inputs}  # a tensor's name in the composed graph
    input_types: dict[str, Any] = {}
    outputs: list[Any] = []
    for i in range(last + 1):
        spec, proto = manifest.stages[i], protos[i]
        for o in proto.opset_import:
            if opsets.setdefault(o.domain, o.version) != o.version:
                raise ValueError(
                    f"stage {i} imports opset {o.version} of {o.domain or 'ai.onnx'!r}, an earlier "
                    f"stage {opsets[o.domain]}"
                )
        for f in proto.functions:
            key = (f.domain, f.name, getattr(f, "overload", ""))
            if key in functions and functions[key] != f:
                raise ValueError(f"stages define function {f.domain}.{f.name} differently")
            functions[key] = f
        types = {v.name: v.type for v in proto.graph.input}
        prefix = f"stage{i}/"
        prefixed = compose.add_prefix(proto, prefix, rename_functions=False)
        for name, source in spec.feeds:
            if source not in tensor:
                raise ValueError(f"stage {i} input {name!r} is fed by {source!r}, which nothing provides")
            if source in model_inputs:
                input_types.setdefault(source, types[name])
            nodes.append(helper.make_node("Identity", [tensor[source]], [prefix + name]))
        nodes.extend(prefixed.graph.node)
        initializers.extend(prefixed.graph.initializer)
        tensor.update({name: prefix + name for name in spec.passes})
        if i == last:
            produced = {v.name: v.type for v in prefixed.graph.output}
            for t in spec.exit_outputs:
                nodes.append(helper.make_node("Identity", [prefix + t.name], [t.name]))
                outputs.append(helper.make_value_info(t.name, produced[prefix + t.name]))
    nodes, initializers = _needed(nodes, initializers, [o.name for o in outputs])
    inputs = [
        helper.make_value_info(t.name, input_types[t.name]) for t in manifest.inputs if t.name in input_types
    ]
    graph = helper.make_graph(nodes, f"{manifest.name}-to-stage{last}", inputs, outputs, initializers)
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(domain, version) for domain, version in opsets.items()],
        ir_version=max(p.ir_version for p in protos[: last + 1]),
        functions=list(functions.values()),
    )


def _needed(nodes: list[Any], initializers: list[Any], outputs: list[str]) -> tuple[list[Any], list[Any]]:
    """The nodes and initializers the outputs depend on (earlier stages' exit heads go). A graph with
    subgraphs (If, Loop) keeps everything: their bodies may read outer tensors by name."""
    if any(a.g.node or a.graphs for n in nodes for a in n.attribute):
        return nodes, initializers
    need, kept = set(outputs), []
    for node in reversed(nodes):
        if need.intersection(node.output):
            kept.append(node)
            need.update(node.input)
    kept.reverse()
    return kept, [t for t in initializers if t.name in need]
