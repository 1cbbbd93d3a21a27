"""The contract that makes any torch module exportable as an early-exit model.

A model is a chain of stages; stage k maps the features of stage k-1 (or the model input) to its own
features, and may carry an exit head that maps those features to logits. Declaring the chain
explicitly, instead of tracing one forward, is what lets export write one graph per stage (weights
stored once) and lets the runtime stop after any stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from edgeserve.export.errors import ExportError


class EarlyExitModel(Protocol):
    """What `edgeserve export` needs from a torch module.

    stages       stage k maps features_{k-1} -> features_k (stage 0 takes the model input)
    heads        one module or None per stage; head k maps features_k -> logits (batch, num_classes).
                 The last stage must have a head (it is the model's final exit).
    exit_names   one name per stage that has a head, shallow to deep
    input_shape  shape of one sample, without the batch dimension, e.g. (3, 32, 32)
    num_classes  width of every head's logits
    """

    stages: nn.ModuleList
    heads: Sequence[nn.Module | None]
    exit_names: list[str]
    input_shape: tuple[int, ...]
    num_classes: int


class PoolLinearHead(nn.Sequential):
    """The usual exit head: global average pool, flatten, one Linear."""

    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__(nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(channels, num_classes))


def exit_stages(model: EarlyExitModel) -> list[int]:
    """The stage index of every exit, shallow to deep; raises ExportError if the contract is broken."""
    where = type(model).__name__
    if not isinstance(model, nn.Module):
        raise ExportError(f"{where} is not a torch.nn.Module; only torch modules can be exported")
    # hasattr, not isinstance(model, EarlyExitModel): since Python 3.12 a runtime-checkable protocol
    # looks attributes up statically, and misses the submodules nn.Module keeps in `_modules`.
    missing = [
        a for a in ("stages", "heads", "exit_names", "input_shape", "num_classes") if not hasattr(model, a)
    ]
    if missing:
        raise ExportError(
            f"{where} does not follow the early-exit contract: it lacks {', '.join(missing)} "
            "(see edgeserve.export.early_exit.EarlyExitModel)"
        )
    stages, heads, names = list(model.stages), list(model.heads), list(model.exit_names)
    if not stages:
        raise ExportError(f"{where}.stages is empty: an early-exit model needs at least one stage")
    if len(heads) != len(stages):
        raise ExportError(
            f"{where} has {len(stages)} stages but {len(heads)} heads; give one head (or None) per stage"
        )
    if heads[-1] is None:
        raise ExportError(f"{where}: the last stage has no head, so the model has no final exit")
    with_head = [k for k, head in enumerate(heads) if head is not None]
    if len(names) != len(with_head):
        raise ExportError(
            f"{where} names {len(names)} exits ({names}) but {len(with_head)} stages have heads ({with_head})"
        )
    if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
        raise ExportError(f"{where}.exit_names must be distinct non-empty strings, got {names}")
    shape = tuple(model.input_shape)
    if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise ExportError(f"{where}.input_shape must be positive ints per sample (no batch dim), got {shape}")
    if not isinstance(model.num_classes, int) or model.num_classes < 1:
        raise ExportError(f"{where}.num_classes must be a positive int, got {model.num_classes!r}")
    return with_head


def forward_exit(model: EarlyExitModel, x: torch.Tensor, exit_index: int) -> torch.Tensor:
    """Logits at exit `exit_index` (0 = shallowest): stages 0..k, then head k. The export reference."""
    stages = exit_stages(model)
    if not 0 <= exit_index < len(stages):
        raise IndexError(f"exit {exit_index} out of range: the model has exits 0..{len(stages) - 1}")
    last = stages[exit_index]
    for stage in list(model.stages)[: last + 1]:
        x = stage(x)
    head = model.heads[last]
    assert head is not None
    return head(x)


class StageGraph(nn.Module):
    """One stage as an exportable graph: x -> (features, logits), dropping what does not exist.

    The last stage returns only logits (nothing follows it); a stage without a head returns only
    features. `output_names` lists the outputs in order, for the ONNX graph.
    """

    def __init__(self, stage: nn.Module, head: nn.Module | None, is_last: bool) -> None:
        super().__init__()
        self.stage = stage
        self.head = head
        self.is_last = is_last
        self.output_names: list[str] = ([] if is_last else ["features"]) + (
            [] if head is None else ["logits"]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        features = self.stage(x)
        if self.head is None:
            return features
        logits = self.head(features)
        return logits if self.is_last else (features, logits)


def stage_graphs(model: EarlyExitModel) -> list[StageGraph]:
    """The model cut into one StageGraph per stage (sharing the model's modules, not copies)."""
    exit_stages(model)
    stages, heads = list(model.stages), list(model.heads)
    return [StageGraph(stage, heads[k], k == len(stages) - 1) for k, stage in enumerate(stages)]
