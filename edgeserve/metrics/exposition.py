"""The Prometheus text exposition format 0.0.4, written by hand so serving needs no client library.

A `Family` is one metric: its name, type, HELP text and samples. `render` writes HELP and TYPE
lines then one line per sample, with label values and HELP text escaped as the format requires
(backslash, double quote and newline in label values; backslash and newline in HELP).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TYPES = ("counter", "gauge", "histogram")


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """Integers without a decimal point, floats as Python's shortest repr, +Inf/-Inf/NaN spelled out."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


@dataclass
class Family:
    """One metric family; `samples` are (name suffix, labels, value)."""

    name: str
    type: str
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"metric {self.name}: type must be one of {TYPES}, got {self.type!r}")

    def add(self, value: float, **labels: str) -> Family:
        self.samples.append(("", labels, value))
        return self

    def add_histogram(self, snapshot: Mapping[str, Any], **labels: str) -> Family:
        """A counters.Histogram snapshot: cumulative `_bucket{le=...}`, then `_sum` and `_count`."""
        for bound, cumulative in snapshot["buckets"]:
            self.samples.append(("_bucket", {**labels, "le": format_value(float(bound))}, cumulative))
        self.samples.append(("_sum", labels, float(snapshot["sum"])))
        self.samples.append(("_count", labels, int(snapshot["count"])))
        return self


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{escape_label_value(str(value))}"' for key, value in labels.items())
    return "{" + inner + "}"


def render(families: Iterable[Family]) -> str:
    """The exposition text: each family's HELP and TYPE lines, then its samples; ends with a newline."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for suffix, labels, value in family.samples:
            lines.append(f"{family.name}{suffix}{_labels(labels)} {format_value(value)}")
    return "\n".join(lines) + "\n"
