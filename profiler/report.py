"""The printed profile table: one block per model, exits as rows, batch sizes as columns.

Each exit shows p50, the quantile the scheduler reads, and the coefficient of variation, so a
person sees at a glance both the numbers the scheduler will plan with and how far to trust them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edgeserve.profile import ProfileTable

NOISY_MARK = "!"
DEFAULT_CV_THRESHOLD = 0.10
MAX_LISTED = 12  # a noisy box flags most cells; the table marks them all, the list stays short


@dataclass(frozen=True)
class NoisyCell:
    model: str
    exit_name: str
    batch: int
    cv: float


def _ms(value: float) -> str:
    if value < 1:
        return f"{value:.3f}"
    return f"{value:.2f}" if value < 100 else f"{value:.1f}"


def format_table(
    table: ProfileTable, quantile: str = "p95", cv_threshold: float = DEFAULT_CV_THRESHOLD
) -> str:
    """Latency table of one model; CVs above `cv_threshold` carry NOISY_MARK."""
    fp, settings = table.fingerprint, table.settings
    threads = f", {fp.threads} thread{'s' if fp.threads != 1 else ''}" if fp.threads is not None else ""
    header = (
        f"{table.model}: latency in ms per batch ({settings.get('repeats', '?')} timed runs per cell after "
        f"{settings.get('warmup', '?')} warm-up runs; {fp.backend} on {fp.device}{threads}; {table.created})"
    )
    stats = ["p50", quantile] if quantile != "p50" else ["p50"]
    batches = range(1, table.max_batch + 1)
    rows: list[list[str]] = []
    for e, exit_name in enumerate(table.exit_names):
        for i, stat in enumerate(stats):
            label = f"{stat} <- scheduler" if stat == quantile else stat
            cells = [f"{_ms(table.latency_ms(e, b, stat))} " for b in batches]
            rows.append([exit_name if i == 0 else "", label, *cells])
        cvs = []
        for b in batches:
            cv = table.cell(e, b).stats.cv
            cvs.append(f"{cv:.1%}{NOISY_MARK if cv > cv_threshold else ' '}")
        rows.append(["", "CV", *cvs])
    head = ["exit", "row", *(f"b={b} " for b in batches)]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cols: list[str]) -> str:
        left = f"{cols[0]:<{widths[0]}}  {cols[1]:<{widths[1]}}"
        return "  ".join([left, *(f"{c:>{w}}" for c, w in zip(cols[2:], widths[2:], strict=True))]).rstrip()

    return "\n".join([header, line(head), *(line(r) for r in rows)])


def noisy_cells(
    tables: Sequence[ProfileTable], cv_threshold: float = DEFAULT_CV_THRESHOLD
) -> list[NoisyCell]:
    return [
        NoisyCell(t.model, t.exit_names[c.exit], c.batch, c.stats.cv)
        for t in tables
        for c in sorted(t.noisy_cells(cv_threshold), key=lambda c: (c.exit, c.batch))
    ]


def format_noisy(
    tables: Sequence[ProfileTable], cv_threshold: float = DEFAULT_CV_THRESHOLD, quantile: str = "p95"
) -> str:
    """The list of noisy cells with what to do about them; empty when every cell is steady."""
    noisy = noisy_cells(tables, cv_threshold)
    if not noisy:
        return ""
    lines = [
        f"{NOISY_MARK} {len(noisy)} cell{'s' if len(noisy) != 1 else ''} with CV above {cv_threshold:.0%}: "
        f"their latency varies so much that the scheduler's {quantile} predictions are unreliable:"
    ]
    worst = sorted(noisy, key=lambda c: -c.cv)[:MAX_LISTED]
    lines += [f"  {c.model} exit {c.exit_name} batch {c.batch}: CV {c.cv:.1%}" for c in noisy if c in worst]
    if len(noisy) > MAX_LISTED:
        lines.append(f"  ... and {len(noisy) - MAX_LISTED} more (marked {NOISY_MARK} in the tables)")
    lines.append(
        "  Make the box steadier and re-run with --force: close other programs, lock the clocks "
        "(Jetson: `sudo nvpmodel -m 0 && sudo jetson_clocks`), use fewer --threads, or raise --repeats."
    )
    return "\n".join(lines)
