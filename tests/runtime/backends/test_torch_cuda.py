"""The torch backend on a CUDA GPU: CUDA-graph replay gives ONNX Runtime's logits at every exit.

Skipped where torch sees no GPU (CI). Run on a GPU box with
`python -m pytest tests/runtime/backends/test_torch_cuda.py`; docs/accelerators.md says where it ran.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
from runtime_support import export_digits

from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend
from edgeserve.runtime.backends.torch import TorchBackend

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU")

MAX_BATCH = 4
# cuDNN may run float32 convolutions in TF32 (torch's default), so logits differ from the CPU's by
# more than float32 rounding; still far below what would change a prediction on these models.
TOLERANCE = 5e-3


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    repository = ModelRepository(tmp_path_factory.mktemp("engines"))
    export_digits(repository, "digits-s")
    return repository


@pytest.fixture(scope="module")
def cuda_backend(repository: ModelRepository) -> Iterator[TorchBackend]:
    backend = TorchBackend(repository, device="cuda", max_batch=MAX_BATCH, warmup=2)
    backend.load(repository.load_manifest("digits-s"))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def reference(repository: ModelRepository) -> Iterator[OnnxRuntimeBackend]:
    backend = OnnxRuntimeBackend(repository, threads=1, providers=["cpu"], warmup=0)
    backend.load(repository.load_manifest("digits-s"))
    yield backend
    backend.close()


def test_every_exit_and_batch_has_a_captured_graph(cuda_backend: TorchBackend) -> None:
    exits = len(cuda_backend._loaded("digits-s").manifest.exits)
    graphs = cuda_backend._loaded("digits-s").graphs
    assert sorted(graphs) == [(e, b) for e in range(exits) for b in range(1, MAX_BATCH + 1)]


def test_graph_replay_and_eager_batches_match_onnxruntime(
    cuda_backend: TorchBackend, reference: OnnxRuntimeBackend, repository: ModelRepository
) -> None:
    manifest = repository.load_manifest("digits-s")
    rng = np.random.default_rng(1)
    for batch in (1, 2, MAX_BATCH, MAX_BATCH + 3):  # the last one has no graph: eager
        for exit in range(len(manifest.exits)):
            x = rng.random((batch, *manifest.input.shape), dtype=np.float32)
            got = cuda_backend.run("digits-s", exit, x)
            expected = reference.run("digits-s", exit, x)
            assert got.shape == expected.shape and got.dtype == np.float32
            assert np.max(np.abs(got - expected)) <= TOLERANCE, (batch, exit)
            assert (got.argmax(1) == expected.argmax(1)).all()


def test_a_result_is_not_overwritten_by_the_next_replay(cuda_backend: TorchBackend) -> None:
    """Replays write the same static output tensor: what run() returned must be a copy."""
    rng = np.random.default_rng(2)
    x1, x2 = (rng.random((2, 1, 16, 16), dtype=np.float32) for _ in range(2))
    first = cuda_backend.run("digits-s", 1, x1)
    kept = first.copy()
    second = cuda_backend.run("digits-s", 1, x2)
    assert np.array_equal(first, kept)
    assert not np.allclose(first, second)
    assert np.array_equal(cuda_backend.run("digits-s", 1, x1), kept)  # replay is deterministic


def test_graphs_replayed_in_any_order_give_their_own_results(
    cuda_backend: TorchBackend, reference: OnnxRuntimeBackend
) -> None:
    """The graphs share one memory pool and one input buffer: no replay may disturb another's."""
    rng = np.random.default_rng(5)
    cells = [(exit, batch) for exit in range(4) for batch in range(1, MAX_BATCH + 1)]
    for index in rng.permutation(len(cells)).tolist() * 2:
        exit, batch = cells[index]
        x = rng.random((batch, 1, 16, 16), dtype=np.float32)
        got = cuda_backend.run("digits-s", exit, x)
        assert got.shape == (batch, 10)
        assert np.max(np.abs(got - reference.run("digits-s", exit, x))) <= TOLERANCE, (exit, batch)


def test_graphs_captured_on_one_thread_replay_on_another(
    cuda_backend: TorchBackend, reference: OnnxRuntimeBackend
) -> None:
    """The server builds the backend on its executor thread; embedding code may not."""
    x = np.random.default_rng(3).random((3, 1, 16, 16), dtype=np.float32)
    out: list[np.ndarray] = []
    thread = threading.Thread(target=lambda: out.append(cuda_backend.run("digits-s", 2, x)))
    thread.start()
    thread.join(60)
    assert len(out) == 1
    assert np.max(np.abs(out[0] - reference.run("digits-s", 2, x))) <= TOLERANCE


def test_fingerprint_names_the_gpu_and_the_graphs(cuda_backend: TorchBackend) -> None:
    fingerprint = cuda_backend.fingerprint()
    assert fingerprint.backend == "torch"
    assert fingerprint.device == torch.cuda.get_device_name(0)
    assert fingerprint.extra["cuda_graphs"] == "true"


def test_without_graphs_the_same_logits(repository: ModelRepository, cuda_backend: TorchBackend) -> None:
    eager = TorchBackend(repository, device="cuda", cuda_graphs=False)
    eager.load(repository.load_manifest("digits-s"))
    assert eager._loaded("digits-s").graphs == {} and eager.fingerprint().extra["cuda_graphs"] == "false"
    x = np.random.default_rng(4).random((MAX_BATCH, 1, 16, 16), dtype=np.float32)
    for exit in range(4):
        assert np.max(np.abs(eager.run("digits-s", exit, x) - cuda_backend.run("digits-s", exit, x))) <= 1e-5
    eager.close()


def test_edgeserve_profile_measures_the_gpu(
    repository: ModelRepository, capsys: pytest.CaptureFixture[str]
) -> None:
    from edgeserve.profiler.cli import main

    argv = ["--repository", str(repository.root), "--backend", "torch", "--device", "cuda"]
    argv += ["--threads", "1", "--max-batch", "3", "--repeats", "20", "--warmup", "2", "--force"]
    assert main(argv) == 0
    manifest = repository.load_manifest("digits-s")
    backend = TorchBackend(repository, device="cuda", threads=1, max_batch=3)
    table = repository.load_profile(manifest, backend.fingerprint())
    assert table.fingerprint.device == torch.cuda.get_device_name(0)
    assert table.matrix("p95").shape == (len(manifest.exits), 3)
    assert np.all(table.matrix("p95") > 0)
    assert "digits-s" in capsys.readouterr().out
