"""docs/protocol.md stays true: its request examples are sent to a real server over a real socket,
and the replies must have exactly the keys and value types of the doc's reply examples.

An example is a fenced ```json block after `<!-- example: NAME -->`, optionally
`<!-- example: NAME; nullable: PATH PATH -->` (dotted paths, `*` for any map key or list item)
naming the fields that may also be null. The string "<bin>" stands for a msgpack bin value. The
doc's model names are illustrations: requests are sent to the tiny test models instead, with a
tensor of the served model's input shape (a camera frame keeps the doc's shape).
"""

from __future__ import annotations

import json
import math
import re
import socket
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from net_support import net_config, raw_connect, read_frame, read_until_closed, server_thread
from runtime_support import config_dict, profiled_tiny_repository

from edgeserve.wire.frames import HEADER, encode_frame

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
EXAMPLE = re.compile(r"<!-- example: ([\w-]+)(?:; nullable: ([^>]*?))? -->\s*```json\n(.*?)```", re.DOTALL)
BIN = "<bin>"
# maps from a name (any key) to entries shaped like the doc's one entry
NAMED_MAPS = {"models", "models.*.inputs", "models.*.outputs", "outputs"}


def _examples() -> dict[str, tuple[Any, set[str]]]:
    found: dict[str, tuple[Any, set[str]]] = {}
    for name, nullable, text in EXAMPLE.findall(DOC.read_text()):
        assert name not in found, f"example {name} appears twice in {DOC.name}"
        found[name] = (_bins(json.loads(text)), set(nullable.split()))
    return found


