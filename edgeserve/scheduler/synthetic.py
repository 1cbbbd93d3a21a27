"""A SYNTHETIC profile of the paper's setup (three early-exit ResNets on an RTX 3080), for `--paper-gpu`.

Only the per-exit latencies at batch 5 survive in the paper's text (see docs/scheduler.md), so the rest is a
stated model, not a measurement:

- batch scaling: affine, L(b) = L(5) * (8 + b) / 13, i.e. L(10) / L(1) = 2 (the paper: latency
  grows "modestly" from batch 1 to 10, far less than 10x);
- the published numbers are taken as the mean of each cell;
- noise: log-normal samples with coefficient of variation `cv` (default 3 %; the paper reports
  small CVs under locked clocks), 200 samples per cell, seeded.

Everything built here says "synthetic" in its fingerprint, its settings and its model labels.
"""

from __future__ import annotations

import math

import numpy as np

from edgeserve.fingerprint import Fingerprint
from edgeserve.profile import ProfileCell, ProfileTable

EXIT_NAMES = ("layer1", "layer2", "layer3", "final")
# ms at batch 5 on the authors' RTX 3080 (layer1/layer2/layer3/final)
PAPER_BATCH5_MS: dict[str, tuple[float, float, float, float]] = {
    "ResNet50": (1.65, 2.79, 4.20, 5.06),
    "ResNet101": (1.66, 2.79, 8.32, 9.24),
    "ResNet152": (1.67, 3.69, 12.61, 13.53),
}
SYNTHETIC_LABEL = "synthetic: EdgeServing paper RTX 3080 per-exit latency at batch 5, scaled"


def batch_scale(batch: int) -> float:
    """L(b) / L(5) under the affine model with L(10) / L(1) = 2."""
    return (8.0 + batch) / 13.0


def paper_gpu_profiles(
    max_batch: int = 10, cv: float = 0.03, samples: int = 200, seed: int = 0
) -> list[ProfileTable]:
    """Synthetic ProfileTables for ResNet50, ResNet101 and ResNet152 (see the module docstring)."""
    sigma = math.sqrt(math.log1p(cv * cv))
    fingerprint = Fingerprint(
        backend="synthetic",
        device="EdgeServing paper RTX 3080 (synthetic)",
        extra={"batch_scaling": "L(b)=L(5)*(8+b)/13", "noise": f"lognormal cv={cv:g}"},
    )
    tables = []
    for index, (model, at_batch5) in enumerate(PAPER_BATCH5_MS.items()):
        rng = np.random.default_rng([seed, index])
        table = ProfileTable(
            model=model,
            exit_names=EXIT_NAMES,
            max_batch=max_batch,
            fingerprint=fingerprint,
            graphs_sha256="synthetic",
            settings={"synthetic": True, "label": SYNTHETIC_LABEL, "cv": cv, "samples": samples},
            created="synthetic",
        )
        for exit_index, ms in enumerate(at_batch5):
            for batch in range(1, max_batch + 1):
                mean = ms * batch_scale(batch)
                draw = rng.lognormal(math.log(mean) - sigma * sigma / 2.0, sigma, samples)
                table.add(ProfileCell.from_samples(exit_index, batch, draw))
        tables.append(table)
    return tables
