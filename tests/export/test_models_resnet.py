"""Early-exit ResNets: the standard architectures, cut into four stages with one exit each."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgeserve.export.early_exit import exit_stages, forward_exit
from edgeserve.export.resnet import Bottleneck, early_exit_resnet


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(
    ("depth", "blocks"),
    [("resnet50", [3, 4, 6, 3]), ("resnet101", [3, 4, 23, 3]), ("resnet152", [3, 8, 36, 3])],
)
def test_stages_hold_the_standard_bottleneck_layers(depth: str, blocks: list[int]) -> None:
    model = early_exit_resnet(depth, width=0.125)
    layers = [model.stages[0][1], *model.stages[1:]]
    assert [len(layer) for layer in layers] == blocks
    assert all(isinstance(block, Bottleneck) for layer in layers for block in layer)
    assert exit_stages(model) == [0, 1, 2, 3]
    assert model.exit_names == ["layer1", "layer2", "layer3", "final"]


def test_full_width_resnet50_has_the_standard_parameter_count_plus_exit_heads() -> None:
    model = early_exit_resnet("resnet50", stem="imagenet")
    heads = sum(_params(h) for h in model.heads[:3])
    final_head = _params(model.heads[3])
    # torchvision's resnet50 has 25,557,032 parameters; its fc is our final head.
    assert _params(model) - heads == 25_557_032
    assert final_head == 2048 * 1000 + 1000
    assert heads == (256 + 512 + 1024) * 1000 + 3 * 1000


def test_width_scales_every_channel_count_with_a_floor_of_eight() -> None:
    model = early_exit_resnet("resnet50", width=0.25)
    assert [h[-1].in_features for h in model.heads] == [64, 128, 256, 512]
    tiny = early_exit_resnet("resnet50", width=0.01)
    assert tiny.stages[0][0][0].out_channels == 8
    assert [h[-1].in_features for h in tiny.heads] == [32, 32, 32, 32]


@pytest.mark.parametrize(
    ("stem", "shape", "classes"), [("cifar", (3, 32, 32), 100), ("imagenet", (3, 224, 224), 1000)]
)
def test_stems_set_input_shape_default_classes_and_exit_resolutions(
    stem: str, shape: tuple, classes: int
) -> None:
    model = early_exit_resnet("resnet50", stem=stem, width=0.125)
    assert model.input_shape == shape and model.num_classes == classes
    x = torch.randn(2, *shape)
    sizes = []
    with torch.no_grad():
        for stage in model.stages:
            x = stage(x)
            sizes.append(x.shape[-1])
    first = 32 if stem == "cifar" else 56
    assert sizes == [first, first // 2, first // 4, first // 8]


def test_every_exit_gives_num_classes_logits_of_moderate_size() -> None:
    model = early_exit_resnet("resnet152", width=0.125, num_classes=7)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        for k in range(4):
            logits = forward_exit(model, x, k)
            assert logits.shape == (3, 7)
            assert torch.isfinite(logits).all() and logits.abs().max() < 100


def test_weights_are_a_function_of_the_seed_only() -> None:
    a, b = early_exit_resnet("resnet50", width=0.125), early_exit_resnet("resnet50", width=0.125)
    c = early_exit_resnet("resnet50", width=0.125, seed=1)
    for (key, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), key
    assert not torch.equal(a.stages[0][0][0].weight, c.stages[0][0][0].weight)
    state = torch.random.get_rng_state()
    early_exit_resnet("resnet50", width=0.125)
    assert torch.equal(torch.random.get_rng_state(), state), "building a model must not move the global RNG"


def test_models_are_built_in_eval_mode_with_non_trivial_batchnorm_statistics() -> None:
    model = early_exit_resnet("resnet50", width=0.125)
    assert not model.training
    bn = model.stages[1][0].bn1
    assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    assert not torch.allclose(bn.running_mean, torch.zeros_like(bn.running_mean))


def test_unknown_depth_or_stem_is_refused() -> None:
    with pytest.raises(ValueError, match="resnet50"):
        early_exit_resnet("resnet18")
    with pytest.raises(ValueError, match="cifar"):
        early_exit_resnet("resnet50", stem="mnist")
