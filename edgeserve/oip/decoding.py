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
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

from edgeserve.oip.errors import OipRequestError
from edgeserve.runtime import Sample
from edgeserve.wire.oip_codec import InferRequest, OipMessageError, materialise, read_request
from edgeserve.wire.oip_model import (  # (shared with the gRPC front; named here for this front's users)
    DATATYPE,
    ENVELOPE_ITEMS,
    PER_INPUT_ITEMS,
    ModelInputs,
    check,
    expected,
    max_items,
    model_inputs,
    samples,
)

T = TypeVar("T")

__all__ = [  # this module's, and the request checks it applies (wire/oip_model.py)
    "DATATYPE",
    "ENVELOPE_ITEMS",
    "ITEM_BYTES",
    "LARGE_BODY_BYTES",
    "PER_INPUT_ITEMS",
    "READ_COPIES",
    "DecodeBudget",
    "Decoder",
    "ModelInputs",
    "charge",
    "check",
    "decode",
    "decompress",
    "expected",
    "json_size",
    "max_items",
    "model_inputs",
    "samples",
]

# A body from this size on is charged to the decode budget and decoded on the worker thread; below
# it decoding inline costs less than the hop (a 64 KiB JSON body of 6.5k floats: ~0.65 ms; a
# one-sample request ~15 us, measured).
LARGE_BODY_BYTES = 64 * 1024
# What a large body may hold at its peak while read and decoded (`charge`), measured with
# tracemalloc: READ_COPIES bytes per body byte (aiohttp's joined bytearray and the bytes made of it,
# then the decoded arrays or the JSON part's copy for the long-number check, oip_codec._loads), and
# for JSON ITEM_BYTES per item counted (orjson: 80 bytes per float or int past 256 in a list, 84
# at most; an empty list or object ~50 per `[`/`{` or `,`).
READ_COPIES = 3
ITEM_BYTES = 88


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
