"""An asyncio Open Inference Protocol (KServe v2) HTTP client: health, metadata, model config, infer.

One aiohttp session per client, so requests share pooled keep-alive connections (aiohttp's protocol
sets TCP_NODELAY in connection_made, client and server side alike; tests/wire/test_oip_client.py checks it).
Every failure is an OipError whose `kind` says what went wrong ("connect", "timeout", "http",
"protocol"), so a caller such as the offload path can retry, fall back or give up without parsing
messages. It talks to edgeserve's own
frontend (edgeserve/oip/frontend.py), Triton, KServe or any other server of the protocol.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import aiohttp
import numpy as np

from edgeserve.errors import EdgeServeError
from edgeserve.wire.oip_codec import (
    HEADER_LENGTH,
    InferRequest,
    InferResponse,
    OipMessageError,
    RequestedOutput,
    Tensor,
    decode_response,
    encode_request,
)

ErrorKind = Literal["connect", "timeout", "http", "protocol"]


class OipError(EdgeServeError):
    """A call to an Open Inference Protocol server failed.

    `kind` is "connect" (refused, reset, closed), "timeout" (no full answer within the timeout),
    "http" (the server answered a non-200 status; `status` holds it and the message is the server's
    {"error": ...} text) or "protocol" (the answer could not be decoded).
    """

    def __init__(self, message: str, *, kind: ErrorKind, status: int | None = None) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.status = status


@dataclass
class InferReply:
    """An infer answer and what it cost: the round trip and the bytes each way (for bandwidth estimates)."""

    response: InferResponse
    status: int
    rtt_s: float  # request start -> response body fully read (time.perf_counter)
    request_bytes: int
    response_bytes: int
    server_ms: float | None  # the upstream's own time if it said (edgeserve_server_ms), else None


def _base_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EdgeServeError(
            f"Open Inference Protocol URL {url!r} must look like http://host:port (e.g. http://127.0.0.1:8000)"
        )
    return url.rstrip("/")


def _inputs(inputs: Mapping[str, np.ndarray] | Sequence[Tensor]) -> list[Tensor]:
    if isinstance(inputs, Mapping):
        return [Tensor(name, np.asarray(array)) for name, array in inputs.items()]
    return list(inputs)


def _error_text(body: bytes) -> str:
    """The server's {"error": ...} text, or the start of whatever it sent instead."""
    try:
        decoded = json.loads(body)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and "error" in decoded:
        return str(decoded["error"])
    return body[:200].decode("utf-8", "replace").strip() or "(empty body)"


