"""Train digits-s/m/l (all exits jointly) and write their weights to export/weights/<name>.npz.

    python -m edgeserve.export.train_digits                 # all three, ~10-30 s on 2 cores
    python -m edgeserve.export.train_digits --models digits-s --out-dir /tmp/w

Deterministic: fixed split, fixed seeds, deterministic algorithms, a fixed thread count.
The loss is the sum of the per-exit cross-entropies, so every exit learns from the start.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edgeserve.export.digits import DIGITS_MODELS, WEIGHTS_DIR, DigitsNet, build_digits_model, exit_accuracies
from edgeserve.export.digits_data import DigitsSplit, load_digits_split
from edgeserve.export.state_npz import save_state_npz


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 10
    batch_size: int = 64
    max_lr: float = 1e-2
    weight_decay: float = 1e-4
    seed: int = 0
    threads: int = 2


@dataclass(frozen=True)
class TrainResult:
    name: str
    seconds: float
    epoch_losses: list[float]
    accuracies: list[float]


def train_digits_model(
    name: str, split: DigitsSplit, config: TrainConfig = TrainConfig()
) -> tuple[DigitsNet, TrainResult]:
    """Adam with a one-cycle schedule on the sum of exit losses; returns the eval-mode model."""
    with _deterministic(config.threads):
        return _train(name, split, config)


@contextlib.contextmanager
def _deterministic(threads: int) -> Iterator[None]:
    """Deterministic kernels and a fixed thread count while training, restored afterwards."""
    previous = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(previous[0])
        torch.use_deterministic_algorithms(previous[1])


def _train(name: str, split: DigitsSplit, config: TrainConfig) -> tuple[DigitsNet, TrainResult]:
    model = build_digits_model(name, seed=config.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.max_lr, weight_decay=config.weight_decay)
    x = torch.from_numpy(split.x_train)
    y = torch.from_numpy(split.y_train)
    batches = -(-len(x) // config.batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=config.max_lr, total_steps=config.epochs * batches
    )
    order = torch.Generator().manual_seed(config.seed)
    losses = []
    start = time.perf_counter()
    model.train()
    for _ in range(config.epochs):
        permutation = torch.randperm(len(x), generator=order)
        total = 0.0
        for i in range(0, len(x), config.batch_size):
            index = permutation[i : i + config.batch_size]
            logits = model.all_exit_logits(x[index])
            loss = torch.stack([nn.functional.cross_entropy(out, y[index]) for out in logits]).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item() * len(index)
        losses.append(total / len(x))
    seconds = time.perf_counter() - start
    model.eval()
    accuracies = exit_accuracies(model, split.x_test, split.y_test)
    return model, TrainResult(name, seconds, losses, accuracies)


def _format(result: TrainResult, exit_names: list[str]) -> str:
    accuracy = "  ".join(f"{n} {a:6.1%}" for n, a in zip(exit_names, result.accuracies, strict=True))
    return f"{result.name}: {result.seconds:5.1f} s, final loss {result.epoch_losses[-1]:.3f} | {accuracy}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m edgeserve.export.train_digits",
        description=(
            "Train the digits-s/m/l early-exit models on scikit-learn's digits (all exits jointly) and "
            "save their weights as .npz. Prints training time and per-exit test accuracy."
        ),
        epilog="example: python -m edgeserve.export.train_digits --models digits-s --out-dir /tmp/weights",
    )
    parser.add_argument("--models", nargs="+", choices=DIGITS_MODELS, default=list(DIGITS_MODELS))
    parser.add_argument(
        "--out-dir", type=Path, default=WEIGHTS_DIR, help="where <name>.npz go (default: %(default)s)"
    )
    parser.add_argument("--epochs", type=int, default=TrainConfig.epochs)
    parser.add_argument("--seed", type=int, default=TrainConfig.seed)
    parser.add_argument("--threads", type=int, default=TrainConfig.threads)
    args = parser.parse_args(argv)
    config = TrainConfig(epochs=args.epochs, seed=args.seed, threads=args.threads)
    split = load_digits_split()
    shape = split.x_train.shape[1:]
    print(f"digits: {len(split.y_train)} train / {len(split.y_test)} test images, input {shape}")
    total = 0.0
    for name in args.models:
        model, result = train_digits_model(name, split, config)
        path = save_state_npz(model, args.out_dir / f"{name}.npz")
        total += result.seconds
        print(_format(result, model.exit_names), f"-> {path} ({path.stat().st_size / 1024:.0f} KiB)")
        if not all(np.diff(result.accuracies) > 0):
            print(f"warning: {name}: exit accuracies do not increase with depth", file=sys.stderr)
    print(f"total training time {total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
