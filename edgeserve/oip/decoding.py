"""Infer bodies to samples without stalling the server: checked against the model before any tensor
is decoded, bounded by what the model takes, and large ones decoded off the event loop.

The order (docs/oip.md, "Limits"): the declared size is charged to the decode budget (503 when
full), the body is read (a timeout in proportion to its size), its JSON's `[`, `{` and `,` are
counted against what the model's inputs could need (400 above: no hostile structure is ever
parsed), the JSON is parsed and each input's name, datatype, shape and binary size are checked
against the model (400), and only then are the tensors decoded. Bodies from LARGE_BODY_BYTES on
are decoded on one worker thread of the front's own, whose work holds the GIL only for one
bounded C call at a time; the small ones, nearly all requests, decode inline as before.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from edgeserve.manifest import TensorSpec
from edgeserve.oip.errors import OipRequestError
from edgeserve.runtime import Sample
from edgeserve.wire.oip_codec import (
    InferRequest,
    OipMessageError,
    RequestHeader,
    clip,
    materialise,
    read_request,
)

T = TypeVar("T")

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
# A body from this size on is charged to the decode budget and decoded on the worker thread; below
# it decoding inline costs less than the hop (a 64 KiB JSON body of 6.5k floats: ~0.65 ms; a
# one-sample request ~15 us, measured).
LARGE_BODY_BYTES = 64 * 1024
# The `[`, `{` and `,` a request holds beyond its tensors' data: the envelope (inputs, outputs,
# parameters, an id with commas in it) and per input its shape and parameters. Generous: what they
# let in costs at most ITEM_BYTES each once parsed (~100 KiB).
ENVELOPE_ITEMS = 1024
PER_INPUT_ITEMS = 64
# What a large body may hold at its peak while read and decoded (`charge`), measured with
# tracemalloc: READ_COPIES bytes per body byte (aiohttp's joined bytearray and the bytes made of it,
# then the decoded arrays or the JSON part's copy for the long-number check, oip_codec._loads), and
# for JSON ITEM_BYTES per item counted (orjson: 80 bytes per float or int past 256 in a list, 84
# at most; an empty list or object ~50 per `[`/`{` or `,`).
READ_COPIES = 3
ITEM_BYTES = 88


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


def charge(size: int, json_size: int, most_items: int) -> int:
    """What reading and decoding a body of `size` bytes, the first `json_size` of them JSON, may
    hold at its peak, in bytes: 0 below LARGE_BODY_BYTES (the small ones are bounded by the
    connection cap instead); READ_COPIES copies of the body, and every value its JSON could hold
    (one per two bytes, at most the model's `most_items`) at ITEM_BYTES."""
    if size < LARGE_BODY_BYTES:
        return 0
    return READ_COPIES * size + ITEM_BYTES * min(max(json_size, 0) // 2, most_items)


def json_size(size: int, header_length: str | None) -> int:
    """How much of a body of `size` bytes is JSON: all of it, or what Inference-Header-Content-Length
    says (a value decoding will refuse counts as all of it)."""
    if header_length is None:
        return size
    try:
        return min(int(header_length), size)
    except ValueError:
        return size


class DecodeBudget:
    """Bytes of large bodies being read or decoded at once, as `charge` weighs them (loop-only).

    A body that does not fit is refused (503) rather than queued, so that memory stays bounded
    and the client learns at once; one body is always let in when nothing else is charged, so a
    budget below one body's charge serialises large requests instead of refusing them all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0
        self.refused = 0

    def acquire(self, amount: int) -> bool:
        if self.in_use and self.in_use + amount > self.limit:
            self.refused += 1
            return False
        self.in_use += amount
        return True

    def release(self, amount: int) -> None:
        self.in_use -= amount


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Inflate a gzip or deflate (zlib, or raw as some clients send) body, refusing more than `limit`."""
    wbits = (16 + zlib.MAX_WBITS,) if encoding == "gzip" else (zlib.MAX_WBITS, -zlib.MAX_WBITS)
    for bits in wbits:
        inflater = zlib.decompressobj(bits)
        try:
            data = inflater.decompress(body, limit + 1)
        except zlib.error:
            continue
        if len(data) > limit:
            raise OipRequestError(
                413, f"decompressed request body exceeds listen.max_frame_bytes ({limit} bytes)"
            )
        if not inflater.eof:
            raise OipRequestError(400, f"{encoding} request body is truncated")
        return data
    raise OipRequestError(400, f"request body is not valid {encoding} data")


def _check_names(header: RequestHeader, table: ModelInputs) -> None:
    inputs, model = table.inputs, table.model
    names = [t.name for t in header.inputs]
    if len(set(names)) == len(names) and sorted(names) == sorted(t.name for t in inputs):
        return
    wanted = "; ".join(f"{t.name!r}: {expected(t)}" for t in inputs)
    got = ", ".join(clip(n) for n in names[:8]) or "none"
    if len(inputs) == 1 and len(names) == 1:
        raise OipRequestError(
            400, f"model {model!r} has one input named {inputs[0].name!r}, got {got} ({wanted})"
        )
    raise OipRequestError(
        400, f"model {model!r} takes the inputs {wanted} (1 <= N <= {table.limit}), got {got}"
    )


def check(header: RequestHeader, table: ModelInputs) -> int:
    """N, the samples the request carries, once its inputs match the model's by name, datatype and
    shape (1 <= N <= limit, one N for all) and it asks only for the model's outputs; else 400
    naming what was expected. Reads the header only: a tensor of the wrong size is never decoded."""
    _check_names(header, table)
    given = {t.name: t for t in header.inputs}
    limit, rows = table.limit, set()
    for spec in table.inputs:
        entry = given[spec.name]
        datatype = DATATYPE[spec.dtype]
        if entry.datatype != datatype:
            raise OipRequestError(
                400, f"input {spec.name!r}: datatype must be {datatype}, got {entry.datatype}"
            )
        shape, want = entry.shape, list(spec.shape)
        if spec.batched:
            ok = len(shape) == 1 + len(want) and shape[1:] == want and 1 <= shape[0] <= limit
            rows.add(shape[0] if ok else -1)
        else:
            ok = shape == want
        if not ok:
            raise OipRequestError(
                400,
                f"input {spec.name!r}: shape must be {expected(spec)} with 1 <= N <= {limit}, "
                f"got {clip(shape)}",
            )
    if len(rows) > 1:
        raise OipRequestError(400, f"model {table.model!r}: the inputs have different N {sorted(rows)}")
    for output in header.outputs:
        if output.name not in table.outputs:
            raise OipRequestError(
                400, f"model {table.model!r} has the outputs {sorted(table.outputs)}, not {clip(output.name)}"
            )
    return rows.pop() if rows else 1


def samples(infer: InferRequest, inputs: tuple[TensorSpec, ...], count: int) -> list[Sample]:
    """One sample per row of the inputs (a batched input's first dimension is N)."""
    given = {t.name: t for t in infer.inputs}
    if len(inputs) == 1 and inputs[0].batched:
        return list(given[inputs[0].name].data)
    return [
        {t.name: given[t.name].data[i] if t.batched else given[t.name].data for t in inputs}
        for i in range(count)
    ]


def decode(
    body: bytes, encoding: str, header_length: str | None, table: ModelInputs, frame_limit: int
) -> tuple[InferRequest, list[Sample]]:
    """The request and its samples from a body read whole: inflated, its JSON's items counted
    against the model's, its header checked against the model, and only then its tensors decoded.
    Touches nothing shared, so the worker thread may run it."""
    if encoding in ("gzip", "deflate"):
        body = decompress(body, encoding, frame_limit)
    try:
        header = read_request(body, header_length, max_items=table.max_items)
        count = check(header, table)
        infer = materialise(header)
    except OipMessageError as exc:
        raise OipRequestError(exc.status, str(exc)) from None
    return infer, samples(infer, table.inputs, count)


class Decoder:
    """The front's worker thread for large bodies (one: the work holds the GIL, a second thread
    would only queue for it), started on first use; what it decodes stays charged to the budget
    until it is done with it, a cancelled request's too."""

    def __init__(self, budget: DecodeBudget) -> None:
        self.budget = budget
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    async def run(self, amount: int, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the worker; `amount` (already acquired) is released when it is done."""
        loop = asyncio.get_running_loop()
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="oip-decode")
        try:
            future = self._pool.submit(fn, *args)
        except BaseException:
            self.budget.release(amount)
            raise

        def done(_: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing is charged any more
                loop.call_soon_threadsafe(self.budget.release, amount)

        future.add_done_callback(done)
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
