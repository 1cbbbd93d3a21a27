"""Age of answered frames (capture to answer) when the camera is faster than the server.

    .venv/bin/python benchmarks/camera_latency.py                  # ~1 min: 2x and 5x, 10 s each
    .venv/bin/python benchmarks/camera_latency.py --seconds 20 --service-ms 10

A real `edgeserve serve` core (NetServer, UNIX socket) serves digits-s (exported into a temporary
repository) through a backend that takes a fixed `--service-ms` per frame on top of the model, so
the server's capacity is known and steady on a shared CPU; it is measured first (a closed loop of
frames). A live source (ArraySource: rendered digits at a fixed rate) then runs at 2x and 5x that
capacity through the real CameraStream, two ways:

- latest-frame (`edgeserve camera`): at most `--window` frames in flight, stale frames dropped
  at the source;
- naive: every frame is sent, in order, as soon as the window allows: frames queue at the client.

Printed per run: frames captured, answered, dropped at the source, P50/P99 age of answered frames
over the whole run and over its last second. Naive's age grows with run time (its queue grows by
(rate - capacity) frames per second); latest-frame's stays about `window` service times.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "camera"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from camera_support import digits_frames, export_digits_s, serve_config
from net_support import server_thread

from edgeserve.camera.runner import run_streams
from edgeserve.camera.sources import ArraySource
from edgeserve.camera.stream import CameraStream, StreamConfig
from edgeserve.config.server import BackendConfig
from edgeserve.loop import run
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend
from edgeserve.wire.client import AsyncClient


@dataclass
class SteadyBackend:
    """ONNX Runtime plus a fixed service time per frame: a server of known, steady capacity."""

    inner: OnnxRuntimeBackend
    per_frame_s: float

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run_outputs(self, model: str, exit: int, batch: np.ndarray) -> dict[str, np.ndarray]:
        time.sleep(self.per_frame_s * len(batch))
        return self.inner.run_outputs(model, exit, batch)


def factory(per_frame_s: float) -> Any:
    def build(repository: ModelRepository, config: BackendConfig) -> SteadyBackend:
        return SteadyBackend(OnnxRuntimeBackend(repository, threads=1, warmup=0), per_frame_s)

    return build


async def capacity(target: str, frames: np.ndarray, window: int, seconds: float) -> float:
    """Frames per second the server answers with `window` frames in flight (closed loop)."""
    client = await AsyncClient.connect(target)
    done = 0
    end = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done
        k = 0
        while time.monotonic() < end:
            await client.infer("digits-s", frames[k % len(frames)], capture_ts=time.time())
            done += 1
            k += 1

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(window)))
    rate = done / (time.monotonic() - started)
    await client.close()
    return rate


def run_camera(
    target: str, frames: np.ndarray, fps: float, seconds: float, window: int, naive: bool
) -> dict[str, Any]:
    records: list[dict[str, Any]] = []
    config = StreamConfig("bench", "digits-s", target, window=window, naive=naive)
    stream = CameraStream(config, ArraySource(frames, fps=fps), records.append)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(seconds, stream.stop)
        await run_streams([stream], stats_every_s=0)

    run(main())
    ok = [r for r in records if r["status"] == "ok"]
    ages = [r["age_ms"] for r in ok]
    end = max((r["answer_ts"] for r in ok), default=0.0)
    last = [r["age_ms"] for r in ok if r["answer_ts"] >= end - 1.0]
    return {
        "captured": stream.stats.frames_in,
        "answered": len(ok),
        "dropped": stream.stats.dropped,
        "unsent": stream.stats.frames_in - stream.stats.sent - stream.stats.dropped,
        "p50": percentile(ages, 50),
        "p99": percentile(ages, 99),
        "last_p50": percentile(last, 50),
        "last_p99": percentile(last, 99),
    }


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each camera run")
    parser.add_argument("--service-ms", type=float, default=20.0, help="fixed service time per frame")
    parser.add_argument("--window", type=int, default=2)
    parser.add_argument("--factors", default="2,5", help="source rates as multiples of the capacity")
    args = parser.parse_args()
    frames = digits_frames().frames
    with tempfile.TemporaryDirectory() as tmp:
        root = export_digits_s(Path(tmp) / "engines")
        config = serve_config(root, Path(tmp), slo_ms=600_000.0)  # nothing expires: ages show the queueing
        config["models"]["digits-s"]["max_queue"] = 100_000
        with server_thread(config, backend_factory=factory(args.service_ms / 1000.0)) as srv:
            cap = run(capacity(srv.unix_url, frames, args.window, 3.0))
            setup = f"service {args.service_ms} ms/frame, window {args.window}"
            print(f"server capacity: {cap:.1f} frames/s ({setup})")
            print(
                f"{'source':>12} {'client':>13} {'captured':>9} {'answered':>9} {'dropped':>8} {'queued':>7}"
                f" {'P50 ms':>9} {'P99 ms':>9} {'last-s P50':>11} {'last-s P99':>11}"
            )
            for factor in (float(f) for f in args.factors.split(",")):
                fps = factor * cap
                for naive in (False, True):
                    row = run_camera(srv.unix_url, frames, fps, args.seconds, args.window, naive)
                    name = "naive" if naive else "latest-frame"
                    print(
                        f"{factor:>4.0f}x {fps:>5.0f}/s {name:>13} {row['captured']:>9} {row['answered']:>9}"
                        f" {row['dropped']:>8} {row['unsent']:>7} {row['p50']:>9.1f} {row['p99']:>9.1f}"
                        f" {row['last_p50']:>11.1f} {row['last_p99']:>11.1f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
