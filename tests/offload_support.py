"""Helpers for the offload tests: a 64-feature early-exit MLP in ONNX, profiles, MLServer, a load sender.

The MLP takes sklearn's digits as 64 floats (the same input MLServer's LightGBM model takes), so
one request can be served by either. MLServer runs as its own process from its own CLI, serving a
LightGBM booster saved in LightGBM's text format through MLServer's LightGBM runtime.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from runtime_support import HookedBackend

from edgeserve.files import sha256_file
from edgeserve.manifest import ExitSpec, Manifest, StageSpec, TensorSpec
from edgeserve.net.listeners import free_port
from edgeserve.profile import ProfileTable
from edgeserve.profiler.measure import MeasureSettings, measure_model
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend
from edgeserve.service.serve_cli import ready_urls


def _gemm_stage(
    index: int, fan_in: int, hidden: int | None, classes: int, rng: np.random.Generator
) -> onnx.ModelProto:
    """x [batch, fan_in] -> (features = relu(x W1 + b1) when `hidden`) and logits from a linear head."""
    inits, nodes, outputs = [], [], []
    source, width = "x", fan_in
    if hidden is not None:
        w1 = (rng.standard_normal((fan_in, hidden)) / math.sqrt(fan_in)).astype(np.float32)
        inits += [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(np.zeros(hidden, np.float32), "b1"),
        ]
        nodes += [
            helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
            helper.make_node("Relu", ["h"], ["features"]),
        ]
        outputs.append(helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", hidden]))
        source, width = "features", hidden
    w2 = (rng.standard_normal((width, classes)) / math.sqrt(width)).astype(np.float32)
    inits += [numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(np.zeros(classes, np.float32), "b2")]
    nodes.append(helper.make_node("Gemm", [source, "w2", "b2"], ["logits"]))
    outputs.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", fan_in])
    graph = helper.make_graph(nodes, f"stage{index}", [x], outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def write_mlp_model(
    repository: ModelRepository, name: str, features: int = 64, classes: int = 10
) -> Manifest:
    """Two stages: 64 -> 32 (exit "early"), 32 -> logits (exit "final")."""
    rng = np.random.default_rng(5)
    model_dir = repository.model_dir(name)
    (model_dir / "onnx").mkdir(parents=True, exist_ok=True)
    stages = []
    for k, (fan_in, hidden) in enumerate([(features, 32), (32, None)]):
        rel = f"onnx/stage{k}.onnx"
        onnx.save(_gemm_stage(k, fan_in, hidden, classes, rng), str(model_dir / rel))
        stages.append(
            StageSpec.chain(
                index=k,
                path=rel,
                sha256=sha256_file(model_dir / rel),
                size_bytes=(model_dir / rel).stat().st_size,
                input=TensorSpec("x", (fan_in,)),
                logits=TensorSpec("logits", (classes,)),
                features=None if hidden is None else TensorSpec("features", (hidden,)),
            )
        )
    manifest = Manifest(
        name=name,
        inputs=(TensorSpec("x", (features,)),),
        num_classes=classes,
        stages=tuple(stages),
        exits=(ExitSpec("early", 0), ExitSpec("final", 1)),
        source={"builder": "tests/offload_support.py"},
    )
    repository.save_manifest(manifest)
    return manifest


def profile_with_delay(root: Path, manifests: list[Manifest], delay_s: float, max_batch: int = 4) -> None:
    """Profiles measured through a HookedBackend that adds `delay_s` per batch, as the server will run."""
    repository = ModelRepository(root)
    backend = HookedBackend(OnnxRuntimeBackend(repository, threads=1, warmup=0), delay_s=delay_s)
    for manifest in manifests:
        backend.load(manifest)
        repository.save_profile(
            measure_model(backend, manifest, MeasureSettings(max_batch, repeats=5, warmup=1))
        )
    backend.close()


def wait_http_ready(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url + "/v2/health/ready", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready within {timeout_s} s")


@contextmanager
def mlserver(model_dir: Path, name: str) -> Iterator[str]:
    """`mlserver start` over a folder holding one model (model.txt); yields its base URL."""
    root = model_dir.parent
    port = free_port()
    settings = {
        "http_port": port,
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "metrics_endpoint": None,
        "parallel_workers": 0,
    }
    (root / "settings.json").write_text(json.dumps(settings))
    model_settings = {
        "name": name,
        "implementation": "mlserver_lightgbm.LightGBMModel",
        "parameters": {"uri": "./model.txt"},
    }
    (model_dir / "model-settings.json").write_text(json.dumps(model_settings))
    exe = shutil.which("mlserver", path=os.path.dirname(sys.executable)) or "mlserver"
    log = open(root / "mlserver.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [exe, "start", str(root)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(url, 60, proc)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@dataclass
class LoadResult:
    """What an open-loop Poisson run got back: one entry per request sent."""

    sent: int = 0
    sent_at: list[float] = field(default_factory=list)  # seconds since the run started
    statuses: list[str] = field(default_factory=list)
    late: list[bool] = field(default_factory=list)
    served_by: list[str] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # connection-level failures (never expected)

    @property
    def answered(self) -> int:
        return len(self.statuses)

    @property
    def violations(self) -> float:
        bad = sum(1 for s, late in zip(self.statuses, self.late, strict=True) if s != "ok" or late)
        return bad / max(self.answered, 1)

    @property
    def upstream_share(self) -> float:
        return sum(1 for s in self.served_by if s != "local") / max(self.answered, 1)

    @property
    def p95_ms(self) -> float:
        ok = [ms for ms, s in zip(self.latency_ms, self.statuses, strict=True) if s == "ok"]
        return float(np.percentile(ok, 95)) if ok else math.nan


def poisson_times(rate: float, duration_s: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=int(rate * duration_s * 2) + 10)
    times = np.cumsum(gaps)
    return times[times < duration_s]


async def send_poisson(
    target: str, model: str, inputs: np.ndarray, times: np.ndarray, drain_s: float = 20.0
) -> LoadResult:
    """Send one request per arrival time over one connection; wait for every answer.

    Answers are matched to requests by id; `errors` records any that never came (none should)."""
    from edgeserve.wire.client import AsyncClient

    client = await AsyncClient.connect(target)
    result = LoadResult()
    futures = []
    start = time.monotonic()
    try:
        for i, t in enumerate(times):
            delay = start + float(t) - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            future = client.send(model, inputs[i % len(inputs)])
            futures.append(future)
            result.sent += 1
            result.sent_at.append(time.monotonic() - start)
        for future in futures:
            try:
                reply = await asyncio.wait_for(future, drain_s)
            except Exception as exc:
                result.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            result.statuses.append(reply.status)
            result.late.append(reply.late)
            result.served_by.append(reply.served_by)
            result.latency_ms.append(float(reply.timings.get("total_ms") or math.nan))
    finally:
        await client.close()
    return result


def write_conv_model(root: Path, name: str = "conv", *, light: bool = False) -> ProfileTable:
    """A small CNN whose shallowest exit already carries most of the cost (~10 ms per sample on
    one CPU thread), so overloading it takes ~100 requests per second, not thousands.

    `light`: the same inputs, exits and outputs at ~1/20 of the compute. An upstream serving it
    stands in for a faster server: on a 2-core box an upstream running the same model on the
    same cores could not take the local box's excess (both would be CPU-bound).
    """
    from tiny_onnx import StageDef, write_tiny_model

    repository = ModelRepository(root)
    if light:
        stages = [StageDef(8), StageDef(32, head="early"), StageDef(16, head="final")]
    else:
        stages = [StageDef(96), StageDef(256, head="early"), StageDef(16, head="final")]
    tiny = write_tiny_model(repository, name, (3, 48, 48), stages, num_classes=10, seed=3)
    backend = OnnxRuntimeBackend(repository, threads=1, warmup=1)
    backend.load(tiny.manifest)
    table = measure_model(backend, tiny.manifest, MeasureSettings(4, repeats=5, warmup=1))
    repository.save_profile(table)
    backend.close()
    return table


@dataclass
class Process:
    """A child process started in its own session (so a kill takes its children too)."""

    proc: subprocess.Popen[str]
    urls: list[str]
    log: Path

    def url(self, scheme: str) -> str:
        return next(u for u in self.urls if u.startswith(scheme))

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        self.proc.wait(20)

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9


def start_serve(config_toml: str, workdir: Path, name: str, timeout_s: float = 60.0) -> Process:
    """`edgeserve serve --config <file>`; returns once it prints its ready line (with the URLs)."""
    path = workdir / f"{name}.toml"
    path.write_text(config_toml)
    log = workdir / f"{name}.log"
    exe = shutil.which("edgeserve", path=os.path.dirname(sys.executable)) or "edgeserve"
    proc = subprocess.Popen(
        [exe, "serve", "--config", str(path), "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=open(log, "w"),  # noqa: SIM115 - the child owns it
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{name} exited with {proc.wait()}: {log.read_text()[-2000:]}")
        if (urls := ready_urls(line)) is not None:
            return Process(proc, urls, log)
    proc.kill()
    raise TimeoutError(f"{name} did not get ready in {timeout_s} s")


def start_proxy(target: str, delay_ms: float) -> tuple[subprocess.Popen[str], int]:
    """`python -m edgeserve.tools.delay_proxy` in front of host:port; returns it and its port."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgeserve.tools.delay_proxy",
            "--listen",
            f"127.0.0.1:{port}",
            "--to",
            target,
            "--delay-ms",
            str(delay_ms),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and "delay proxy" in proc.stdout.readline()
    return proc, port
