"""Offload to a server this project did not write: MLServer serving LightGBM through its own runtime.

The booster is trained here on sklearn's digits and saved in LightGBM's text format (no pickle);
`mlserver start` serves it with mlserver_lightgbm.LightGBMModel. Our OipClient talks to it, then a
Server whose local model is a tiny ONNX MLP over the same 64 features offloads an overload burst
to it: the answers served upstream carry LightGBM's predictions, and no request is lost.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest
from offload_support import mlserver, profile_with_delay, write_mlp_model
from runtime_support import HookedFactory

from edgeserve.repository import ModelRepository
from edgeserve.runtime.server import Server
from edgeserve.wire.oip_client import OipClient

lightgbm = pytest.importorskip("lightgbm")
# Looked up, not imported: MLServer runs in its own process (`mlserver start`), and importing it
# here would register its `inference.*` protobuf messages in this process, where tritonclient.grpc's
# (tests/oip/test_oip_grpc*.py) already are: protobuf refuses the second set.
if importlib.util.find_spec("mlserver_lightgbm") is None:
    pytest.skip("mlserver_lightgbm is not installed", allow_module_level=True)
datasets = pytest.importorskip("sklearn.datasets")

LOCAL_DELAY_S = 0.004  # per local batch: a slow box, so a burst overloads it


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    data = datasets.load_digits()
    return data.data.astype(np.float32), data.target.astype(np.int64)


@pytest.fixture(scope="module")
def served_booster(tmp_path_factory: pytest.TempPathFactory, digits: tuple[np.ndarray, np.ndarray]):  # type: ignore[no-untyped-def]
    x, y = digits
    params = {"objective": "multiclass", "num_class": 10, "num_leaves": 8, "verbose": -1, "num_threads": 1}
    booster = lightgbm.train(params, lightgbm.Dataset(x, y), num_boost_round=10)
    model_dir = tmp_path_factory.mktemp("mlserver") / "digits-gbm"
    model_dir.mkdir()
    booster.save_model(str(model_dir / "model.txt"))  # LightGBM's text format
    with mlserver(model_dir, "digits-gbm") as url:
        yield booster, url


def test_our_client_gets_lightgbms_predictions_from_mlserver(served_booster, digits) -> None:  # type: ignore[no-untyped-def]
    booster, url = served_booster
    x = digits[0][:5]

    async def main() -> None:
        async with OipClient(url, timeout_s=10) as client:
            assert await client.ready()
            reply = await client.infer("digits-gbm", {"x": x}, outputs=["predict"], binary=False)
        got = reply.response.output("predict")
        np.testing.assert_allclose(got, booster.predict(x), rtol=1e-6)
        assert reply.server_ms is None and reply.rtt_s > 0 and reply.request_bytes > x.nbytes

    asyncio.run(main())


def test_an_overload_burst_is_partly_served_by_mlserver_and_nothing_is_lost(
    served_booster,
    digits,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    booster, url = served_booster
    root = tmp_path / "engines"
    manifest = write_mlp_model(ModelRepository(root), "digits-mlp")
    profile_with_delay(root, [manifest], LOCAL_DELAY_S)
    config = {
        "repository": str(root),
        "backend": {"name": "onnxruntime", "threads": 1, "warmup": 0},
        "scheduler": {"late_tasks": "expire"},
        "models": {"digits-mlp": {"slo_ms": 40, "max_queue": 128}},
        "upstreams": [
            {
                "name": "mlserver",
                "url": url,
                "timeout_ms": 3000,
                "binary": False,  # MLServer 1.7 answers HTTP 500 to binary tensor inputs
                "probe_interval_s": 0.2,
                "models": {"digits-mlp": {"remote": "digits-gbm", "input": "x", "output": "predict"}},
            }
        ],
    }
    x = digits[0][:80]

    async def main() -> None:
        async with Server(config, backend_factory=HookedFactory(delay_s=LOCAL_DELAY_S)) as server:
            deadline = time.monotonic() + 10
            while (
                server.snapshot()["upstreams"]["mlserver"]["rtt_ms"]
                != server.snapshot()["upstreams"]["mlserver"]["rtt_ms"]
            ):
                assert time.monotonic() < deadline, "no health probe reached MLServer"
                await asyncio.sleep(0.05)
            results = await server.infer_batch("digits-mlp", x)  # 80 at once: ~80 ms of local work
            snapshot = server.snapshot()
        assert len(results) == len(x)
        remote = [i for i, r in enumerate(results) if r.served_by == "mlserver"]
        local = [i for i, r in enumerate(results) if r.ok and r.served_by == "local"]
        assert remote and local, [r.status for r in results]
        expected = booster.predict(x[remote])
        np.testing.assert_allclose(np.stack([results[i].output for i in remote]), expected, rtol=1e-6)
        assert all(results[i].ok and results[i].exit_name is None for i in remote)
        assert all(results[i].exit_name in ("early", "final") for i in local)
        up = snapshot["upstreams"]["mlserver"]
        assert up["state"] == "closed" and up["sent"] >= len(remote) and up["failed"] == 0
        assert snapshot["served"]["digits-mlp"]["mlserver"] == len(remote)
        assert sum(snapshot["requests"]["digits-mlp"].values()) == len(x)  # each answered exactly once

    asyncio.run(main())
