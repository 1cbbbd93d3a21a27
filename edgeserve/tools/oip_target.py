"""`edgeserve bench --target http://...`: the load generator's adapter for any Open Inference
Protocol server (edgeserve's own HTTP frontend, Triton, KServe), so the same traffic and the same
report compare edgeserve's socket with its HTTP endpoint, or with another server.

It looks like the socket client to the bench (a `models` table, `send` returning a future of an
answer with status, exit, accuracy and lateness). HTTP statuses map back to edgeserve's request
statuses (docs/oip.md); the exit and lateness come from the edgeserve_* response parameters when
the server sends them (another server's answers count as ok, exit unknown, never late).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeserve.errors import EdgeServeError
from edgeserve.wire.oip_client import OipClient, OipError
from edgeserve.wire.oip_codec import DATATYPES

# HTTP status -> the request status the bench reports (the frontend's mapping, reversed).
STATUS_OF_HTTP = {
    400: "invalid",
    404: "invalid",
    429: "rejected",
    500: "error",
    503: "shutdown",
    504: "expired",
}


@dataclass(frozen=True)
class Answer:
    """What the bench reads from one answer (the socket client's Reply has the same fields)."""

    status: str
    exit_name: str | None = None
    expected_accuracy: float | None = None
    late: bool = False


class OipTarget:
    """One OipClient shared by all models; `connect` reads each model's metadata first."""

    def __init__(self, client: OipClient, models: dict[str, Any], binary: bool) -> None:
        self.client = client
        self.models = models  # model -> {"input": {"name", "dtype", "shape" (one sample)}, "batched"}
        self.binary = binary

    @classmethod
    async def connect(
        cls, url: str, models: list[str] | None = None, *, binary: bool = True, max_connections: int = 64
    ) -> OipTarget:
        """Read the metadata of `models` (default: every ready model the server lists)."""
        client = OipClient(url, max_connections=max_connections)
        try:
            names = models or await served_models(client)
            table = {name: _input_spec(name, await client.model_metadata(name)) for name in names}
        except BaseException:
            await client.close()
            raise
        return cls(client, table, binary)

    def send(self, model: str, x: np.ndarray, *, deadline_ms: float | None = None) -> asyncio.Future[Answer]:
        return asyncio.ensure_future(self._infer(model, x, deadline_ms))

    async def _infer(self, model: str, x: np.ndarray, deadline_ms: float | None) -> Answer:
        spec = self.models[model]
        batch = x[None] if spec["batched"] else x
        parameters = None if deadline_ms is None else {"deadline_ms": deadline_ms}
        try:
            reply = await self.client.infer(
                model, {spec["input"]["name"]: batch}, binary=self.binary, parameters=parameters
            )
        except OipError as exc:
            if exc.kind == "http" and exc.status is not None:
                return Answer(STATUS_OF_HTTP.get(exc.status, "error"))
            return Answer("error")
        found = reply.response.parameters
        accuracy = found.get("edgeserve_expected_accuracy")
        return Answer(
            "ok",
            exit_name=None if found.get("edgeserve_exit") is None else str(found["edgeserve_exit"]),
            expected_accuracy=float(accuracy) if isinstance(accuracy, int | float) else None,
            late=found.get("edgeserve_late") is True,
        )

    async def close(self) -> None:
        await self.client.close()


async def served_models(client: OipClient) -> list[str]:
    """The ready models from POST /v2/repository/index (edgeserve's frontend and Triton answer it)."""
    try:
        index = await client.repository_index()
    except OipError as exc:
        if exc.kind in ("connect", "timeout"):
            raise EdgeServeError(
                f"nothing answers at {client.url} ({exc}): start the server (`edgeserve serve --config FILE` "
                "with [listen] http) or fix --target"
            ) from None
        raise EdgeServeError(
            f"{client.url} does not list its models ({exc}); name them with --model"
        ) from None
    return [entry["name"] for entry in index if entry.get("state", "READY") == "READY"]


def _input_spec(name: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """One sample's input from the model metadata; a leading -1 is the batch dimension."""
    inputs = metadata.get("inputs") or []
    if len(inputs) != 1:
        raise EdgeServeError(
            f"model {name!r} has {len(inputs)} inputs; bench drives single-input models only"
        )
    spec = inputs[0]
    datatype = spec.get("datatype")
    if datatype not in DATATYPES:
        raise EdgeServeError(f"model {name!r}: bench cannot generate {datatype} input")
    shape = [int(d) for d in spec.get("shape", [])]
    batched = bool(shape) and shape[0] == -1
    sample = [1 if d < 0 else d for d in (shape[1:] if batched else shape)]
    dtype = DATATYPES[datatype].newbyteorder("=")
    return {"input": {"name": spec["name"], "dtype": dtype.name, "shape": sample}, "batched": batched}
