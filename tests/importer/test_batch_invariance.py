"""A client's answer never depends on who else sent (issue 65, item 1).

`edgeserve import` runs a graph on distinct samples alone and together; a graph that normalises over
the batch axis or pads every sample to the longest of its batch is recorded as one-sample-at-a-time
(said in one line), profiled at batch 1 only, and served so: with 8 requests in flight each answer
equals that sample's batch-1 answer (atol 1e-4). `[models.NAME] max_batch` sets the same ceiling
for any model from the config.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from net_support import net_config, server_thread
from repo_paths import REPO
from runtime_support import HookedFactory, config_dict, profiled_tiny_repository
from service_support import serve_process

from edgeserve.loop import run
from edgeserve.net import AsyncClient
from edgeserve.repository import ModelRepository

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
ENV = {**os.environ, "EDGESERVE_DEBUG": ""}


def _save(folder: Path, name: str, nodes: list, out_shape: list, inits: tuple = ()) -> Path:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        initializer=list(inits),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _graphs(folder: Path) -> dict[str, Path]:
    from onnx import TensorProto, helper

    batchnorm = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[0], keepdims=1),  # over the batch axis
        helper.make_node("Sub", ["x", "mean"], ["y"]),
    ]
    consts = (
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("axis", TensorProto.INT64, [1], [1]),
        helper.make_tensor("start", TensorProto.INT64, [1], [0]),
    )
    padded = [  # a sample's length: its positive entries; every row cut to the longest of the batch
        helper.make_node("Greater", ["x", "zero"], ["positive"]),
        helper.make_node("Cast", ["positive"], ["ones"], to=TensorProto.INT64),
        helper.make_node("ReduceSum", ["ones", "axis"], ["length"], keepdims=0),
        helper.make_node("ReduceMax", ["length"], ["longest"], keepdims=1),
        helper.make_node("Slice", ["x", "start", "longest", "axis"], ["y"]),
    ]
    return {
        "batchnorm": _save(folder, "batchnorm", batchnorm, ["N", 8]),
        "padded": _save(folder, "padded", padded, ["N", "L"], consts),
        "plain": _save(folder, "plain", [helper.make_node("Relu", ["x"], ["y"])], ["N", 8]),
    }


def _edgeserve(*argv: str, program: str = "edgeserve.cli") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", program, *argv], capture_output=True, text=True, timeout=180, cwd=REPO, env=ENV
    )


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path], dict[str, str]]:
    tmp = tmp_path_factory.mktemp("batch-invariance")
    graphs = _graphs(tmp)
    root = tmp / "engines"
    outputs = {}
    for name, path in graphs.items():
        done = _edgeserve("import", str(path), "--name", name, "--repository", str(root))
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
        outputs[name] = done.stdout + done.stderr
    return root, graphs, outputs


@pytest.mark.parametrize("name", ["batchnorm", "padded"])
def test_import_finds_a_model_whose_answer_depends_on_its_batch_mates(imported, name: str) -> None:
    root, _, outputs = imported
    notes = [line for line in outputs[name].splitlines() if "answers depend on the batch" in line]
    assert len(notes) == 1, outputs[name]
    expected = "differs by up to" if name == "batchnorm" else "alone and"
    assert expected in notes[0] and "served one sample at a time (as `max_batch = 1`)" in notes[0]
    assert f"as {name!r} into" in outputs[name] and "(1 stage, served one sample at a time)" in outputs[name]
    manifest = json.loads((root / name / "manifest.json").read_text())
    assert manifest["batch_invariant"] is False
    assert ModelRepository(root).load_manifest(name).max_batch == 1


def test_a_batch_invariant_model_is_served_at_any_batch(imported) -> None:
    root, _, outputs = imported
    assert "answers depend on the batch" not in outputs["plain"]
    assert "served at any batch size" in outputs["plain"]
    assert ModelRepository(root).load_manifest("plain").max_batch is None


def test_served_answers_equal_each_samples_batch_1_answer_with_8_in_flight(imported, tmp_path: Path) -> None:
    root, graphs, _ = imported
    done = _edgeserve(
        "--model", "batchnorm", "--model", "padded", "--repository", str(root), "--threads", "1",
        "--repeats", "3", "--warmup", "1", program="edgeserve.profiler",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "batch 1..1 = 1 cells" in done.stderr  # the profile stops at batch 1 too
    config = tmp_path / "serve.toml"
    config.write_text(
        f"repository = {json.dumps(str(root))}\n"
        '[backend]\nname = "onnxruntime"\nthreads = 1\nwarmup = 0\n'
        '[scheduler]\nadmission = "all"\n'  # the ceiling is under test here, not deadline admission
        "[models.batchnorm]\nslo_ms = 2000\n[models.padded]\nslo_ms = 2000\n"
        f'[listen]\nunix = "{tmp_path / "s.sock"}"\nmax_in_flight = 8\nshare_total = false\n'
    )
    xs = np.random.default_rng(7).standard_normal((24, 8)).astype(np.float32)
    sessions = {name: ort.InferenceSession(str(graphs[name])) for name in ("batchnorm", "padded")}

    async def main(url: str) -> dict[str, list]:
        client = await AsyncClient.connect(url)
        try:
            answers = {}
            for name in ("batchnorm", "padded"):
                answers[name] = []
                for start in range(0, len(xs), 8):  # 8 requests in flight at once
                    replies = await asyncio.gather(*(client.infer(name, x) for x in xs[start : start + 8]))
                    answers[name] += replies
            return answers
        finally:
            await client.close()

    with serve_process(config) as served:
        url = served.wait_ready(60)[0]
        answers = run(main(url))
        served.process.terminate()
        served.finish()
    for name, replies in answers.items():
        for x, reply in zip(xs, replies, strict=True):
            assert reply.ok, reply.error
            (alone,) = sessions[name].run(None, {"x": x[None]})
            assert reply.output.shape == alone[0].shape, (name, reply.output.shape, alone.shape)
            np.testing.assert_allclose(reply.output, alone[0], atol=1e-4)


class SizesFactory(HookedFactory):
    """HookedFactory whose backend also records each batch's model and size."""

    def __call__(self, repository, config):  # type: ignore[no-untyped-def]
        backend = super().__call__(repository, config)
        backend.sizes = []  # type: ignore[attr-defined]
        run_outputs = backend.run_outputs

        def recording(model: str, exit: int, batch: np.ndarray) -> dict[str, np.ndarray]:
            backend.sizes.append((model, batch.shape[0]))  # type: ignore[attr-defined]
            return run_outputs(model, exit, batch)

        backend.run_outputs = recording  # type: ignore[method-assign]
        return backend


def test_the_configs_max_batch_is_the_ceiling_of_every_batch(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    profiled_tiny_repository(root)
    config = net_config(config_dict(root, admission="all"), tmp_path, max_in_flight=8, share_total=False)
    config["models"]["tiny_a"]["max_batch"] = 1
    factory = SizesFactory(delay_s=0.01)  # slow enough that requests queue up behind each batch

    async def main(url: str) -> list:
        client = await AsyncClient.connect(url)
        try:
            calls = []
            for model in ("tiny_a", "tiny_b"):
                spec = client.models[model]["input"]
                x = np.zeros(spec["shape"], dtype=spec["dtype"])
                calls += [client.infer(model, x) for _ in range(24)]
            return list(await asyncio.gather(*calls))
        finally:
            await client.close()

    with server_thread(config, factory) as srv:
        replies = run(main(srv.unix_url))
    assert all(r.ok for r in replies)
    assert factory.backend is not None
    sizes: dict[str, list[int]] = {}
    for model, size in factory.backend.sizes:  # type: ignore[attr-defined]
        sizes.setdefault(model, []).append(size)
    assert sizes["tiny_a"] and max(sizes["tiny_a"]) == 1  # the ceiling
    assert max(sizes["tiny_b"]) > 1  # the other model is still batched
