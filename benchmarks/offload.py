"""Offload under load: violation ratio, P95 and the share served upstream, with and without offload.

Violations are judged at the client, as benchmarks/overload.py does: an answer counts as in deadline
only if it is `ok` and back at this client within the SLO of its send; the server's own view (its
`late` flag) is printed beside it (`server v%`), since the two differ by the way back.

Two `edgeserve serve` processes on loopback: the local box and an upstream 5 ms away (each way)
behind `edgeserve.tools.delay_proxy`. The local box serves a small CNN whose shallowest exit already
costs most of its compute, so the offload rule (offload only what even the shallowest exit
cannot serve in time) has work to do. For every offered load (a multiple of the local All-Final
capacity) the same seeded Poisson trace is sent to a fresh local-only server and to a fresh server
with the upstream configured, one after the other, in the same run.

Both processes share this machine's cores. By default the upstream serves a lighter model with
the same inputs and outputs, standing in for a faster server (`--upstream-model same` runs the
local model there too: on a 2-core box it then competes with the local box for the same cores).

    .venv/bin/python benchmarks/offload.py                    # ~2 minutes
    .venv/bin/python benchmarks/offload.py --loads 1 1.5 --duration 3
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeserve.files import sha256_file
from edgeserve.manifest import ExitSpec, Manifest, StageSpec, TensorSpec
from edgeserve.net.listeners import free_port
from edgeserve.profiler.measure import MeasureSettings, measure_model
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend
from edgeserve.scheduler import LatencyModel
from edgeserve.service.serve_cli import ready_urls
from edgeserve.wire.client import AsyncClient

MODEL = "cnn"
INPUT = (3, 48, 48)
CLASSES = 10
MAX_BATCH = 4
# (channels, exit head) per 3x3 conv stage: the heavy local model and the light stand-in upstream
HEAVY = [(96, None), (256, "early"), (16, "final")]
LIGHT = [(8, None), (32, "early"), (16, "final")]


def _stage(
    k: int, cin: int, cout: int, head: str | None, last: bool, rng: np.random.Generator
) -> onnx.ModelProto:
    w = (rng.standard_normal((cout, cin, 3, 3)) / math.sqrt(cin * 9)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.zeros(cout, np.float32), "b")]
    feat = "relu" if last else "features"
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], [feat]),
    ]
    outputs = (
        []
        if last
        else [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", cout, None, None])]
    )
    if head:
        fc = (rng.standard_normal((CLASSES, cout)) / math.sqrt(cout)).astype(np.float32)
        inits += [
            numpy_helper.from_array(fc, "fc"),
            numpy_helper.from_array(np.zeros(CLASSES, np.float32), "fb"),
        ]
        nodes += [
            helper.make_node("GlobalAveragePool", [feat], ["p"]),
            helper.make_node("Flatten", ["p"], ["f"], axis=1),
            helper.make_node("Gemm", ["f", "fc", "fb"], ["logits"], transB=1),
        ]
        outputs.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", cin, None, None])
    model = helper.make_model(
        helper.make_graph(nodes, f"stage{k}", [x], outputs, inits),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 9
    return model


def build_model(root: Path, stages: list[tuple[int, str | None]]) -> LatencyModel:
    """Write the CNN's stages and manifest, measure its profile here; returns its latency model."""
    repository = ModelRepository(root)
    model_dir = repository.model_dir(MODEL)
    (model_dir / "onnx").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    specs, exits, cin = [], [], INPUT[0]
    for k, (cout, head) in enumerate(stages):
        rel = f"onnx/stage{k}.onnx"
        last = k == len(stages) - 1
        onnx.save(_stage(k, cin, cout, head, last, rng), str(model_dir / rel))
        specs.append(
            StageSpec.chain(
                index=k,
                path=rel,
                sha256=sha256_file(model_dir / rel),
                size_bytes=(model_dir / rel).stat().st_size,
                input=TensorSpec("x", (cin, *INPUT[1:])),
                logits=TensorSpec("logits", (CLASSES,)) if head else None,
                features=None if last else TensorSpec("features", (cout, *INPUT[1:])),
            )
        )
        if head:
            exits.append(ExitSpec(head, k))
        cin = cout
    manifest = Manifest(
        MODEL,
        (TensorSpec("x", INPUT),),
        tuple(specs),
        tuple(exits),
        num_classes=CLASSES,
        source={"builder": "benchmarks/offload.py"},
    )
    repository.save_manifest(manifest)
    backend = OnnxRuntimeBackend(repository, threads=1, warmup=2)
    backend.load(manifest)
    table = measure_model(backend, manifest, MeasureSettings(MAX_BATCH, repeats=20, warmup=2))
    repository.save_profile(table)
    backend.close()
    return LatencyModel.from_profiles([table])


