"""Open Inference Protocol (KServe v2) infer messages: JSON tensors and the binary tensor extension.

One codec for both ends, so the frontend (decode request, encode response) and the offload client
(encode request, decode response) cannot drift apart. A message is a JSON header, optionally followed
by raw tensor bytes; `Inference-Header-Content-Length` says where the JSON ends (Triton's binary
extension). Every malformed message raises OipMessageError naming the field, never a bare KeyError
(nor a RecursionError: JSON nested deeper than MAX_NESTING is refused); client values quoted in an
error are cut to CLIP_CHARS (`clip`).

JSON cannot carry NaN or infinities: a float output holding them is rendered with those elements as
`null` (as KServe's Python server does), and a `null` in float `data` decodes as NaN. The binary
tensor extension carries them exactly.

JSON is read and written by orjson, 5-10x faster than the standard library on tensors in JSON (a
digits image: 256 floats read in 75 us by `json`); whatever orjson refuses goes to the standard
library, so that what is accepted, what is refused and the error's text stay the standard
library's (`_loads`, `_dumps`).
"""

from __future__ import annotations

import json
import math
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from edgeserve.errors import EdgeServeError

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"

# KServe v2 datatype -> numpy dtype (little-endian on the wire). BYTES is handled apart.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_BY_DTYPE = {dtype: name for name, dtype in DATATYPES.items()}

Parameters = dict[str, Any]

CLIP_CHARS = 200  # the most characters of a client's value an error message quotes
MAX_NESTING = 64  # deepest JSON nesting accepted in `data` (tensors have a handful of dimensions)


def _short_repr(limit: int) -> reprlib.Repr:
    """A repr that stops at a few levels and elements: a client's list nested 1,000 deep, or of a
    million elements, costs no RecursionError and no megabytes of text."""
    short = reprlib.Repr()
    short.maxlevel, short.maxlist, short.maxtuple, short.maxdict = 4, 16, 16, 8
    short.maxstring = short.maxother = short.maxlong = limit
    return short


_SHORT = _short_repr(CLIP_CHARS)


def clip(value: Any, limit: int = CLIP_CHARS) -> str:
    """repr(value) for an error message, cut to `limit` characters and marked when cut (a string
    by its length; a container shown to a few levels and elements, see _short_repr)."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}...[cut, {len(value)} chars]"
    try:
        text = (_SHORT if limit == CLIP_CHARS else _short_repr(limit)).repr(value)
    except (RecursionError, ValueError):  # (an object's own repr; an int past str's digit limit)
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}...[cut]"


class OipMessageError(EdgeServeError):
    """A message that does not follow the Open Inference Protocol; `status` is the HTTP code to send."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Tensor:
    """A named tensor; `data` is a numpy array of `shape` (object array of bytes for BYTES)."""

    name: str
    data: np.ndarray
    parameters: Parameters = field(default_factory=dict)

    @property
    def datatype(self) -> str:
        return datatype_of(self.data)

    @property
    def shape(self) -> list[int]:
        return list(self.data.shape)


@dataclass
class RequestedOutput:
    """An output the client asked for by name; `binary` asks for it in the binary extension."""

    name: str
    binary: bool = False
    parameters: Parameters = field(default_factory=dict)


@dataclass
class InferRequest:
    inputs: list[Tensor]
    outputs: list[RequestedOutput] = field(default_factory=list)
    id: str | None = None
    parameters: Parameters = field(default_factory=dict)


@dataclass
class InferResponse:
    model_name: str
    outputs: list[Tensor]
    model_version: str | None = None
    id: str | None = None
    parameters: Parameters = field(default_factory=dict)

    def output(self, name: str) -> np.ndarray:
        for tensor in self.outputs:
            if tensor.name == name:
                return tensor.data
        raise OipMessageError(f"response has no output {name!r}; it has {[t.name for t in self.outputs]}")


def datatype_of(array: np.ndarray) -> str:
    """The protocol's name for an array's dtype; object arrays of bytes/str are BYTES."""
    if array.dtype == object or array.dtype.kind in "SU":
        return "BYTES"
    name = _BY_DTYPE.get(array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype)
    if name is None:
        raise OipMessageError(f"no Open Inference Protocol datatype for numpy {array.dtype}")
    return name


# -- encoding -----------------------------------------------------------------------------------------


