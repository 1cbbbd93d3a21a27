"""Embed edgeserve in a Python program: the async API, then the blocking one.

    .venv/bin/python examples/embed.py            # serves the digits models in ./engines

The digits models ship with the repository's demo (`make demo` exports and profiles them);
any exported and profiled model works the same way.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np

import edgeserve

CONFIG = {
    "repository": str(Path(__file__).resolve().parent.parent / "engines"),
    "backend": {"threads": 1},
    "scheduler": {"late_tasks": "expire"},
    "models": {"digits-s": {"slo_ms": 20}, "digits-m": {"slo_ms": 50}},
}


async def serve_async(x: np.ndarray) -> None:
    async with edgeserve.Server(CONFIG) as server:
        result = await server.infer("digits-m", x[0], deadline_ms=30)
        result.raise_for_status()
        print(
            f"async: class {int(result.output.argmax())} from exit {result.exit_name} "
            f"(expected accuracy {result.expected_accuracy}), {result.total_ms:.2f} ms "
            f"({result.queue_ms:.2f} queued, {result.service_ms:.2f} in the backend)"
        )
        results = await server.infer_batch("digits-s", x[:8])
        print("async batch:", [r.status.value for r in results], [r.exit_name for r in results])
        print("counters:", server.snapshot()["requests"])


def serve_blocking(x: np.ndarray) -> None:
    with edgeserve.BlockingServer(CONFIG) as server:
        result = server.infer("digits-s", x[0])
        print(f"blocking: {result.status.value}, exit {result.exit_name}, {result.total_ms:.2f} ms")


def main() -> int:
    data = Path(CONFIG["repository"]) / "digits-test.npz"
    try:
        x = np.load(data, allow_pickle=False)["x"].astype(np.float32)
        asyncio.run(serve_async(x))
        serve_blocking(x)
    except (edgeserve.EdgeServeError, FileNotFoundError) as exc:
        print(f"embed.py: {exc}\n(make the digits models first: `make demo`)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
