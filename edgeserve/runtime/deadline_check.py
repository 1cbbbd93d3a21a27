"""Start-up check of deadlines against the profiles: a model whose fastest exit, alone at batch 1,
takes longer than its `slo_ms` could never answer in time, so the server refuses to start with
one sentence naming both numbers, instead of answering every request `expired`.

The latency is the quantile the scheduler plans with (`[scheduler] quantile`, p95 by default) of
the loaded profile (the emulated backend's, `slowdown` included): what the scheduler itself
believes, so a model the check lets through is one the scheduler can plan for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from edgeserve.profile import ProfileTable


def deadline_problem(
    names: Sequence[str], tables: Sequence[ProfileTable], slo_ms: Mapping[str, float], quantile: str = "p95"
) -> str | None:
    """The sentence for the first served model whose `slo_ms` no exit can meet at batch 1, else None.

    `names[i]` is served with the profile `tables[i]`; `slo_ms` maps each name to its deadline budget.
    """
    for name, table in zip(names, tables, strict=True):
        budget = float(slo_ms[name])
        costs = [(table.latency_ms(e, 1, quantile), e) for e in range(len(table.exit_names))]
        fastest_ms, exit = min(costs)
        if fastest_ms <= budget:
            continue
        hint = ""
        if budget * 1000.0 >= fastest_ms:  # 0.05 for 50 ms: seconds typed as milliseconds
            hint = f" (slo_ms is in milliseconds: did you mean slo_ms = {budget * 1000.0:g}?)"
        return (
            f"models.{name}.slo_ms = {budget:g} ms cannot be met: its fastest exit "
            f"({table.exit_names[exit]!r}) takes {fastest_ms:.2f} ms at batch 1 on this box ({quantile} of "
            f"its profile), so every request would come back `expired`; raise slo_ms to more than "
            f"{fastest_ms:.2f}{hint}, or serve it on a faster device"
        )
    return None


def check_deadlines(
    names: Sequence[str], tables: Sequence[ProfileTable], slo_ms: Mapping[str, float], quantile: str = "p95"
) -> None:
    """ConfigError with `deadline_problem`'s sentence when a served model's slo_ms cannot be met."""
    from edgeserve.config.checks import ConfigError

    if (problem := deadline_problem(names, tables, slo_ms, quantile)) is not None:
        raise ConfigError(problem)