def tensor_bytes(array: np.ndarray) -> bytes:
    if datatype_of(array) == "BYTES":
        chunks = []
        for item in array.reshape(-1):
            raw = item.encode() if isinstance(item, str) else bytes(item)
            chunks.append(len(raw).to_bytes(4, "little") + raw)
        return b"".join(chunks)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def _tensor_json(tensor: Tensor, binary: bool, blobs: list[bytes]) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": tensor.name, "shape": tensor.shape, "datatype": tensor.datatype}
    parameters = dict(tensor.parameters)
    if binary:
        raw = tensor_bytes(tensor.data)
        blobs.append(raw)
        parameters["binary_data_size"] = len(raw)
    elif tensor.datatype == "BYTES":
        try:
            entry["data"] = [x.decode() if isinstance(x, bytes) else str(x) for x in tensor.data.reshape(-1)]
        except UnicodeDecodeError:
            raise OipMessageError(f"BYTES tensor {tensor.name!r} is not UTF-8 text: send it binary") from None
    else:
        flat = tensor.data.reshape(-1)
        values = flat.tolist()
        if flat.dtype.kind in "fc" and not np.isfinite(flat).all():  # JSON has no NaN/inf: null
            values = [None if not math.isfinite(v) else v for v in values]
        entry["data"] = values
    if parameters:
        entry["parameters"] = parameters
    return entry