class OipClient:
    """A client for one server; use `async with OipClient("http://127.0.0.1:8000") as client:`.

    `timeout_s` bounds each call (connect + send + full answer); `infer(timeout_s=...)` overrides it
    per call. `max_connections` caps the pooled keep-alive connections (concurrent requests beyond it
    wait for a free one). `token` is sent as `Authorization: Bearer <token>` on every call (the
    server's `[listen] token`).
    """

    def __init__(
        self, url: str, *, timeout_s: float = 10.0, max_connections: int = 16, token: str | None = None
    ) -> None:
        if timeout_s <= 0:
            raise EdgeServeError(f"OipClient timeout_s must be positive, got {timeout_s}")
        if max_connections < 1:
            raise EdgeServeError(f"OipClient max_connections must be at least 1, got {max_connections}")
        self.url = _base_url(url)
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.token = token or None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> OipClient:
        self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the pooled connections; the client opens a new session if used again."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _open(self) -> aiohttp.ClientSession:
        # Created lazily inside the running loop (aiohttp binds a session to the loop it was made in).
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                raise_for_status=False,
                headers=None if self.token is None else {"Authorization": f"Bearer {self.token}"},
                auto_decompress=True,
            )
        return self._session

    def _model_path(self, model: str, version: str | None = None) -> str:
        path = f"/v2/models/{quote(model, safe='')}"
        if version is not None:
            path += f"/versions/{quote(version, safe='')}"
        return path

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, bytes, Mapping[str, str]]:
        """One HTTP exchange -> (status, body, headers); transport failures become OipError."""
        session = self._open()
        timeout = aiohttp.ClientTimeout(total=timeout_s if timeout_s is not None else self.timeout_s)
        url = self.url + path
        try:
            async with session.request(method, url, data=body, headers=headers, timeout=timeout) as resp:
                data = await resp.read()
                return resp.status, data, resp.headers
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError):
            raise OipError(f"{method} {url}: no answer within {timeout.total:g} s", kind="timeout") from None
        except aiohttp.ClientResponseError as exc:
            raise OipError(
                f"{method} {url}: malformed HTTP answer ({exc.message})", kind="protocol"
            ) from None
        except (aiohttp.ClientConnectionError, ConnectionError, OSError) as exc:
            raise OipError(f"{method} {url}: cannot reach the server ({exc})", kind="connect") from None

    async def _json(self, method: str, path: str, body: bytes | None = None) -> Any:
        """A JSON answer of a 200; anything else is an OipError naming the call."""
        headers = None if body is None else {"Content-Type": "application/json"}
        status, answer, _ = await self._call(method, path, body=body, headers=headers)
        where = f"{method} {self.url}{path}"
        if status != 200:
            raise OipError(f"{where}: HTTP {status}: {_error_text(answer)}", kind="http", status=status)
        try:
            return json.loads(answer)
        except ValueError as exc:
            raise OipError(f"{where}: answer is not JSON ({exc})", kind="protocol") from None

    async def _get_json(self, path: str) -> dict[str, Any]:
        decoded = await self._json("GET", path)
        if not isinstance(decoded, dict):
            raise OipError(f"GET {self.url}{path}: answer is not a JSON object", kind="protocol")
        return decoded

    async def repository_index(self) -> list[dict[str, Any]]:
        """POST /v2/repository/index (Triton's repository extension): [{"name", "version", "state"}]."""
        path = "/v2/repository/index"
        index = await self._json("POST", path, b"{}")
        if not isinstance(index, list) or not all(isinstance(e, dict) and "name" in e for e in index):
            raise OipError(f"POST {self.url}{path}: answer is not a list of models", kind="protocol")
        return index

    async def _probe(self, path: str) -> bool:
        status, _, _ = await self._call("GET", path)
        return status == 200

    async def live(self) -> bool:
        """True when GET /v2/health/live answers 200 (any other status: False; no answer: OipError)."""
        return await self._probe("/v2/health/live")

    async def ready(self, model: str | None = None) -> bool:
        """The server's readiness, or one model's when `model` is given (404/503 -> False)."""
        return await self._probe("/v2/health/ready" if model is None else self._model_path(model) + "/ready")

    async def server_metadata(self) -> dict[str, Any]:
        """GET /v2: name, version, extensions."""
        return await self._get_json("/v2")

    async def model_metadata(self, model: str) -> dict[str, Any]:
        """GET /v2/models/<model>: name, versions, platform, inputs, outputs."""
        return await self._get_json(self._model_path(model))

    async def model_config(self, model: str) -> dict[str, Any]:
        """GET /v2/models/<model>/config (Triton's model configuration extension: max_batch_size, dims)."""
        return await self._get_json(self._model_path(model) + "/config")

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray] | Sequence[Tensor],
        *,
        outputs: Sequence[str] | None = None,
        binary: bool = True,
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        version: str | None = None,
        request_id: str | None = None,
    ) -> InferReply:
        """POST one infer request; returns the decoded response and what the exchange cost.

        `binary` sends the inputs as raw bytes and asks for the outputs raw (the binary tensor
        extension); False sends and asks JSON. `parameters` travel as request parameters (e.g.
        {"deadline_ms": 50}); `timeout_s` bounds this HTTP call only, it is not sent to the server.
        """
        requested = [RequestedOutput(name, binary) for name in outputs or ()]
        request_parameters = dict(parameters or {})
        if binary and not requested:
            request_parameters["binary_data_output"] = True
        request = InferRequest(_inputs(inputs), requested, request_id, request_parameters)
        try:
            body, headers = encode_request(request, binary=binary)
        except OipMessageError as exc:
            raise OipError(f"cannot encode the request for {model!r}: {exc}", kind="protocol") from None
        path = self._model_path(model, version) + "/infer"
        start = time.perf_counter()
        status, answer, answer_headers = await self._call(
            "POST", path, body=body, headers=headers, timeout_s=timeout_s
        )
        rtt_s = time.perf_counter() - start
        if status != 200:
            raise OipError(
                f"POST {self.url}{path}: HTTP {status}: {_error_text(answer)}", kind="http", status=status
            )
        try:
            response = decode_response(answer, answer_headers.get(HEADER_LENGTH))
        except OipMessageError as exc:
            raise OipError(f"POST {self.url}{path}: undecodable answer: {exc}", kind="protocol") from None
        server_ms = response.parameters.get("edgeserve_server_ms")
        return InferReply(
            response=response,
            status=status,
            rtt_s=rtt_s,
            request_bytes=len(body),
            response_bytes=len(answer),
            server_ms=float(server_ms)
            if isinstance(server_ms, int | float) and not isinstance(server_ms, bool)
            else None,
        )
