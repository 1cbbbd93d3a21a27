"""The early-exit contract: any torch module that declares its stages exports the same way."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

from edgeserve.export.early_exit import StageGraph, exit_stages, forward_exit
from edgeserve.export.errors import ExportError
from edgeserve.export.onnx_export import export_model
from edgeserve.repository import ModelRepository


class ToyChain(nn.Module):
    """Three stages on flat vectors; stage 1 has no exit head, so exits sit on stages 0 and 2.

    Heads are a property, not a ModuleList: the contract only asks for a sequence of modules or None.
    """

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.stages = nn.ModuleList(
                [
                    nn.Sequential(nn.Linear(6, 12), nn.ReLU()),
                    nn.Sequential(nn.Linear(12, 12), nn.Tanh()),
                    nn.Sequential(nn.Linear(12, 8), nn.ReLU()),
                ]
            )
            self.early = nn.Linear(12, 4)
            self.last = nn.Linear(8, 4)
        self.exit_names = ["early", "final"]
        self.input_shape = (6,)
        self.num_classes = 4

    @property
    def heads(self) -> list[nn.Module | None]:
        return [self.early, None, self.last]


def _ort_chain(repository: ModelRepository, name: str, x: np.ndarray) -> list[np.ndarray | None]:
    """Chain the stage graphs listed in the manifest by hand: each stage's logits (or None)."""
    manifest = repository.load_manifest(name)
    logits = []
    for stage in manifest.stages:
        session = ort.InferenceSession(str(repository.stage_path(manifest, stage.index)))
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x}), strict=True))
        logits.append(outputs.get("logits"))
        x = outputs.get("features", x)
    return logits


def test_toy_module_follows_the_contract_and_maps_exits_to_stages_with_heads() -> None:
    assert exit_stages(ToyChain()) == [0, 2]  # exit_stages checks the contract (raises if broken)


def test_forward_exit_runs_stages_up_to_the_exit_then_its_head() -> None:
    toy = ToyChain().eval()
    x = torch.randn(5, 6)
    with torch.no_grad():
        by_hand = toy.early(toy.stages[0](x))
        assert torch.equal(forward_exit(toy, x, 0), by_hand)
        deep = toy.last(toy.stages[2](toy.stages[1](toy.stages[0](x))))
        assert torch.equal(forward_exit(toy, x, 1), deep)
    with pytest.raises(IndexError, match=r"exits 0\.\.1"):
        forward_exit(toy, x, 2)


def test_stage_graph_outputs_only_what_exists() -> None:
    toy = ToyChain()
    middle = StageGraph(toy.stages[1], None, is_last=False)
    last = StageGraph(toy.stages[2], toy.last, is_last=True)
    first = StageGraph(toy.stages[0], toy.early, is_last=False)
    assert (first.output_names, middle.output_names, last.output_names) == (
        ["features", "logits"],
        ["features"],
        ["logits"],
    )
    features, logits = first(torch.randn(2, 6))
    assert features.shape == (2, 12) and logits.shape == (2, 4)


def test_toy_module_exports_and_its_chained_stages_match_torch(tmp_path) -> None:
    toy = ToyChain()
    repository = ModelRepository(tmp_path)
    manifest = export_model(toy, "toy", repository, log=None)

    assert [(e.name, e.stage) for e in manifest.exits] == [("early", 0), ("final", 2)]
    assert manifest.stages[1].logits is None and manifest.stages[1].features.shape == (12,)
    assert manifest.stages[2].features is None and manifest.stages[2].logits.shape == (4,)
    x = np.random.default_rng(1).standard_normal((7, 6), dtype=np.float32)
    logits = _ort_chain(repository, "toy", x)
    assert logits[1] is None
    with torch.no_grad():
        for index, stage in enumerate(exit_stages(toy)):
            expected = forward_exit(toy, torch.from_numpy(x), index).numpy()
            np.testing.assert_allclose(logits[stage], expected, atol=1e-5)


class _NoHeadAtTheEnd(ToyChain):
    @property
    def heads(self) -> list[nn.Module | None]:
        return [self.early, None, None]


class _WrongExitNames(ToyChain):
    def __init__(self) -> None:
        super().__init__()
        self.exit_names = ["only-one"]


class _NotAModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.ModuleList([nn.Identity()])


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (_NoHeadAtTheEnd(), "last stage has no head"),
        (_WrongExitNames(), "names 1 exits"),
        (_NotAModel(), "lacks heads, exit_names, input_shape, num_classes"),
    ],
)
def test_a_module_breaking_the_contract_is_refused_with_what_is_wrong(
    model: nn.Module, message: str, tmp_path
) -> None:
    with pytest.raises(ExportError, match=message):
        export_model(model, "broken", ModelRepository(tmp_path), log=None)
    assert not (tmp_path / "broken").exists()