def _finite(value: Any) -> bool:
    """No NaN or infinity anywhere in `value` (parameters: a few scalars, perhaps nested)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite(v) for v in value)
    return True


def _dumps(header: dict[str, Any]) -> bytes:
    """`json.dumps(header, separators=(",", ":"), allow_nan=False)`, by orjson where the two agree
    but for how a float is spelled (1e-05 or 1e-5). Tensor data reaches here with its non-finite
    floats already null; a NaN or an infinity among the parameters (orjson would write null),
    keys that are not strings, ints past 64 bits or numpy scalars go to the standard library,
    which writes them or raises as it always did."""
    entries = (header, *header.get("inputs", ()), *header.get("outputs", ()))
    if all(_finite(entry.get("parameters")) for entry in entries):
        try:
            return orjson.dumps(header)
        except orjson.JSONEncodeError:
            pass
    return json.dumps(header, separators=(",", ":"), allow_nan=False).encode()


_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19  # 19 digits in a row: perhaps an int past 64 bits, read as a float by orjson


def _loads(text: bytes) -> Any:
    """`json.loads(text)`, by orjson for the JSON it takes (strict RFC 8259 in UTF-8: the standard
    library reads it to the same values). The rest goes to the standard library, which decides and
    explains: NaN literals, other encodings, deep nesting, errors, and any run of 19 digits, since
    orjson reads an int past 64 bits as a float (a check of ~1 us per KiB)."""
    if _LONG_NUMBER not in text.translate(_DIGITS):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


def _message(header: dict[str, Any], blobs: list[bytes]) -> tuple[bytes, dict[str, str]]:
    text = _dumps(header)
    if not blobs:
        return text, {"Content-Type": JSON_TYPE}
    return text + b"".join(blobs), {"Content-Type": BINARY_TYPE, HEADER_LENGTH: str(len(text))}


def encode_request(request: InferRequest, *, binary: bool = True) -> tuple[bytes, dict[str, str]]:
    """Body and headers for POST /v2/models/<name>/infer; `binary` sends inputs as raw bytes."""
    blobs: list[bytes] = []
    header: dict[str, Any] = {"inputs": [_tensor_json(t, binary, blobs) for t in request.inputs]}
    if request.id is not None:
        header["id"] = request.id
    if request.parameters:
        header["parameters"] = request.parameters
    if request.outputs:
        header["outputs"] = [
            {"name": o.name, "parameters": {**o.parameters, "binary_data": o.binary}} for o in request.outputs
        ]
    return _message(header, blobs)


def encode_response(response: InferResponse, binary: set[str] | bool = False) -> tuple[bytes, dict[str, str]]:
    """Body and headers of an infer response; outputs named in `binary` (or all, if True) go raw."""
    blobs: list[bytes] = []
    outputs = [
        _tensor_json(t, binary is True or (isinstance(binary, set) and t.name in binary), blobs)
        for t in response.outputs
    ]
    header: dict[str, Any] = {"model_name": response.model_name, "outputs": outputs}
    if response.model_version is not None:
        header["model_version"] = response.model_version
    if response.id is not None:
        header["id"] = response.id
    if response.parameters:
        header["parameters"] = response.parameters
    return _message(header, blobs)


# -- decoding -----------------------------------------------------------------------------------------
#
# In two steps, so that a server checks a request against its model before it decodes any tensor:
# `read_request` parses the JSON and checks each entry's form (names, datatypes, shapes, binary
# sizes), `materialise` then decodes the data into arrays. `decode_request` does both.

# What `[`, `{` and `,` a JSON text may hold for `max_items` (read_request): a document of n values
# (scalars, arrays, objects) has at least n - 1 of them outside its strings, so counting them bounds
# what json parsing builds (~56 bytes per value) before it builds anything.
_STRUCTURE = b"[{,"


@dataclass(slots=True)
class TensorEntry:
    """An input's JSON entry, checked in form, its data not decoded yet (`materialise` does).

    `data` is the entry's JSON `data`, or `raw` its bytes in the binary tail; `count` the number of
    elements its shape holds; `where` names it in error messages."""

    name: str
    datatype: str
    shape: list[int]
    count: int
    parameters: Parameters
    where: str
    data: Any = None
    raw: memoryview | None = None


@dataclass
class RequestHeader:
    """An infer request as `read_request` leaves it: every field checked, no tensor decoded."""

    inputs: list[TensorEntry]
    outputs: list[RequestedOutput] = field(default_factory=list)
    id: str | None = None
    parameters: Parameters = field(default_factory=dict)


def structure_count(text: bytes) -> int:
    """How many `[`, `{` and `,` bytes `text` holds: one pass, a bound on the JSON values in it."""
    return len(text) - len(text.translate(None, _STRUCTURE))


def _header_length(body: bytes, header_length: str | int | None) -> int:
    if header_length is None or header_length == "":
        return len(body)
    try:
        length = int(header_length)
    except (TypeError, ValueError):
        raise OipMessageError(f"{HEADER_LENGTH} must be an integer, got {clip(header_length)}") from None
    if not 0 < length <= len(body):
        raise OipMessageError(f"{HEADER_LENGTH} {length} is outside the body's {len(body)} bytes")
    return length


def _split(
    body: bytes, header_length: str | int | None, max_items: int | None = None
) -> tuple[dict[str, Any], memoryview]:
    """The JSON header as a dict and the binary tail after it; with `max_items`, a JSON text with
    more `[`, `{` and `,` than that is refused before it is parsed (see _STRUCTURE)."""
    length = _header_length(body, header_length)
    text = body if length == len(body) else bytes(memoryview(body)[:length])
    # (a text no longer than max_items cannot hold more: most requests skip the count)
    if max_items is not None and len(text) > max_items and (items := structure_count(text)) > max_items:
        raise OipMessageError(
            f"request JSON holds {items} arrays, objects and values ('[', '{{' and ','); "
            f"a request for this model holds at most {max_items}: check each input's shape and data"
        )
    try:
        header = _loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise OipMessageError(f"body is not valid JSON ({exc})") from None
    except RecursionError:
        raise OipMessageError("body is not valid JSON: nested too deeply") from None
    if not isinstance(header, dict):
        raise OipMessageError(f"body must be a JSON object, got {type(header).__name__}")
    return header, memoryview(body)[length:]


def _field(entry: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in entry:
        raise OipMessageError(f"{where}: missing '{key}'")
    value = entry[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise OipMessageError(f"{where}.{key}: wrong type {type(value).__name__}")
    return value


def _parameters(entry: Mapping[str, Any], where: str) -> Parameters:
    parameters = entry.get("parameters", {})
    if not isinstance(parameters, dict):
        raise OipMessageError(f"{where}.parameters: must be an object")
    return parameters


def _flatten(data: Any, where: str, depth: int = 0) -> list[Any]:
    """Row-major values from a flat or nested JSON list (at most MAX_NESTING deep)."""
    if not isinstance(data, list):
        return [data]
    if list not in set(map(type, data)):  # (JSON's values are of exact types)
        return data
    if depth >= MAX_NESTING:
        raise OipMessageError(f"{where}.data: nested deeper than {MAX_NESTING} lists")
    out: list[Any] = []
    for x in data:
        out.extend(_flatten(x, where, depth + 1))
    return out


def _entry(entry: Any, where: str, tail: memoryview, offset: int) -> tuple[TensorEntry, int]:
    """One tensor's entry checked in form (and its bytes in the binary tail at `offset`), nothing
    decoded; returns it and the new offset."""
    if not isinstance(entry, dict):
        raise OipMessageError(f"{where}: must be an object")
    name = _field(entry, "name", str, where)
    where = f"{where} ({clip(name)})"
    datatype = _field(entry, "datatype", str, where)
    shape = _field(entry, "shape", list, where)
    if not all(type(d) is int and d >= 0 for d in shape):
        raise OipMessageError(f"{where}.shape: must be a list of non-negative integers, got {clip(shape)}")
    if datatype != "BYTES" and datatype not in DATATYPES:
        known = ", ".join([*DATATYPES, "BYTES"])
        raise OipMessageError(f"{where}.datatype: unsupported {clip(datatype)} (supported: {known})")
    parameters = _parameters(entry, where)
    count = math.prod(shape)
    size = parameters.pop("binary_data_size", None)
    if size is None:
        if "data" not in entry:
            raise OipMessageError(f"{where}: has neither 'data' nor parameters.binary_data_size")
        return TensorEntry(name, datatype, shape, count, parameters, where, data=entry["data"]), offset
    if type(size) is not int or size < 0 or offset + size > len(tail):
        raise OipMessageError(
            f"{where}: binary_data_size {clip(size)} exceeds the {len(tail) - offset} bytes left"
        )
    _check_size(size, datatype, count, where)
    raw = tail[offset : offset + size]
    return TensorEntry(name, datatype, shape, count, parameters, where, raw=raw), offset + size


def _check_size(size: int, datatype: str, count: int, where: str) -> None:
    """A binary tensor's size against its shape, before any element is read: exact for fixed-size
    datatypes; for BYTES at least the 4-byte length of each element."""
    if datatype == "BYTES":
        if 4 * count > size:
            raise OipMessageError(
                f"{where}: {size} bytes cannot hold {count} BYTES elements (4 bytes of length each)"
            )
        return
    itemsize = DATATYPES[datatype].itemsize
    if size != count * itemsize:
        raise OipMessageError(
            f"{where}: {size} bytes of {datatype} for a shape of {count} elements "
            f"(expected {count * itemsize})"
        )


def _array(entry: TensorEntry) -> np.ndarray:
    """The entry's data as an array of its shape."""
    where, count = entry.where, entry.count
    if entry.raw is not None:
        array = _from_bytes(entry.raw, entry.datatype, count, where)
    else:
        array = _from_json(_flatten(entry.data, where), entry.datatype, count, where)
    try:
        return array.reshape(entry.shape)
    except ValueError as exc:
        raise OipMessageError(f"{where}.shape: {clip(entry.shape)} cannot hold the data ({exc})") from None


