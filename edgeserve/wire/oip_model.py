"""An Open Inference Protocol request against its model, for every front that speaks the protocol
(the HTTP front, oip/, and the gRPC front, oipgrpc/): the inputs a model takes by name, datatype and
shape, the most samples a request may carry, the request's samples once checked, its deadline
parameters, and how a model's tensors are listed in metadata and configuration.

Every refusal raises OipMessageError (status 400) naming what was expected; each front turns it
into its own answer (HTTP 400, gRPC INVALID_ARGUMENT).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from edgeserve.manifest import Manifest, TensorSpec
from edgeserve.wire.oip_codec import InferRequest, OipMessageError, RequestHeader, clip

# manifest dtype -> KServe v2 datatype
DATATYPE = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
}
# The `[`, `{` and `,` a JSON request holds beyond its tensors' data: the envelope (inputs, outputs,
# parameters, an id with commas in it) and per input its shape and parameters. Generous: what they
# let in costs at most ITEM_BYTES each once parsed (~100 KiB; oip/decoding.py).
ENVELOPE_ITEMS = 1024
PER_INPUT_ITEMS = 64


@dataclass(frozen=True)
class ModelInputs:
    """What an infer request for one model may carry: its inputs, its output names, the most
    samples per request (`limit`) and the most JSON items (`max_items`, see `max_items`)."""

    model: str
    inputs: tuple[TensorSpec, ...]
    outputs: frozenset[str]
    limit: int
    max_items: int


def expected(spec: TensorSpec) -> str:
    """An input's shape and datatype as an error message names them: `[N, 1, 8, 8] FP32`."""
    dims = ", ".join(str(d) for d in spec.shape)
    shape = f"[N, {dims}]" if spec.batched and dims else ("[N]" if spec.batched else f"[{dims}]")
    return f"{shape} {DATATYPE[spec.dtype]}"


def max_items(inputs: tuple[TensorSpec, ...], limit: int) -> int:
    """The most `[`, `{` and `,` a JSON request for `inputs` holds at `limit` samples: each input's
    elements and the lists its `data` needs nested row-major, plus the envelope."""
    total = ENVELOPE_ITEMS
    for spec in inputs:
        shape = [limit, *spec.shape] if spec.batched else list(spec.shape)
        lists, rows = 1, 1
        for d in shape[:-1]:
            rows *= max(d, 0)
            lists += rows
        total += math.prod(max(d, 0) for d in shape) + lists + PER_INPUT_ITEMS
    return total


def model_inputs(
    model: str, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...], limit: int
) -> ModelInputs:
    """The table `check` reads for `model`; `limit` is 1 when an input has no batch dimension."""
    limit = limit if all(t.batched for t in inputs) else 1
    return ModelInputs(model, inputs, frozenset(t.name for t in outputs), limit, max_items(inputs, limit))


class ModelSource(Protocol):
    """What the tables are built from: the Server's manifests and queue bounds."""

    def manifest(self, model: str) -> Manifest: ...
    def queue_bound(self, model: str) -> int: ...


class ModelTables:
    """A front's per-model tables, kept: every infer needs them, and a model's manifest does not
    change while the server runs (a reload that would change it is refused)."""

    def __init__(self, server: ModelSource) -> None:
        self.server = server
        self._specs: dict[str, tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]] = {}
        self._inputs: dict[str, ModelInputs] = {}

    def tensors(self, model: str) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        """(inputs, outputs) of one sample; the outputs are the final exit's (every exit answers
        under these names, see Server)."""
        specs = self._specs.get(model)
        if specs is None:
            manifest = self.server.manifest(model)
            outputs = manifest.exit_outputs(len(manifest.exits) - 1)
            specs = self._specs[model] = (tuple(manifest.inputs), tuple(outputs))
        return specs

    def inputs(self, model: str) -> ModelInputs:
        """What an infer request for `model` may carry (kept until its queue bound changes)."""
        inputs, outputs = self.tensors(model)
        limit = self.server.queue_bound(model)
        table = self._inputs.get(model)
        if table is None or table.limit != (limit if all(t.batched for t in inputs) else 1):
            table = self._inputs[model] = model_inputs(model, inputs, outputs, limit)
        return table


def _check_names(header: RequestHeader, table: ModelInputs) -> None:
    inputs, model = table.inputs, table.model
    names = [t.name for t in header.inputs]
    if len(set(names)) == len(names) and sorted(names) == sorted(t.name for t in inputs):
        return
    wanted = "; ".join(f"{t.name!r}: {expected(t)}" for t in inputs)
    got = ", ".join(clip(n) for n in names[:8]) or "none"
    if len(inputs) == 1 and len(names) == 1:
        raise OipMessageError(f"model {model!r} has one input named {inputs[0].name!r}, got {got} ({wanted})")
    raise OipMessageError(f"model {model!r} takes the inputs {wanted} (1 <= N <= {table.limit}), got {got}")


