"""tritonclient.grpc and tritonclient.http give the same outputs for the demo repository's models
(the digits models `make demo` exports) and an imported model of three inputs (silero-vad: a
batched `input`, an unbatched `state`, a constant `sr`), every input and output by name, through
one server that listens on both."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from importer_support import edgeserve, profile_quick
from net_support import ServerThread, server_thread
from oip_support import http_url, oip_config
from runtime_support import export_digits
from third_party_models import third_party_model

from edgeserve.onnx_graph import sample_batch
from edgeserve.repository import ModelRepository

grpcclient = pytest.importorskip("tritonclient.grpc")
import tritonclient.http as httpclient  # noqa: E402

DIGITS = ("digits-s", "digits-m", "digits-l")
VAD = ("vad", ["--shape", "input=N,512", "--shape", "state=2,1,128", "--value", "sr=16000"])
DATATYPE = {"float32": "FP32", "int64": "INT64", "int32": "INT32", "uint8": "UINT8"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, ModelRepository]]:
    root = tmp_path_factory.mktemp("grpc-models") / "engines"
    repository = ModelRepository(root)
    for model in DIGITS:
        export_digits(repository, model)
    name, extra = VAD
    vad = third_party_model("silero-vad")
    rc, _, err = edgeserve("import", vad, "--name", name, "--repository", root, *extra)
    assert rc == 0, err
    profile_quick(root, [*DIGITS, name])
    config = oip_config(root, models={m: {"slo_ms": 500} for m in (*DIGITS, name)}, grpc="127.0.0.1:0")
    with server_thread(config) as srv:
        yield srv, repository


def _inputs(module: Any, sample: dict[str, np.ndarray], binary: bool) -> list[Any]:
    tensors = []
    for key, value in sample.items():
        tensor = module.InferInput(key, list(value.shape), DATATYPE[str(value.dtype)])
        if binary:
            tensor.set_data_from_numpy(value, binary_data=True)
        else:
            tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    return tensors


def _exit(response: dict[str, Any]) -> str:
    """The exit an answer came from: a plain value over HTTP, an InferParameter over gRPC."""
    value = response["parameters"]["edgeserve_exit"]
    return str(value.get("string_param", value) if isinstance(value, dict) else value)


@pytest.mark.parametrize("model", [*DIGITS, VAD[0]])
def test_grpc_and_http_give_the_same_outputs(
    served: tuple[ServerThread, ModelRepository], model: str
) -> None:
    """The same sample by both; compared where both took the same exit (an idle server, a long
    deadline: the final one, unless the policy's choice moved between the two requests)."""
    srv, repository = served
    manifest = repository.load_manifest(model)
    batched = {t.name for t in manifest.inputs if t.batched}
    # two samples in one request where every input is batched; a model with an unbatched input
    # (vad's state) takes one sample per request
    batch = sample_batch(manifest, 2 if len(batched) == len(manifest.inputs) else 1, seed=3)
    sample = {k: (np.asarray(v) if k in batched else np.asarray(v[0])) for k, v in batch.items()}
    assert srv.net.grpc is not None and srv.net.grpc.address is not None
    grpc_client = grpcclient.InferenceServerClient(srv.net.grpc.address)
    http_client = httpclient.InferenceServerClient(http_url(srv).removeprefix("http://"), network_timeout=30)
    try:
        names = [o["name"] for o in http_client.get_model_metadata(model)["outputs"]]
        by_grpc = grpc_client.infer(
            model,
            _inputs(grpcclient, sample, binary=False),
            outputs=[grpcclient.InferRequestedOutput(n) for n in names],
            parameters={"deadline_ms": 5000},
        )
        by_http = http_client.infer(
            model,
            _inputs(httpclient, sample, binary=True),
            outputs=[httpclient.InferRequestedOutput(n, binary_data=True) for n in names],
            parameters={"deadline_ms": 5000},
        )
        for name in names:
            ours, theirs = by_grpc.as_numpy(name), by_http.as_numpy(name)
            assert ours is not None and theirs is not None, name
            assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, name
            if _exit(by_grpc.get_response(as_json=True)) == _exit(by_http.get_response()):
                np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
        assert grpc_client.get_model_metadata(model).name == model
    finally:
        grpc_client.close()
        http_client.close()
