"""One look for every plot edgeserve draws: a colour per model and per policy, the SLO line, titles.

The bench, the profiler and the simulator import their colours from here, so digits-m (or the
stability policy) has the same colour in every figure. Known names have fixed colours; any other
name gets one from a stable hash, so it too keeps its colour across runs. matplotlib is imported
lazily (the `plot` extra) by `pyplot()`; this module itself needs nothing.
"""

from __future__ import annotations

import zlib
from typing import Any

# matplotlib's tab10, written out so colours need no matplotlib.
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
SLO_COLOR = "#000000"
SLO_STYLE: dict[str, Any] = {"color": SLO_COLOR, "linestyle": "--", "linewidth": 1.2}

# Models by family prefix (resnet50-cifar-w0.25 is a resnet50), then policies.
FIXED: dict[str, str] = {
    "digits-s": PALETTE[0],
    "digits-m": PALETTE[1],
    "digits-l": PALETTE[2],
    "resnet50": PALETTE[0],
    "resnet101": PALETTE[1],
    "resnet152": PALETTE[2],
    "stability": PALETTE[3],
    "stability-safe": PALETTE[4],
    "stability-protective": PALETTE[5],
    "stability-bs1": PALETTE[6],
    "all-final": PALETTE[7],
    "all-early": PALETTE[8],
    "early-exit-lqf": PALETTE[9],
    "early-exit-edf": PALETTE[0],
    "all-final-deadline-aware": PALETTE[1],
    "symphony": PALETTE[2],
    "stability-safe-maxbatch": PALETTE[7],
    "all": "#333333",
}


def color(name: str) -> str:
    """The colour of a model or policy, the same in every plot."""
    if name in FIXED:
        return FIXED[name]
    family = name.split("-")[0]
    if family in FIXED:
        return FIXED[family]
    return PALETTE[zlib.crc32(name.encode()) % len(PALETTE)]


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed); ModuleNotFoundError if absent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def slo_line(ax: Any, slo_ms: float, *, vertical: bool = False, label: str | None = None) -> None:
    """Draw the SLO at `slo_ms` (horizontal on a latency y axis, vertical on a latency x axis)."""
    text = label if label is not None else f"SLO {slo_ms:g} ms"
    if vertical:
        ax.axvline(slo_ms, label=text, **SLO_STYLE)
    else:
        ax.axhline(slo_ms, label=text, **SLO_STYLE)
