"""The client's Reply read from a result message as the server writes it (docs/protocol.md)."""

from __future__ import annotations

import dataclasses

import numpy as np

from edgeserve.net.frontend import result_message
from edgeserve.runtime.results import Result, Status
from edgeserve.wire.client import Reply
from edgeserve.wire.frames import decode_body, encode_frame
from edgeserve.wire.tensors import encode_tensor


def _over_the_wire(message: dict) -> Reply:
    return Reply.from_message(decode_body(encode_frame(message)[4:], 1 << 20))


def test_a_served_answer_reads_back_with_output_and_every_output_by_name() -> None:
    logits, boxes = np.arange(10, dtype=np.float32), np.arange(8, dtype=np.int64).reshape(2, 4)
    outputs = {"logits": logits, "boxes": boxes}
    result = Result(Status.OK, "m", output=logits, outputs=outputs, exit_index=1, exit_name="final")
    result = dataclasses.replace(result, batch_size=3, queued=1.0, start=1.001, end=1.002, deadline=2.0)
    reply = _over_the_wire(result_message(7, result, None))
    assert reply.ok and reply.id == 7 and reply.exit_name == "final" and reply.timings["batch_size"] == 3
    assert not reply.late
    assert list(reply.outputs) == ["logits", "boxes"]
    assert np.array_equal(reply.output, logits) and reply.output.dtype == np.float32
    assert np.array_equal(reply.outputs["boxes"], boxes) and reply.outputs["boxes"].dtype == np.int64


def test_an_output_that_is_not_the_first_of_outputs_is_decoded_on_its_own() -> None:
    message = {
        "type": "result", "id": 1, "status": "ok", "model": "m",
        "output": encode_tensor(np.ones(3, np.float32)),
        "outputs": {"a": encode_tensor(np.zeros(3, np.float32))},
    }  # fmt: skip
    reply = _over_the_wire(message)
    assert np.array_equal(reply.output, np.ones(3)) and np.array_equal(reply.outputs["a"], np.zeros(3))
    refused = _over_the_wire({"type": "result", "id": 2, "status": "rejected", "model": "m", "output": None})
    assert refused.output is None and refused.outputs == {} and not refused.ok
