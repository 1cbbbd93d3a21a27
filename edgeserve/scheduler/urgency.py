"""Urgency u(x) of a task whose normalised queuing time is x = w / D (EdgeServing Eq. 3).

Both published forms are exponential, equal 1 at x = 1 and are clipped at `clip` so that tasks
already far past their deadline cannot dominate the stability score:

- "paper" (the paper's text):  u(x) = min((e^x - 1) / (e - 1), clip)   u(0) = 0
- "code"  (the authors' code): u(x) = min(e^(x - 1), clip)             u(0) = 1/e

Both are `alpha * e^x + beta` below the clip, which is what the fast scorer factorises.
The default is the paper's form: in the simulator it violates fewer deadlines than the code form
at the same accuracy (docs/scheduler.md, "Urgency forms").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

URGENCY_FORMS = ("code", "paper")


@dataclass(frozen=True)
class Urgency:
    form: str = "paper"
    clip: float = 10.0

    def __post_init__(self) -> None:
        if self.form not in URGENCY_FORMS:
            raise ValueError(f"unknown urgency form {self.form!r}; choose one of {URGENCY_FORMS}")
        if not self.clip > 0:
            raise ValueError(f"urgency clip must be positive (math.inf disables it), got {self.clip}")

    @property
    def threshold(self) -> float:
        """The x at and above which u(x) is clipped (inf when the clip is off)."""
        if math.isinf(self.clip):
            return math.inf
        if self.form == "code":
            return 1.0 + math.log(self.clip)
        return math.log1p(self.clip * (math.e - 1.0))

    def __call__(self, x: float) -> float:
        """Scalar form, as a per-task loop computes it."""
        if x >= self.threshold:
            return self.clip
        try:
            if self.form == "code":
                return min(math.exp(x - 1.0), self.clip)
            return min(math.expm1(x) / (math.e - 1.0), self.clip)
        except OverflowError:  # only reachable with clip=inf
            return math.inf

    def of(self, x: np.ndarray) -> np.ndarray:
        """Vectorised form: same values as __call__ element-wise."""
        with np.errstate(over="ignore"):
            u = np.exp(x - 1.0) if self.form == "code" else np.expm1(x) / (math.e - 1.0)
        return np.minimum(u, self.clip, out=u)

    def describe(self) -> str:
        body = "e^(x-1)" if self.form == "code" else "(e^x-1)/(e-1)"
        return f"u(x)=min({body}, {self.clip:g}) [{self.form} form]"