def _bins(value: Any) -> Any:
    """The doc's "<bin>" strings as bytes (their contents are filled in per request)."""
    if value == BIN:
        return b""
    if isinstance(value, dict):
        return {k: _bins(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_bins(v) for v in value]
    return value


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__  # bool, int, float are distinct


def conform(real: Any, doc: Any, nullable: set[str], path: str = "") -> list[str]:
    """Where `real` differs in keys or value types from the doc's example (empty: it conforms)."""
    where = path or "(top)"
    if real is None and path in nullable:
        return []
    if isinstance(doc, dict):
        if not isinstance(real, dict):
            return [f"{where}: expected a map, got {_kind(real)}"]
        if path in NAMED_MAPS:
            (entry,) = doc.values()
            return [p for k, v in real.items() for p in conform(v, entry, nullable, _join(path, "*"))] + (
                [] if real else [f"{where}: empty"]
            )
        if set(real) != set(doc):
            return [f"{where}: keys {sorted(real)} but the doc shows {sorted(doc)}"]
        return [p for k in doc for p in conform(real[k], doc[k], nullable, _join(path, k))]
    if isinstance(doc, list):
        if not isinstance(real, list):
            return [f"{where}: expected a list, got {_kind(real)}"]
        kinds = {_kind(item) for item in doc}
        if not real or all(not isinstance(d, dict | list) for d in doc):
            return [f"{where}[]: {_kind(r)} not in {kinds}" for r in real if _kind(r) not in kinds]
        return [p for item in real for p in conform(item, doc[0], nullable, _join(path, "*"))]
    if _kind(real) != _kind(doc):
        return [f"{where}: {_kind(real)} ({real!r:.60}) but the doc shows {_kind(doc)} ({doc!r:.60})"]
    return []


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


@pytest.fixture(scope="module")
def examples() -> dict[str, tuple[Any, set[str]]]:
    found = _examples()
    names = {"hello-request", "hello-reply", "infer-request", "camera-request", "result-ok", "result-invalid"}
    assert names | {"error"} <= set(found), f"{DOC.name} lacks examples {sorted(names - set(found))}"
    return found


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("doc") / "engines"
    profiled_tiny_repository(root)
    return root


def _server_config(root: Path, tmp: Path) -> dict[str, Any]:
    config = config_dict(root)
    config["models"]["tiny_b"]["preprocess"] = {"channels": "bgr"}  # camera_input set for one model
    return net_config(config, tmp)


def _request(example: Any, model: str, shape: list[int] | None) -> dict[str, Any]:
    """The doc's request for a served model: its tensor filled with zeros of the right size."""
    request = json.loads(json.dumps(example, default=lambda b: BIN))  # a deep copy (bytes -> "<bin>")
    request["model"] = model
    tensor = request["tensor"]
    if shape is not None:
        tensor["shape"] = shape
    tensor["data"] = bytes(math.prod(tensor["shape"]) * np.dtype(tensor["dtype"]).itemsize)
    if "capture_ts" in request:
        request["capture_ts"] = time.time()  # the doc's timestamp is a fixed date
    return request


def _hello(sock: socket.socket, examples: dict[str, Any]) -> dict[str, Any]:
    sock.sendall(encode_frame(examples["hello-request"][0]))
    reply = read_frame(sock)
    assert reply is not None
    return reply


def test_the_examples_parse_and_the_reply_examples_conform_to_themselves(examples) -> None:
    for doc, nullable in examples.values():
        assert isinstance(doc, dict) and isinstance(doc["type"], str)
        assert conform(doc, doc, nullable) == []


def test_the_checker_sees_a_missing_key_a_null_and_a_float_for_an_int(examples) -> None:
    doc, nullable = examples["result-ok"]
    assert conform({k: v for k, v in doc.items() if k != "late"}, doc, nullable)
    assert conform({**doc, "timings": None}, doc, nullable)
    assert conform({**doc, "id": 17.0}, doc, nullable)
    assert conform({**doc, "late": 0}, doc, nullable)
    assert conform({**doc, "priority": None}, doc, nullable) == []


def test_requests_from_the_doc_get_replies_shaped_like_the_doc(
    examples, served: Path, tmp_path: Path
) -> None:
    with server_thread(_server_config(served, tmp_path)) as srv, raw_connect(srv.unix_url) as sock:
        hello = _hello(sock, examples)
        assert conform(hello, *examples["hello-reply"]) == []
        assert hello["version"] == 1 and type(hello["version"]) is int
        models = hello["models"]
        assert models["tiny_a"]["camera_input"] is None
        assert models["tiny_b"]["camera_input"] == {"dtype": "uint8", "layout": "hwc", "channels": "bgr"}
        shape = models["tiny_a"]["input"]["shape"]

        infer = _request(examples["infer-request"][0], "tiny_a", shape)
        camera = _request(examples["camera-request"][0], "tiny_b", None)
        unknown = {**_request(examples["infer-request"][0], "no-such-model", shape), "id": 19}
        malformed = {**_request(examples["infer-request"][0], "tiny_a", shape), "id": 20, "priority": True}
        for request in (infer, camera, unknown, malformed):
            sock.sendall(encode_frame(request))
        replies = {}
        for _ in range(4):
            reply = read_frame(sock)
            assert reply is not None
            replies[reply["id"]] = reply

    assert set(replies) == {infer["id"], camera["id"], 19, 20}
    for request in (infer, camera):
        reply = replies[request["id"]]
        assert reply["status"] == "ok", reply["error"]
        assert conform(reply, *examples["result-ok"]) == []
        assert reply["priority"] == request.get("priority")
        assert reply["exit"]["name"] in [e["name"] for e in models[request["model"]]["exits"]]
    assert replies[infer["id"]]["timings"]["batch_size"] >= 1
    for request_id, model in ((19, "no-such-model"), (20, "")):
        reply = replies[request_id]
        assert reply["status"] == "invalid"
        assert reply["model"] == model
        assert conform(reply, *examples["result-invalid"]) == []
        assert reply["timings"] == {"queue_ms": None, "service_ms": None, "total_ms": 0.0, "batch_size": 0}
    assert replies[19]["priority"] == infer["priority"]  # echoed once the fields were read
    assert replies[20]["priority"] is None


def test_duplicate_ids_are_both_served_and_both_answered_with_that_id(
    examples, served: Path, tmp_path: Path
) -> None:
    with server_thread(_server_config(served, tmp_path)) as srv, raw_connect(srv.tcp_url) as sock:
        _hello(sock, examples)
        request = _request(examples["infer-request"][0], "tiny_a", [1, 8, 8])
        sock.sendall(encode_frame(request) + encode_frame({**request, "priority": 7}))
        replies = [read_frame(sock), read_frame(sock)]
    assert [r["id"] for r in replies] == [request["id"]] * 2
    assert [r["status"] for r in replies] == ["ok", "ok"]
    assert sorted(r["priority"] for r in replies) == sorted([request["priority"], 7])


@pytest.mark.parametrize("version", [1.0, True, 2, "1"])
def test_a_hello_version_other_than_the_integer_1_gets_the_error_example_and_a_close(
    examples, served: Path, tmp_path: Path, version: Any
) -> None:
    with server_thread(_server_config(served, tmp_path)) as srv, raw_connect(srv.unix_url) as sock:
        sock.sendall(encode_frame({**examples["hello-request"][0], "version": version}))
        messages = read_until_closed(sock)
    assert len(messages) == 1
    assert conform(messages[0], *examples["error"]) == []
    assert messages[0]["error"].startswith("hello.version must be 1, got ")


def test_an_ext_value_with_a_payload_closes_even_a_greeted_connection(
    examples, served: Path, tmp_path: Path
) -> None:
    with server_thread(_server_config(served, tmp_path)) as srv, raw_connect(srv.unix_url) as sock:
        _hello(sock, examples)
        request = _request(examples["infer-request"][0], "tiny_a", [1, 8, 8])
        body = msgpack.packb({**request, "priority": msgpack.ExtType(5, b"x")}, use_bin_type=True)
        empty = encode_frame({**request, "id": 21, "priority": msgpack.ExtType(5, b"")})
        sock.sendall(empty + HEADER.pack(len(body)) + body)
        messages = read_until_closed(sock)
    assert [m["type"] for m in messages] == ["result", "error"]
    assert messages[0]["id"] == 21 and messages[0]["status"] == "invalid"  # a zero-length ext decodes
    assert "max_ext_len" in messages[1]["error"]
    assert conform(messages[1], *examples["error"]) == []