def _from_bytes(raw: memoryview, datatype: str, count: int, where: str) -> np.ndarray:
    if datatype == "BYTES":
        return _bytes_elements(raw, count, where)
    dtype = DATATYPES[datatype]
    _check_size(len(raw), datatype, count, where)
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="), copy=True)


def _bytes_elements(raw: memoryview, count: int, where: str) -> np.ndarray:
    """`count` length-prefixed BYTES elements filling `raw` exactly (never more read than the shape
    asks for)."""
    _check_size(len(raw), "BYTES", count, where)
    array = np.empty(count, dtype=object)
    i = 0
    for k in range(count):
        if i + 4 > len(raw):
            raise OipMessageError(f"{where}: BYTES element length prefix is cut off")
        n = int.from_bytes(raw[i : i + 4], "little")
        if i + 4 + n > len(raw):
            raise OipMessageError(f"{where}: BYTES element of {n} bytes runs past the tensor")
        array[k] = bytes(raw[i + 4 : i + 4 + n])
        i += 4 + n
    if i != len(raw):
        raise OipMessageError(f"{where}: {len(raw) - i} bytes after the {count} BYTES elements of its shape")
    return array


def _from_json(values: list[Any], datatype: str, count: int, where: str) -> np.ndarray:
    if len(values) != count:
        raise OipMessageError(f"{where}: {len(values)} values in 'data' for a shape of {count} elements")
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = [v.encode() if isinstance(v, str) else v for v in values]
        return array
    dtype = DATATYPES[datatype]
    if dtype.kind == "f" and None in values:  # null: a NaN or infinity rendered to JSON (see above)
        values = [math.nan if v is None else v for v in values]
    # JSON's values are of exact types: a bool is not an int here, nor an int a bool.
    ok_types = _BOOL_TYPES if datatype == "BOOL" else _FLOAT_TYPES if dtype.kind == "f" else _INT_TYPES
    if not ok_types.issuperset(map(type, values)):
        raise OipMessageError(f"{where}: 'data' must hold only {datatype} values")
    try:
        return np.asarray(values, dtype=dtype.newbyteorder("="))
    except OverflowError:
        raise OipMessageError(f"{where}: a value in 'data' does not fit {datatype}") from None