@dataclass
class Child:
    proc: subprocess.Popen[str]
    urls: list[str]

    def url(self, scheme: str) -> str:
        return next(u for u in self.urls if u.startswith(scheme))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def serve(toml: str, work: Path, name: str) -> Child:
    path = work / f"{name}.toml"
    path.write_text(toml)
    exe = shutil.which("edgeserve", path=os.path.dirname(sys.executable)) or "edgeserve"
    proc = subprocess.Popen(
        [exe, "serve", "--config", str(path), "--log-level", "error"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if (urls := ready_urls(line)) is not None:
            return Child(proc, urls)
    raise RuntimeError(f"{name} exited with {proc.wait()} before it was ready")


@dataclass
class Run:
    sent: int = 0
    statuses: list[str] = field(default_factory=list)
    late: list[bool] = field(default_factory=list)
    upstream: list[bool] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)

    def row(self, load: float, mode: str, slo_ms: float) -> str:
        """Violations judged at the client (not `ok`, or back after the SLO from its send, as
        overload.py judges them), then the server's own view (not `ok`, or its `late` flag) beside:
        the two disagree by the time an answer spends between the server and this client."""
        n = len(self.statuses)
        answers = list(zip(self.statuses, self.late, self.latency_ms, strict=True))
        client_bad = sum(1 for s, _, ms in answers if s != "ok" or ms > slo_ms)
        server_bad = sum(1 for s, late, _ in answers if s != "ok" or late)
        ok = [ms for s, _, ms in answers if s == "ok"]
        p95 = float(np.percentile(ok, 95)) if ok else math.nan
        share = 100.0 * sum(self.upstream) / max(n, 1)
        viol, server_viol = 100.0 * client_bad / max(n, 1), 100.0 * server_bad / max(n, 1)
        return (
            f"{load:5.2f} {mode:8s} {viol:7.2f} {p95:8.1f} {server_viol:9.2f} {share:10.1f} "
            f"{n:6d}/{self.sent:<6d}"
        )


async def send(target: str, times: np.ndarray, inputs: np.ndarray, warmup_s: float) -> Run:
    """Open-loop: one request per arrival time; latency from send to answer on this side."""
    client = await AsyncClient.connect(target)
    await asyncio.sleep(warmup_s)  # let the offloading server probe its upstream first
    run = Run()
    pending = []

    def answered(sent_at: float, future: asyncio.Future) -> None:  # timed the moment it resolves
        reply = future.result()
        run.latency_ms.append((time.monotonic() - sent_at) * 1000.0)
        run.statuses.append(reply.status)
        run.late.append(reply.late)
        run.upstream.append(reply.served_by != "local")

    start = time.monotonic()
    for i, t in enumerate(times):
        delay = start + float(t) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        future = client.send(MODEL, inputs[i % len(inputs)])
        sent_at = time.monotonic()
        future.add_done_callback(lambda f, sent_at=sent_at: answered(sent_at, f))
        pending.append(future)
        run.sent += 1
    await asyncio.wait_for(asyncio.gather(*pending), 60)
    await asyncio.sleep(0)  # the last done-callbacks
    await client.close()
    return run


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--loads",
        type=float,
        nargs="+",
        default=[0.5, 0.75, 1.0, 1.25, 1.5, 2.0],
        help="offered load as multiples of the local All-Final capacity",
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of arrivals per run")
    parser.add_argument("--slo-ms", type=float, default=150.0)
    parser.add_argument("--delay-ms", type=float, default=5.0, help="one-way delay to the upstream")
    parser.add_argument("--upstream-model", choices=("light", "same"), default="light")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="offload-bench-"))
    local_root, upstream_root = work / "local", work / "upstream"
    latency = build_model(local_root, HEAVY).models[0]
    upstream_latency = build_model(upstream_root, LIGHT if args.upstream_model == "light" else HEAVY).models[
        0
    ]
    final = len(latency.exit_ids) - 1
    capacity = MAX_BATCH / latency.latency(final, MAX_BATCH)
    common = (
        f'repository = "{{root}}"\n[backend]\nthreads = 1\nwarmup = 2\n'
        f"[models.{MODEL}]\nslo_ms = {args.slo_ms}\nmax_queue = 1024\n"
    )
    upstream = serve(
        common.format(root=upstream_root) + '[listen]\ntcp = "127.0.0.1:0"\nhttp = "127.0.0.1:0"\n',
        work,
        "upstream",
    )
    proxy_port = free_port()
    proxy = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgeserve.tools.delay_proxy",
            "--listen",
            f"127.0.0.1:{proxy_port}",
            "--to",
            upstream.url("http://").removeprefix("http://"),
            "--delay-ms",
            str(args.delay_ms),
        ],
        stdout=subprocess.DEVNULL,
    )
    local = (
        common.format(root=local_root) + '[scheduler]\nlate_tasks = "expire"\n[listen]\ntcp = "127.0.0.1:0"\n'
    )
    offload = local + (
        f'[[upstreams]]\nname = "upstream"\nurl = "http://127.0.0.1:{proxy_port}"\ntimeout_ms = 500\n'
        f"probe_interval_s = 0.2\n[upstreams.models.{MODEL}]\n"
    )
    inputs = np.random.default_rng(args.seed).standard_normal((64, *INPUT)).astype(np.float32)
    print(
        f"local {MODEL}: All-Final capacity {capacity:.0f} req/s (batch {MAX_BATCH}, p95 profile), "
        f"shallowest exit {MAX_BATCH / latency.latency(0, MAX_BATCH):.0f} req/s; "
        f"upstream ({args.upstream_model} model) All-Final "
        f"{MAX_BATCH / upstream_latency.latency(len(upstream_latency.exit_ids) - 1, MAX_BATCH):.0f} "
        "req/s, "
        f"+{args.delay_ms:g} ms each way via the delay proxy"
    )
    print(
        f"SLO {args.slo_ms:g} ms, local late_tasks = expire, {args.duration:g} s of Poisson arrivals "
        "per run, same trace for both modes"
    )
    print(
        "NOTE: local server, upstream server, proxy and load generator share this machine's "
        f"{os.cpu_count()} cores"
    )
    print()
    print(
        "viol %: not ok or back past the SLO at this client; P95: of the ok answers at this client; "
        "server viol %: not ok or `late` by the server's own clock (its view, for comparison)"
    )
    print(" load mode      viol %   P95 ms  server v%  upstream %  answered/sent")
    try:
        for load in args.loads:
            rng = np.random.default_rng([args.seed, int(load * 1000)])
            gaps = rng.exponential(
                1.0 / (load * capacity), size=int(load * capacity * args.duration * 2) + 10
            )
            times = np.cumsum(gaps)
            times = times[times < args.duration]
            for mode, toml in (("local", local), ("offload", offload)):
                child = serve(toml, work, mode)
                try:
                    run = asyncio.run(send(child.url("tcp://"), times, inputs, warmup_s=0.8))
                finally:
                    child.stop()
                print(run.row(load, mode, args.slo_ms), flush=True)
    finally:
        upstream.stop()
        proxy.terminate()
        proxy.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
