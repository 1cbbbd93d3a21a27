"""Latency against batch size: one subplot per model, one line per exit, p50 with a p5-p95 band.

matplotlib is optional (the `plot` extra): it is imported only when a plot is asked for, and the
object-oriented Figure API is used so nothing touches pyplot's global state or needs a display.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edgeserve.errors import EdgeServeError
from edgeserve.profile import ProfileTable


def plot_profiles(tables: Sequence[ProfileTable], path: Path) -> Path:
    """Write the plot to `path` (format from its suffix, e.g. .png or .svg) and return it."""
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError:
        raise EdgeServeError(
            "--plot needs matplotlib, which is not installed; install it with `pip install 'edgeserve[plot]'`"
        ) from None
    from edgeserve.plotting import color

    if not tables:
        raise EdgeServeError("nothing to plot: no profiles were measured or loaded")
    columns = min(3, len(tables))
    rows = math.ceil(len(tables) / columns)
    fig = Figure(figsize=(5 * columns, 3.8 * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax, table in zip(axes.flat, tables, strict=False):
        batches = np.arange(1, table.max_batch + 1)
        for e, exit_name in enumerate(table.exit_names):
            samples = [np.asarray(table.cell(e, b).samples_ms) for b in batches]
            p5, p50, p95 = (np.array([np.percentile(s, q) for s in samples]) for q in (5, 50, 95))
            (line,) = ax.plot(batches, p50, marker="o", markersize=3, label=exit_name)
            ax.fill_between(batches, p5, p95, color=line.get_color(), alpha=0.2, linewidth=0)
        threads = table.fingerprint.threads
        plural = "" if threads == 1 else "s"
        ax.set_title(
            f"{table.model} ({table.fingerprint.device}, {threads} thread{plural})",
            fontsize=9,
            color=color(table.model),
        )
        ax.set_xlabel("batch size")
        ax.set_ylabel("latency [ms], p50 and p5-p95")
        ax.set_xticks(batches)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(title="exit", fontsize=8)
    for ax in list(axes.flat)[len(tables) :]:
        ax.set_visible(False)
    fig.suptitle(f"{tables[0].fingerprint.backend}: latency per batch size and exit (profile)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, dpi=120)
    except (OSError, ValueError) as exc:
        raise EdgeServeError(
            f"{path}: cannot write the plot ({exc}); pick a writable .png or .svg path"
        ) from None
    return path
