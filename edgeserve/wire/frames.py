"""The frame codec and message validation of docs/protocol.md.

A frame is a 4-byte big-endian length followed by that many bytes of one msgpack map. Decoding
never trusts the peer: msgpack's length limits cap every container at the frame size, maps need
string keys, and each message is checked field by field into a dataclass, with an error string
that names the field. Error strings quote at most a few hundred characters of what was sent
(`brief`), whatever its size or nesting, and are never longer than about bounds.ERROR_TEXT_LIMIT.
`deadline_ms` and `capture_ts` have bounds (bounds.timing_problem), shared with Server._budget.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from edgeserve.wire.bounds import brief, cut, real, timing_problem
from edgeserve.wire.tensors import TensorError, decode_tensor

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">I")
MAX_ID = 2**63 - 1
MAX_MODEL_NAME = 256


class ProtocolError(ValueError):
    """A frame or message is malformed. `request_id` is set when the message's id was readable."""

    def __init__(self, message: str, request_id: int | None = None) -> None:
        super().__init__(cut(message))
        self.request_id = request_id


def encode_frame(message: dict[str, Any]) -> bytes:
    """Length prefix + msgpack body (bin type for bytes)."""
    body = msgpack.packb(message, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes, max_frame_bytes: int) -> dict[str, Any]:
    """One frame's msgpack map; ProtocolError for anything else (no exception of msgpack escapes)."""
    try:
        message = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            max_bin_len=max_frame_bytes,
            max_str_len=max_frame_bytes,
            max_array_len=max_frame_bytes,
            max_map_len=max_frame_bytes // 2,
            max_ext_len=0,
        )
    except RecursionError:
        raise ProtocolError("frame is not one msgpack value: nested too deeply") from None
    except Exception as exc:  # msgpack raises several types (ExtraData, ValueError, UnicodeError, ...)
        # the exception's text can quote the data (ExtraData holds the whole rest of the frame)
        raise ProtocolError(f"frame is not one msgpack value: {type(exc).__name__}: {_text(exc)}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"frame must hold a msgpack map, got {type(message).__name__}")
    return message


@dataclass(frozen=True)
class Hello:
    version: int
    token: str | None
    client: str | None


@dataclass(frozen=True)
class InferRequest:
    id: int
    model: str
    tensor: np.ndarray
    deadline_ms: float | None = None
    capture_ts: float | None = None
    priority: int | None = None


def message_type(message: dict[str, Any]) -> str:
    kind = message.get("type")
    if kind not in ("hello", "infer"):
        raise ProtocolError(f'type must be "hello" or "infer", got {brief(kind)}', id_of(message))
    return kind


def parse_hello(message: dict[str, Any]) -> Hello:
    _only(message, ("type", "version", "token", "client"), None)
    version = message.get("version")
    if type(version) is not int or version != PROTOCOL_VERSION:  # 1.0 and True compare equal to 1
        raise ProtocolError(f"hello.version must be {PROTOCOL_VERSION}, got {brief(version)}")
    token, client = message.get("token"), message.get("client")
    if token is not None and not isinstance(token, str):
        raise ProtocolError(f"hello.token must be a string, got {type(token).__name__}")
    if client is not None and not isinstance(client, str):
        raise ProtocolError(f"hello.client must be a string, got {type(client).__name__}")
    return Hello(version, token, client)


def id_of(message: dict[str, Any]) -> int | None:
    """The message's id if it is a valid one, else None."""
    value = message.get("id")
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ID:
        return value
    return None


def _only(message: dict[str, Any], allowed: tuple[str, ...], request_id: int | None) -> None:
    unknown = [k for k in message if k not in allowed]
    if unknown:
        raise ProtocolError(f"unknown fields {brief(unknown)} (allowed: {', '.join(allowed)})", request_id)


def _text(exc: BaseException) -> str:
    """An exception's message, bounded (it may quote client data)."""
    try:
        return brief(str(exc))
    except Exception:  # str() of the exception itself failed (RecursionError, a broken __str__)
        return "(unprintable)"


def parse_infer(message: dict[str, Any]) -> InferRequest:
    """The request, or ProtocolError naming the bad field (with the id once the id is valid)."""
    request_id = id_of(message)
    if request_id is None:
        raise ProtocolError(f"infer.id must be an integer in 0..2**63-1, got {brief(message.get('id'))}")
    allowed = ("type", "id", "model", "tensor", "deadline_ms", "capture_ts", "priority")
    _only(message, allowed, request_id)
    model = message.get("model")
    if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_NAME:
        raise ProtocolError(f"infer.model must be a model name, got {brief(model, 80)}", request_id)
    try:
        tensor = decode_tensor(message.get("tensor"))
    except TensorError as exc:
        raise ProtocolError(f"infer.{exc}", request_id) from None
    deadline_ms, capture_ts = message.get("deadline_ms"), message.get("capture_ts")
    problem = timing_problem(deadline_ms, capture_ts, time.time())
    if problem is not None:
        separator = ": " if problem.startswith("give ") else "."
        raise ProtocolError(f"infer{separator}{problem}", request_id)
    priority = message.get("priority")
    if priority is not None and type(priority) is not int:
        raise ProtocolError(f"infer.priority must be an integer, got {brief(priority)}", request_id)
    if priority is not None and not -(2**31) <= priority < 2**31:
        raise ProtocolError(f"infer.priority must fit in 32 bits, got {brief(priority)}", request_id)
    return InferRequest(request_id, model, tensor, real(deadline_ms), real(capture_ts), priority)
