"""Per-exit accuracy tables: measured ones from the manifests, or the EdgeServing authors' table.

The simulator reports mean accuracy as the paper does: each finished task scores the top-1
accuracy of the exit it used (an unbiased estimate when requests are drawn from the test set).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from edgeserve.errors import EdgeServeError
from edgeserve.manifest import Manifest

# The authors' per-exit top-1 on CIFAR-100 (their public results file, "two-stage" training).
PAPER_ACCURACY: dict[str, dict[str, float]] = {
    "ResNet50": {"layer1": 0.0764, "layer2": 0.1213, "layer3": 0.3082, "final": 0.7435},
    "ResNet101": {"layer1": 0.0739, "layer2": 0.1452, "layer3": 0.5433, "final": 0.7794},
    "ResNet152": {"layer1": 0.0729, "layer2": 0.1724, "layer3": 0.4744, "final": 0.7796},
}
PAPER_SOURCE = "EdgeServing authors' CIFAR-100 per-exit accuracy (theirs, not measured here)"


@dataclass(frozen=True)
class AccuracyTable:
    """model name -> exit name -> top-1 accuracy in [0, 1], and where the numbers come from."""

    source: str
    by_model: Mapping[str, Mapping[str, float]]

    def of(self, model: str, exit_name: str) -> float:
        return self.by_model[model][exit_name]

    def covers(self, model: str, exit_names: Sequence[str]) -> bool:
        return model in self.by_model and all(e in self.by_model[model] for e in exit_names)


def paper_accuracy(models: Mapping[str, Sequence[str]]) -> AccuracyTable:
    """The authors' table for models whose names contain 50, 101 or 152 (e.g. resnet101-cifar-w0.25)."""
    table: dict[str, dict[str, float]] = {}
    for name, exits in models.items():
        depth = re.search(r"(?<!\d)(152|101|50)(?!\d)", name)
        if depth is None:
            raise EdgeServeError(
                f"--accuracy-table paper covers ResNet50/101/152 only; cannot tell which one {name!r} is"
            )
        row = PAPER_ACCURACY[f"ResNet{depth.group(1)}"]
        missing = [e for e in exits if e not in row]
        if missing:
            raise EdgeServeError(
                f"the paper's table has no exit {missing[0]!r} (it has {list(row)}) for {name!r}"
            )
        table[name] = {e: row[e] for e in exits}
    return AccuracyTable(PAPER_SOURCE, table)


def manifest_accuracy(manifests: Sequence[Manifest]) -> AccuracyTable | None:
    """Measured accuracies from the manifests, or None unless every exit of every model has one."""
    table: dict[str, dict[str, float]] = {}
    datasets = set()
    for manifest in manifests:
        if any(e.accuracy is None for e in manifest.exits):
            return None
        table[manifest.name] = {e.name: float(e.accuracy) for e in manifest.exits}  # type: ignore[arg-type]
        datasets.add(manifest.accuracy_dataset or "unnamed dataset")
    return AccuracyTable(f"measured, manifests ({', '.join(sorted(datasets))})", table)