def check(header: RequestHeader, table: ModelInputs) -> int:
    """N, the samples the request carries, once its inputs match the model's by name, datatype and
    shape (1 <= N <= limit, one N for all) and it asks only for the model's outputs; else
    OipMessageError naming what was expected. Reads the header only: a tensor of the wrong size is
    never decoded."""
    _check_names(header, table)
    given = {t.name: t for t in header.inputs}
    limit, rows = table.limit, set()
    for spec in table.inputs:
        entry = given[spec.name]
        datatype = DATATYPE[spec.dtype]
        if entry.datatype != datatype:
            raise OipMessageError(f"input {spec.name!r}: datatype must be {datatype}, got {entry.datatype}")
        shape, want = entry.shape, list(spec.shape)
        if spec.batched:
            ok = len(shape) == 1 + len(want) and shape[1:] == want and 1 <= shape[0] <= limit
            rows.add(shape[0] if ok else -1)
        else:
            ok = shape == want
        if not ok:
            raise OipMessageError(
                f"input {spec.name!r}: shape must be {expected(spec)} with 1 <= N <= {limit}, "
                f"got {clip(shape)}"
            )
    if len(rows) > 1:
        raise OipMessageError(f"model {table.model!r}: the inputs have different N {sorted(rows)}")
    for output in header.outputs:
        if output.name not in table.outputs:
            raise OipMessageError(
                f"model {table.model!r} has the outputs {sorted(table.outputs)}, not {clip(output.name)}"
            )
    return rows.pop() if rows else 1


def samples(infer: InferRequest, inputs: tuple[TensorSpec, ...], count: int) -> list[Any]:
    """One sample per row of the inputs (a batched input's first dimension is N): an array, or a
    dict of arrays by input name for a model of several inputs (the runtime's Sample)."""
    given = {t.name: t for t in infer.inputs}
    if len(inputs) == 1 and inputs[0].batched:
        return list(given[inputs[0].name].data)
    return [
        {t.name: given[t.name].data[i] if t.batched else given[t.name].data for t in inputs}
        for i in range(count)
    ]


def deadline_keywords(parameters: dict[str, Any]) -> dict[str, float]:
    """Server.infer's deadline keywords from the request's parameters: `deadline_ms` (edgeserve), else
    Triton's `timeout` in microseconds, or `capture_ts`; the core turns them into one deadline."""
    found: dict[str, float] = {}
    for key, name, scale in (
        ("deadline_ms", "deadline_ms", 1.0),
        ("timeout", "deadline_ms", 1e-3),
        ("capture_ts", "capture_ts", 1.0),
    ):
        value = parameters.get(key)
        if value is None or name in found:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise OipMessageError(f"parameters.{key}: must be a positive number, got {clip(value)}")
        found[name] = float(value) * scale
    if len(found) > 1:
        raise OipMessageError("parameters: give deadline_ms (or timeout) or capture_ts, not both")
    return found


def joined(values: Sequence[Any]) -> Any:
    """One value if every sample agrees, else the per-sample values comma-joined."""
    return values[0] if len(set(values)) == 1 else ",".join(str(v) for v in values)


def answer_parameters(results: Sequence[Any]) -> dict[str, Any]:
    """The edgeserve_* response parameters of a request's answered samples (runtime Results, all OK):
    the exit taken, by whom, whether late, the deadline and the expected accuracy."""
    parameters: dict[str, Any] = {
        "edgeserve_exit": joined([r.exit_name for r in results]),
        "edgeserve_exit_index": joined([r.exit_index for r in results]),
        "edgeserve_served_by": joined([r.served_by for r in results]),
        "edgeserve_late": any(r.late for r in results),
        "edgeserve_deadline_ms": round((results[0].deadline - results[0].queued) * 1000.0, 3),
    }
    accuracies = [r.expected_accuracy for r in results]
    if all(a is not None for a in accuracies):
        parameters["edgeserve_expected_accuracy"] = round(sum(accuracies) / len(accuracies), 6)
    return parameters


def metadata_entry(spec: TensorSpec) -> dict[str, Any]:
    """A tensor as model metadata lists it: -1 for the batch and for sizes that vary."""
    shape = [-1, *spec.shape] if spec.batched else list(spec.shape)
    return {"name": spec.name, "datatype": DATATYPE[spec.dtype], "shape": shape}


def config_entry(spec: TensorSpec) -> dict[str, Any]:
    """A tensor as Triton's model configuration lists it (dims without the batch)."""
    entry: dict[str, Any] = {"name": spec.name, "data_type": f"TYPE_{DATATYPE[spec.dtype]}"}
    return {**entry, "dims": list(spec.shape)}


def output_rows(spec: TensorSpec, values: list[Any]) -> np.ndarray:
    """Per-sample outputs as one tensor: stacked on N when batched, the one sample's otherwise."""
    if len(values) == 1:
        array = np.asarray(values[0])
        return array[np.newaxis] if spec.batched else array
    return np.stack([np.asarray(v) for v in values])


def model_config(
    model: str,
    platform: str,
    backend: str,
    max_batch: int,
    slo_ms: float,
    exits: Sequence[Any],
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
) -> dict[str, Any]:
    """Triton's model configuration (its ModelConfig protobuf as JSON), what perf_analyzer reads:
    `exits` are the manifest's (name, accuracy), the tensors one sample's."""
    parameters = {"exits": ",".join(e.name for e in exits), "slo_ms": f"{slo_ms:g}"}
    if any(e.accuracy is not None for e in exits):
        parameters["exit_accuracies"] = ",".join(
            "" if e.accuracy is None else f"{e.accuracy:.4f}" for e in exits
        )
    return {
        "name": model,
        "platform": platform,
        "backend": backend,
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": max_batch,
        "input": [{**config_entry(t), "format": "FORMAT_NONE"} for t in inputs],
        "output": [config_entry(t) for t in outputs],
        "parameters": {key: {"string_value": value} for key, value in parameters.items()},
    }