_BOOL_TYPES = frozenset((bool,))
_FLOAT_TYPES = frozenset((int, float))
_INT_TYPES = frozenset((int,))


def _entries(entries: Any, where: str, tail: memoryview) -> list[TensorEntry]:
    if not isinstance(entries, list):
        raise OipMessageError(f"{where}: must be a list")
    found, offset = [], 0
    for i, entry in enumerate(entries):
        checked, offset = _entry(entry, f"{where}[{i}]", tail, offset)
        found.append(checked)
    if offset != len(tail):
        raise OipMessageError(f"{len(tail) - offset} bytes after the last binary tensor belong to no tensor")
    return found


def _optional_id(header: Mapping[str, Any]) -> str | None:
    value = header.get("id")
    if value is not None and not isinstance(value, str):
        raise OipMessageError("id: must be a string")
    return value


def _requested_outputs(header: Mapping[str, Any], all_binary: bool) -> list[RequestedOutput]:
    entries = header.get("outputs")
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise OipMessageError(f"outputs: must be a list of objects, got {type(entries).__name__}")
    outputs = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise OipMessageError(f"outputs[{i}]: must be an object")
        name = _field(entry, "name", str, f"outputs[{i}]")
        out_params = _parameters(entry, f"outputs[{i}]")
        binary = bool(out_params.pop("binary_data", all_binary))
        outputs.append(RequestedOutput(name, binary, out_params))
    return outputs


def read_request(
    body: bytes, header_length: str | int | None = None, *, max_items: int | None = None
) -> RequestHeader:
    """An infer request's header from its body and Inference-Header-Content-Length (None: all
    JSON), every field checked and no tensor decoded, so that the caller can check it against its
    model first (`materialise` decodes). `max_items`: the most `[`, `{` and `,` the JSON may hold,
    counted before it is parsed (a server's bound from the model's inputs)."""
    header, tail = _split(body, header_length, max_items)
    inputs = _entries(_field(header, "inputs", list, "request"), "inputs", tail)
    if not inputs:
        raise OipMessageError("inputs: must name at least one tensor")
    parameters = _parameters(header, "request")
    all_binary = bool(parameters.get("binary_data_output", False))
    return RequestHeader(inputs, _requested_outputs(header, all_binary), _optional_id(header), parameters)


def materialise(header: RequestHeader) -> InferRequest:
    """The request with its tensors decoded (each array of its entry's shape)."""
    inputs = [Tensor(e.name, _array(e), e.parameters) for e in header.inputs]
    return InferRequest(inputs, header.outputs, header.id, header.parameters)


def decode_request(body: bytes, header_length: str | int | None = None) -> InferRequest:
    """An infer request from its body and its Inference-Header-Content-Length (None: all JSON)."""
    return materialise(read_request(body, header_length))


def decode_response(body: bytes, header_length: str | int | None = None) -> InferResponse:
    """An infer response from its body and Inference-Header-Content-Length; an error body raises."""
    header, tail = _split(body, header_length)
    if "error" in header and "outputs" not in header:
        raise OipMessageError(f"server answered an error: {header['error']}", status=502)
    outputs = [
        Tensor(e.name, _array(e), e.parameters)
        for e in _entries(_field(header, "outputs", list, "response"), "outputs", tail)
    ]
    version = header.get("model_version")
    return InferResponse(
        model_name=str(header.get("model_name", "")),
        outputs=outputs,
        model_version=None if version is None else str(version),
        id=_optional_id(header),
        parameters=_parameters(header, "response"),
    )


def binary_outputs(request: InferRequest, names: Sequence[str]) -> set[str]:
    """Which of the model's outputs go binary: the ones asked binary, or all if the request says so."""
    if not request.outputs:
        return set(names) if request.parameters.get("binary_data_output") else set()
    return {o.name for o in request.outputs if o.binary}
