"""The main job on the embedded default (CPU, ONNX Runtime), as README command 1 runs it.

Each step is the public command a user would type, printed before it runs, so the demo doubles as a
walk-through. Steps are cached: a second run re-uses the exported models and the measured profiles.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DEMO_MODELS = ("digits-s", "digits-m", "digits-l")


@dataclass(frozen=True)
class Step:
    title: str
    argv: list[str]


def steps(repository: Path, plot: Path, force: bool) -> list[Step]:
    models = [arg for m in DEMO_MODELS for arg in ("--model", m)]
    eval_data = repository / "digits-test.npz"
    bindir = Path(sys.executable).parent
    again = ["--force"] if force else []
    return [
        Step(
            "export the three early-exit digits CNNs to per-stage ONNX (verified against torch)",
            [
                str(bindir / "edgeserve"),
                "export",
                "--demo",
                "--repository",
                str(repository),
                "--eval-data-out",
                str(eval_data),
                *again,
            ],
        ),
        Step(
            "profile every (model, exit, batch 1..10) cell; measure per-exit accuracy through ONNX Runtime",
            [
                str(bindir / "edgeserve-profile"),
                *models,
                "--repository",
                str(repository),
                "--eval",
                str(eval_data),
                "--plot",
                str(plot),
                *again,
            ],
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgeserve.demo", description=__doc__)
    parser.add_argument(
        "--repository", type=Path, default=Path(os.environ.get("EDGESERVE_REPOSITORY", "engines"))
    )
    parser.add_argument("--plot", type=Path, default=Path("out/profile.png"))
    parser.add_argument("--force", action="store_true", help="re-export and re-profile even if cached")
    args = parser.parse_args(argv)
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for number, step in enumerate(steps(args.repository, args.plot, args.force), start=1):
        print(
            f"\n== {number}. {step.title}\n$ {shlex.join([Path(step.argv[0]).name, *step.argv[1:]])}",
            flush=True,
        )
        t0 = time.perf_counter()
        code = subprocess.call(step.argv)
        if code != 0:
            print(f"demo: step {number} failed with exit code {code}", file=sys.stderr)
            return code
        print(f"   ({time.perf_counter() - t0:.1f} s)", flush=True)
    print(f"\ndemo finished in {time.perf_counter() - started:.1f} s; latency plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
