"""Figures in the manner of the paper's: P95 and violation ratio against load per policy (Fig. 4),
mean accuracy against P95 (Fig. 6), exit mix against load (Fig. 5). matplotlib is imported here,
lazily, so serving never needs it (it comes with the `plot` extra)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from edgeserve.errors import EdgeServeError
from edgeserve.plotting import SLO_STYLE, color


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise EdgeServeError(
            "plots need matplotlib: `pip install 'edgeserve[plot]'`, or pass --no-plots"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


def plot_sweep(rows: list[dict[str, Any]], out_dir: Path, title_note: str = "") -> list[Path]:
    """Write the three figures for each (traffic, mix, exits, SLO) group of the overall rows."""
    plt = _pyplot()
    overall = [r for r in rows if r["scope"] == "all"]
    written = []
    for group in sorted({(r["traffic"], r["mix"], r["exits"], r["slo_ms"]) for r in overall}, key=str):
        block = [r for r in overall if (r["traffic"], r["mix"], r["exits"], r["slo_ms"]) == group]
        traffic, mix, exits, slo = group
        tag = _slug(f"{traffic}_{mix}_{exits}_slo{slo:g}")
        title = f"{traffic}, {mix}, exits {exits}, SLO {slo:g} ms" + (
            f" — {title_note}" if title_note else ""
        )
        curves = _curves(block)

        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        for policy, points in curves.items():
            loads = [p["load_rps"] for p in points]
            left.plot(loads, [p["p95_ms"] for p in points], marker="o", label=policy, color=color(policy))
            right.plot(
                loads, [p["violation_pct"] for p in points], marker="o", label=policy, color=color(policy)
            )
        left.axhline(slo, label=f"SLO {slo:g} ms", **SLO_STYLE)
        left.set(xlabel="load (req/s of a ratio-1 model)", ylabel="P95 latency (ms)", yscale="log")
        right.set(xlabel="load (req/s of a ratio-1 model)", ylabel="SLO violation (%)")
        right.legend(fontsize=7)
        fig.suptitle(title, fontsize=9)
        written.append(_save(fig, out_dir / f"p95_violation_vs_load_{tag}.png", plt))

        with_acc = {p: pts for p, pts in curves.items() if pts[0]["mean_accuracy_pct"] is not None}
        if with_acc:
            fig, ax = plt.subplots(figsize=(6.5, 4.5))
            for policy, points in with_acc.items():
                ax.plot(
                    [p["p95_ms"] for p in points],
                    [p["mean_accuracy_pct"] for p in points],
                    marker="o",
                    label=policy,
                    color=color(policy),
                )
            ax.axvline(slo, label=f"SLO {slo:g} ms", **SLO_STYLE)
            ax.set(xlabel="P95 latency (ms)", ylabel="mean accuracy (%)", xscale="log")
            ax.legend(fontsize=7)
            ax.set_title(title, fontsize=8)
            written.append(_save(fig, out_dir / f"accuracy_vs_p95_{tag}.png", plt))

        adaptive = [p for p in curves if any(len(pt["exit_mix"].split(";")) > 1 for pt in curves[p])]
        if adaptive:
            exit_names = _exit_names(block)  # shallow to deep, one colour each across every panel
            colours = {
                name: plt.get_cmap("viridis")(i / max(len(exit_names) - 1, 1))
                for i, name in enumerate(exit_names)
            }
            fig, axes = plt.subplots(1, len(adaptive), figsize=(4 * len(adaptive), 4), squeeze=False)
            for ax, policy in zip(axes[0], adaptive, strict=True):
                points = curves[policy]
                mixes = [_parse_mix(p["exit_mix"]) for p in points]
                bottom = [0.0] * len(points)
                labels = [f"{p['load_rps']:g}" for p in points]
                for name in exit_names:
                    share = [100.0 * m.get(name, 0.0) for m in mixes]
                    ax.bar(labels, share, bottom=bottom, label=name, color=colours[name])
                    bottom = [b + s for b, s in zip(bottom, share, strict=True)]
                ax.set(title=policy, xlabel="load", ylabel="exit mix (% of tasks)")
                ax.tick_params(axis="x", labelrotation=90, labelsize=7)
            axes[0][-1].legend(fontsize=7, loc="lower left")
            fig.suptitle(title, fontsize=9)
            written.append(_save(fig, out_dir / f"exit_mix_vs_load_{tag}.png", plt))
    return written


def _parse_mix(text: str) -> dict[str, float]:
    """'layer1:0.1000;final:0.9000' -> {'layer1': 0.1, 'final': 0.9}."""
    return {name: float(share) for name, share in (kv.split(":") for kv in text.split(";") if kv)}


def _exit_names(rows: list[dict[str, Any]]) -> list[str]:
    """Every exit name in the rows, shallow to deep: each row lists its exits in that order, so a
    name goes after every name that precedes it in some row (transitively)."""
    before: dict[str, set[str]] = {}
    for row in rows:
        names = list(_parse_mix(row["exit_mix"]))
        for i, name in enumerate(names):
            before.setdefault(name, set()).update(names[:i])
    changed = True
    while changed:
        changed = False
        for preds in before.values():
            grown = preds.union(*(before[p] for p in preds))
            if grown != preds:
                preds |= grown
                changed = True
    return sorted(before, key=lambda name: (len(before[name]), name))


def _curves(block: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per policy, one point per load (averaged over seeds)."""
    curves: dict[str, list[dict[str, Any]]] = {}
    for policy in dict.fromkeys(r["policy"] for r in block):
        points = []
        for load in sorted({r["load_rps"] for r in block if r["policy"] == policy}):
            runs = [r for r in block if r["policy"] == policy and r["load_rps"] == load]
            point = dict(runs[0])
            for key in ("p95_ms", "violation_pct"):
                point[key] = sum(r[key] for r in runs) / len(runs)
            if point["mean_accuracy_pct"] is not None:
                point["mean_accuracy_pct"] = sum(r["mean_accuracy_pct"] for r in runs) / len(runs)
            points.append(point)
        curves[policy] = points
    return curves


def _save(fig: Any, path: Path, plt: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
