"""What a newcomer gets slightly wrong, driven through the real entry points as subprocesses.

Every case is a user mistake or an environment problem (busy port, missing directory, absent
server, missing optional module, unreadable file, bad TOML, wrong model name). Each must end in
one line on stderr that names the offending value, a non-zero exit and no traceback; where the
line suggests a fix, the fix is applied (the suggested command run) and the error is gone.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from runtime_support import profiled_tiny_repository
from service_support import serve_process

from edgeserve.config.checks import preprocess_problem
from edgeserve.config.server import ServerConfig
from edgeserve.errors import guarded
from edgeserve.export.digits_data import INPUT_SHAPE as DIGITS_INPUT_SHAPE

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = {
    "edgeserve": [sys.executable, "-m", "edgeserve.cli"],
    "edgeserve-profile": [sys.executable, "-m", "edgeserve.profiler"],
    "demo": [sys.executable, "-m", "edgeserve.demo"],
}
TIMEOUT_S = 90.0


@dataclass
class Box:
    """What the cases share: a profiled tiny repository, a live server, a busy port, module shims."""

    tmp: Path
    repository: Path
    target: str  # the live server's unix:// URL
    busy_port: int
    shims: Path  # on PYTHONPATH: matplotlib and PIL that fail to import
    npy_text: Path
    png: Path

    def config(self, name: str, body: str, *, models: str | None = None, listen: str | None = None) -> Path:
        """A server config over the tiny repository; `body` is appended."""
        path = self.tmp / f"{name}.toml"
        models = models if models is not None else "[models.tiny_a]\nslo_ms = 1000\n"
        listen = listen if listen is not None else f'[listen]\nunix = "{self.tmp / (name + ".sock")}"\n'
        path.write_text(
            f"repository = {json.dumps(str(self.repository))}\n"
            '[backend]\nname = "onnxruntime"\nthreads = 1\nwarmup = 0\n'
            f"{models}{listen}{body}"
        )
        return path


def run(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = TIMEOUT_S
) -> tuple[int, str, str]:
    program, *rest = argv
    done = subprocess.run(
        [*PROGRAMS[program], *rest],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "EDGESERVE_DEBUG": "", **(env or {})},
        cwd=REPO,
    )
    return done.returncode, done.stdout, done.stderr


def serve_gets_ready(config: Path, timeout: float = 60.0) -> bool:
    """True when `edgeserve serve --config` prints its ready line (then it is stopped)."""
    with serve_process(config) as served:
        try:
            served.wait_ready(timeout)
        except AssertionError:
            return False
        served.process.terminate()
        served.finish()
    return True


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    tmp = tmp_path_factory.mktemp("newcomer")
    repository = tmp / "engines"
    profiled_tiny_repository(repository)
    shims = tmp / "shims"
    for module in ("matplotlib", "PIL"):
        (shims / module).mkdir(parents=True)
        (shims / module / "__init__.py").write_text(
            f"raise ImportError('{module} (test shim: not installed)')\n"
        )
    npy_text = tmp / "not-numpy.npy"
    npy_text.write_text("hello")
    png = tmp / "frame.png"
    png.write_bytes(b"not really a png")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    live = Box(tmp, repository, "", busy.getsockname()[1], shims, npy_text, png)
    config = live.config("live", "max_in_flight = 8\n", models="[models.tiny_a]\nslo_ms = 1000\n")
    with serve_process(config) as served:
        live.target = served.wait_ready(60.0)[0]
        yield live
        served.process.terminate()
        served.finish()
    busy.close()


@dataclass(frozen=True)
class Case:
    """One mistake: the command, what the one line must name, and how to apply its suggested fix."""

    name: str
    argv: Callable[[Box], list[str]]
    names: Callable[[Box], list[str]]  # substrings the message must contain (the offending value)
    env: Callable[[Box], dict[str, str]] | None = None
    fix: Callable[[Box, str], bool] | None = None  # applies the suggestion; True if it got past the error
    report: bool = False  # the command reports on stdout (doctor) instead of one line on stderr


def _suggested(stderr: str, program: str) -> list[str]:
    """The backticked command starting with `program` in the message, as argv."""
    match = re.search(rf"`({re.escape(program)} [^`]+)`", stderr)
    assert match, f"no `{program} ...` suggestion in: {stderr}"
    return shlex.split(match.group(1))


def _no_plot(box: Box) -> dict[str, str]:
    return {"PYTHONPATH": f"{box.shims}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _serve(name: str, body: str = "", **parts: str) -> Callable[[Box], list[str]]:
    return lambda box: ["edgeserve", "serve", "--config", str(box.config(name, body, **parts))]


# --- fixes: each applies what the message says and checks the error is gone ---------------------


def _fix_mkdir(box: Box, stderr: str) -> bool:
    command = re.search(r"mkdir -p (\S+?)\)", stderr)
    assert command, stderr
    Path(command.group(1)).mkdir(parents=True)
    return serve_gets_ready(box.tmp / "sockdir.toml")


def _fix_threads(box: Box, stderr: str) -> bool:
    argv = _suggested(stderr, "edgeserve-profile")
    assert "--threads" in argv and "--backend" in argv, argv
    code, _, err = run([*argv, "--repeats", "3", "--warmup", "1", "--max-batch", "4"])
    assert code == 0, err
    return serve_gets_ready(box.tmp / "threads.toml")


def _fix_threads_in_config(box: Box, stderr: str) -> bool:
    match = re.search(r"set `\[backend\] threads = (\d+)`", stderr)
    assert match, stderr
    path = box.tmp / "threads_cfg.toml"
    path.write_text(path.read_text().replace("threads = 3", f"threads = {match[1]}"))
    return serve_gets_ready(path)


def _fix_quote(box: Box, stderr: str) -> bool:
    match = re.search(r"\[models\.\"([^\"]+)\"\]", stderr)
    assert match, stderr
    path = box.tmp / "dotted.toml"
    path.write_text(path.read_text().replace(f"[models.{match.group(1)}]", f'[models."{match.group(1)}"]'))
    _code, _, err = run(["edgeserve", "serve", "--config", str(path)], timeout=60)
    return "TOML reads the dot" not in err and "tiny.a" in err  # past the quoting: now the model is missing


def _fix_did_you_mean_profile(box: Box, stderr: str) -> bool:
    name = re.search(r"did you mean '([^']+)'", stderr)
    assert name, stderr
    argv = [
        "edgeserve-profile",
        "--model",
        name.group(1),
        "--repository",
        str(box.repository),
        "--threads",
        "1",
    ]
    code, _, err = run([*argv, "--repeats", "3", "--warmup", "1", "--max-batch", "4"])
    return code == 0 and "is not in" not in err


def _fix_did_you_mean_send(box: Box, stderr: str) -> bool:
    name = re.search(r"did you mean '([^']+)'", stderr)
    assert name, stderr
    code, out, _err = run(
        ["edgeserve", "send", "--target", box.target, "--model", name.group(1), "--synthetic", "2"]
    )
    return code == 0 and out.count(" ok ") == 2


def _fix_did_you_mean_serve(box: Box, stderr: str) -> bool:
    name = re.search(r"did you mean '([^']+)'", stderr)
    assert name, stderr
    path = box.tmp / "modeltypo.toml"
    path.write_text(path.read_text().replace("[models.tiny_aa]", f"[models.{name.group(1)}]"))
    return serve_gets_ready(path)


def _fix_resize(box: Box, stderr: str) -> bool:
    match = re.search(r"set resize = \[(\d+), (\d+)\]", stderr)
    assert match, stderr
    path = box.tmp / "resize.toml"
    path.write_text(re.sub(r"resize = \[\d+, \d+\]", f"resize = [{match[1]}, {match[2]}]", path.read_text()))
    return serve_gets_ready(path)


def _fix_port(key: str, name: str) -> Callable[[Box, str], bool]:
    def fix(box: Box, stderr: str) -> bool:
        assert f"set {key} to a free port" in stderr, stderr
        path = box.tmp / f"{name}.toml"
        path.write_text(path.read_text().replace(f"127.0.0.1:{box.busy_port}", "127.0.0.1:0"))
        return serve_gets_ready(path)

    return fix


def _fix_reimport(box: Box, stderr: str) -> bool:
    code, _, err = run(_suggested(stderr, "edgeserve"))
    assert code == 0, err
    _, _, err = run(["edgeserve", "serve", "--config", str(box.tmp / "corrupt.toml")], timeout=60)
    return "not valid JSON" not in err and "edgeserve-profile" in err  # past the manifest: now unprofiled


def _fix_slo(box: Box, stderr: str) -> bool:
    match = re.search(r"did you mean slo_ms = ([0-9.]+)\?", stderr)
    assert match, stderr
    path = box.tmp / "noexit.toml"
    path.write_text(path.read_text().replace("slo_ms = 0.001", f"slo_ms = {match[1]}"))
    return serve_gets_ready(path)


CASES = [
    # --- edgeserve serve: the config and the environment ---
    Case(
        "serve: config file missing",
        lambda b: ["edgeserve", "serve", "--config", str(b.tmp / "nope.toml")],
        lambda b: [str(b.tmp / "nope.toml"), "not found"],
    ),
    Case(
        "serve: config is a directory",
        lambda b: ["edgeserve", "serve", "--config", str(b.tmp)],
        lambda b: [str(b.tmp), "directory"],
    ),
    Case(
        "serve: bad TOML", _serve("badtoml", "slo_ms = = 3\n"), lambda b: ["badtoml.toml", "not valid TOML"]
    ),
    Case(
        "serve: typo in a key",
        _serve("typo", models="[models.tiny_a]\nslo_mss = 10\n"),
        lambda b: ["models.tiny_a.slo_mss", "unknown key"],
    ),
    Case(
        "serve: unquoted dotted model name",
        _serve("dotted", models="[models.tiny.a]\nslo_ms = 10\n"),
        lambda b: ["tiny.a", '[models."tiny.a"]'],
        fix=_fix_quote,
    ),
    Case(
        "serve: model name typo",
        _serve("modeltypo", models="[models.tiny_aa]\nslo_ms = 10\n"),
        lambda b: ["'tiny_aa'", "did you mean 'tiny_a'"],
        fix=_fix_did_you_mean_serve,
    ),
    Case(
        "serve: socket directory missing",
        lambda b: _serve("sockdir", listen=f'[listen]\nunix = "{b.tmp / "missing" / "x" / "s.sock"}"\n')(b),
        lambda b: [str(b.tmp / "missing" / "x"), "mkdir -p"],
        fix=_fix_mkdir,
    ),
    Case(
        "serve: HTTP port in use",
        lambda b: [
            "edgeserve",
            "serve",
            "--config",
            str(b.config("httpbusy", "", listen=f'[listen]\nhttp = "127.0.0.1:{b.busy_port}"\n')),
        ],
        lambda b: [f"listen.http 127.0.0.1:{b.busy_port}"],
        fix=_fix_port("listen.http", "httpbusy"),
    ),
    Case(
        "serve: metrics port in use",
        lambda b: [
            "edgeserve",
            "serve",
            "--config",
            str(b.config("metricsbusy", f'[metrics]\nlisten = "127.0.0.1:{b.busy_port}"\n')),
        ],
        lambda b: [f"metrics.listen 127.0.0.1:{b.busy_port}"],
        fix=_fix_port("metrics.listen", "metricsbusy"),
    ),
    Case(
        "serve: TCP port in use",
        lambda b: [
            "edgeserve",
            "serve",
            "--config",
            str(b.config("tcpbusy", "", listen=f'[listen]\ntcp = "127.0.0.1:{b.busy_port}"\n')),
        ],
        lambda b: [f"listen.tcp 127.0.0.1:{b.busy_port}"],
    ),
    Case(
        "serve: tcp and http on one port",
        lambda b: _serve(
            "sameport",
            listen=f'[listen]\ntcp = "127.0.0.1:{b.busy_port + 1}"\nhttp = "127.0.0.1:{b.busy_port + 1}"\n',
        )(b),
        lambda b: [
            f'listen.http "127.0.0.1:{b.busy_port + 1}" is the port of listen.tcp',
            "give listen.http a port of its own",
        ],
    ),
    Case(
        "serve: http and metrics on one port",
        lambda b: _serve(
            "samemetrics",
            f'[metrics]\nlisten = "0.0.0.0:{b.busy_port + 2}"\n',
            listen=f'[listen]\nhttp = "127.0.0.1:{b.busy_port + 2}"\n',
        )(b),
        lambda b: [f'metrics.listen "0.0.0.0:{b.busy_port + 2}" is the port of listen.http'],
    ),
    Case("serve: no listener", _serve("nolisten", listen=""), lambda b: ["no listener configured"]),
    Case(
        "serve: a deadline no exit can meet (seconds typed as milliseconds)",
        _serve("noexit", models="[models.tiny_a]\nslo_ms = 0.001\n"),
        lambda b: [
            "models.tiny_a.slo_ms = 0.001 ms cannot be met",
            "ms at batch 1",
            "did you mean slo_ms = 1?",
        ],
        fix=_fix_slo,
    ),
    Case(
        "serve: preprocess resize does not fit the model",
        _serve(
            "resize", models="[models.tiny_a]\nslo_ms = 1000\n[models.tiny_a.preprocess]\nresize = [28, 28]\n"
        ),
        lambda b: ["tiny_a", "[28, 28]", "[1, 8, 8]"],
        fix=_fix_resize,
    ),
    Case(
        "serve: preprocess mean per channel for a gray model",
        _serve(
            "mean", models="[models.tiny_a.preprocess]\nmean = [0.1, 0.2, 0.3]\n[models.tiny_a]\nslo_ms = 1\n"
        ),
        lambda b: ["models.tiny_a.preprocess.mean", "1 channel", "give 1 value, e.g. mean = [0.1]"],
    ),
    Case(
        "serve: threads differ from the profile's",
        lambda b: ["edgeserve", "serve", "--config", str(_threads(b))],
        lambda b: ["--threads 2", "--backend onnxruntime", "or set `[backend] threads = 1`"],
        fix=_fix_threads,
    ),
    Case(
        "serve: threads differ from the profile's, fixed in the config",
        lambda b: ["edgeserve", "serve", "--config", str(_threads(b, "threads_cfg", 3))],
        lambda b: ["or set `[backend] threads = 1` to serve with the profile measured so"],
        fix=_fix_threads_in_config,
    ),
    Case(
        "serve: corrupt manifest of an imported model",
        lambda b: ["edgeserve", "serve", "--config", str(_corrupt_import(b))],
        lambda b: [
            "not valid JSON (Unterminated string starting at line 1)",
            f"`edgeserve import {b.tmp / 'plain.onnx'} --name imp --repository {b.tmp / 'imported'} --force`",
        ],
        fix=_fix_reimport,
    ),
    Case(
        "serve: repository missing",
        lambda b: ["edgeserve", "serve", "--config", str(_norepo(b))],
        lambda b: [str(b.tmp / "missing-engines"), "does not exist"],
    ),
    # --- edgeserve send ---
    Case(
        "send: absent socket",
        lambda b: [
            "edgeserve",
            "send",
            "--target",
            f"unix://{b.tmp}/absent.sock",
            "--model",
            "tiny_a",
            "--synthetic",
            "1",
        ],
        lambda b: [f"{b.tmp}/absent.sock", "edgeserve serve"],
    ),
    Case(
        "send: closed TCP port",
        lambda b: [
            "edgeserve",
            "send",
            "--target",
            f"tcp://127.0.0.1:{_closed_port()}",
            "--model",
            "tiny_a",
            "--synthetic",
            "1",
        ],
        lambda b: ["tcp://127.0.0.1:", "connection refused"],
    ),
    Case(
        "send: target without a scheme",
        lambda b: [
            "edgeserve",
            "send",
            "--target",
            "localhost:7070",
            "--model",
            "tiny_a",
            "--synthetic",
            "1",
        ],
        lambda b: ["'localhost:7070'", "tcp://host:port"],
    ),
    Case(
        "send: --npy missing",
        lambda b: [
            "edgeserve",
            "send",
            "--target",
            b.target,
            "--model",
            "tiny_a",
            "--npy",
            str(b.tmp / "nothing.npy"),
        ],
        lambda b: [str(b.tmp / "nothing.npy"), "no such file"],
    ),
    Case(
        "send: --npy not a .npy",
        lambda b: ["edgeserve", "send", "--target", b.target, "--model", "tiny_a", "--npy", str(b.npy_text)],
        lambda b: [str(b.npy_text), "not a readable .npy"],
    ),
    Case(
        "send: --image missing",
        lambda b: [
            "edgeserve",
            "send",
            "--target",
            b.target,
            "--model",
            "tiny_a",
            "--image",
            str(b.tmp / "nothing.png"),
        ],
        lambda b: [str(b.tmp / "nothing.png")],
    ),
    Case(
        "send: --image without Pillow",
        lambda b: ["edgeserve", "send", "--target", b.target, "--model", "tiny_a", "--image", str(b.png)],
        lambda b: ["--image needs PIL", "edgeserve[image]"],
        env=_no_plot,
    ),
    Case(
        "send: --image to a model without preprocess",
        lambda b: ["edgeserve", "send", "--target", b.target, "--model", "tiny_a", "--image", str(b.png)],
        lambda b: ["[models.tiny_a.preprocess]"],
    ),
    Case(
        "send: --synthetic 0",
        lambda b: ["edgeserve", "send", "--target", b.target, "--model", "tiny_a", "--synthetic", "0"],
        lambda b: ["--synthetic 0"],
    ),
    Case(
        "send: --out of an unknown kind",
        lambda b: [
            "edgeserve",
            "send",
            "--target",
            b.target,
            "--model",
            "tiny_a",
            "--synthetic",
            "1",
            "--out",
            str(b.tmp / "answers.csv"),
        ],
        lambda b: [f"--out {b.tmp / 'answers.csv'}", ".npz", ".jsonl"],
    ),
    Case(
        "send: model name typo",
        lambda b: ["edgeserve", "send", "--target", b.target, "--model", "tiny-a", "--synthetic", "1"],
        lambda b: ["'tiny-a'", "did you mean 'tiny_a'"],
        fix=_fix_did_you_mean_send,
    ),
    # --- edgeserve bench ---
    Case(
        "bench: absent socket",
        lambda b: ["edgeserve", "bench", "--target", f"unix://{b.tmp}/absent.sock", "--duration", "1"],
        lambda b: [f"{b.tmp}/absent.sock"],
    ),
    Case(
        "bench: HTTP port with no server",
        lambda b: ["edgeserve", "bench", "--target", f"http://127.0.0.1:{_closed_port()}", "--duration", "1"],
        lambda b: ["nothing answers at http://127.0.0.1:", "[listen] http"],
    ),
    Case(
        "bench: --plot without matplotlib",
        lambda b: [
            "edgeserve",
            "bench",
            "--target",
            b.target,
            "--duration",
            "1",
            "--plot",
            str(b.tmp / "b.png"),
        ],
        lambda b: ["--plot needs matplotlib", "edgeserve[plot]"],
        env=_no_plot,
    ),
    Case(
        "bench: --rate without --model",
        lambda b: ["edgeserve", "bench", "--target", b.target, "--rate", "5"],
        lambda b: ["1 --rate for 0 --model"],
    ),
    Case(
        "bench: --duration 0",
        lambda b: ["edgeserve", "bench", "--target", b.target, "--duration", "0"],
        lambda b: ["--duration 0"],
    ),
    Case(
        "bench: model name typo",
        lambda b: ["edgeserve", "bench", "--target", b.target, "--model", "tiny_x", "--duration", "1"],
        lambda b: ["'tiny_x'", "did you mean 'tiny_a'"],
    ),
    # --- edgeserve-profile ---
    Case(
        "profile: model name typo",
        lambda b: ["edgeserve-profile", "--model", "tiny_aa", "--repository", str(b.repository)],
        lambda b: ["'tiny_aa'", "did you mean 'tiny_a'"],
        fix=_fix_did_you_mean_profile,
    ),
    Case(
        "profile: repository missing",
        lambda b: ["edgeserve-profile", "--repository", str(b.tmp / "no-engines")],
        lambda b: [str(b.tmp / "no-engines"), "does not exist"],
    ),
    Case(
        "profile: --eval missing",
        lambda b: ["edgeserve-profile", "--repository", str(b.repository), "--eval", str(b.tmp / "no.npz")],
        lambda b: [str(b.tmp / "no.npz")],
    ),
    Case(
        "profile: unknown provider",
        lambda b: ["edgeserve-profile", "--repository", str(b.repository), "--providers", "quantum"],
        lambda b: ["quantum"],
    ),
    Case(
        "profile: bad --repeats", lambda b: ["edgeserve-profile", "--repeats", "zero"], lambda b: ["'zero'"]
    ),
    # --- the other commands ---
    Case(
        "doctor: config missing",
        lambda b: ["edgeserve", "doctor", "--config", str(b.tmp / "none.toml")],
        lambda b: [str(b.tmp / "none.toml")],
        report=True,
    ),
    Case(
        "export: unknown model",
        lambda b: ["edgeserve", "export", "--model", "resnet18", "--repository", str(b.tmp / "x")],
        lambda b: ["'resnet18'"],
    ),
    Case(
        "simulate: profile file missing",
        lambda b: ["edgeserve", "simulate", "--profile-json", str(b.tmp / "p.json")],
        lambda b: [str(b.tmp / "p.json")],
    ),
    Case(
        "simulate: plots without matplotlib",
        lambda b: ["edgeserve", "simulate", "--paper-gpu", "--out", str(b.tmp / "sim")],
        lambda b: ["simulate's plots needs matplotlib", "--no-plots"],
        env=_no_plot,
    ),
    Case(
        "demo: without matplotlib",
        lambda b: ["demo", "--repository", str(b.tmp / "demo-engines")],
        lambda b: ["the demo's plots needs matplotlib", "edgeserve[plot]"],
        env=_no_plot,
    ),
    Case("demo: --load out of range", lambda b: ["demo", "--load", "5"], lambda b: ["--load"]),
]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _threads(box: Box, name: str = "threads", threads: int = 2) -> Path:
    path = box.config(name, "")
    path.write_text(path.read_text().replace("threads = 1", f"threads = {threads}"))
    return path


def _corrupt_import(box: Box) -> Path:
    """A model brought in with `edgeserve import` whose manifest was cut short."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, box.tmp / "plain.onnx")
    folder = box.tmp / "imported" / "imp"
    folder.mkdir(parents=True, exist_ok=True)
    source = json.dumps(str(box.tmp / "plain.onnx"))
    (folder / "manifest.json").write_text(
        '{"name": "imp", "source": {"imported_from": ' + source + ', "x": "cut'
    )
    path = box.config("corrupt", "", models="[models.imp]\nslo_ms = 1000\n")
    path.write_text(path.read_text().replace(str(box.repository), str(box.tmp / "imported")))
    return path


def _norepo(box: Box) -> Path:
    path = box.config("norepo", "")
    text = path.read_text().replace(
        json.dumps(str(box.repository)), json.dumps(str(box.tmp / "missing-engines"))
    )
    path.write_text(text)
    return path


def test_the_table_has_at_least_30_mistakes() -> None:
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_mistake_is_one_sentence_naming_it(box: Box, case: Case) -> None:
    code, out, err = run(case.argv(box), env=case.env(box) if case.env else None)
    assert "Traceback" not in out + err, err
    assert code != 0, (out, err)
    text = out if case.report else err
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, (out, err)
    if not case.report:  # the last line is the one sentence: `<prog>: error: <what>: <fix>`
        assert re.match(
            r"^(edgeserve|edgeserve-profile|demo|python -m edgeserve.demo)[ a-z-]*: error: ", lines[-1]
        ), err
    for fragment in case.names(box):
        assert fragment in text, f"{fragment!r} not in: {text}"
    if case.fix is not None:
        assert case.fix(box, err), f"the suggested fix did not get past: {err}"


def test_debug_shows_the_traceback(box: Box) -> None:
    argv = [
        "edgeserve",
        "send",
        "--target",
        f"unix://{box.tmp}/absent.sock",
        "--model",
        "m",
        "--synthetic",
        "1",
    ]
    _, _, err = run(argv, env={"EDGESERVE_DEBUG": "1"})
    assert "Traceback" in err
    _, _, err = run(["edgeserve", "--debug", *argv[1:]])
    assert "Traceback" in err


def test_an_unknown_bug_is_one_line_asking_for_a_report(capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> int:
        raise RuntimeError("boom")

    assert guarded("edgeserve", broken) == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error (RuntimeError: boom)" in err and "--debug" in err


def test_profile_force_plot_without_matplotlib_keeps_the_stored_profile(box: Box) -> None:
    profiles = sorted((box.repository / "tiny_a" / "profiles").glob("*-t1-*.json"))
    assert profiles
    before = [p.stat().st_mtime_ns for p in profiles]
    argv = ["edgeserve-profile", "--model", "tiny_a", "--repository", str(box.repository), "--threads", "1"]
    code, _, err = run([*argv, "--force", "--plot", str(box.tmp / "p.png")], env=_no_plot(box))
    assert code == 1 and "--plot needs matplotlib" in err and "Traceback" not in err
    assert [p.stat().st_mtime_ns for p in profiles] == before


def test_send_keeps_the_servers_window(box: Box) -> None:
    """The live server allows 8 in flight per connection; 100 frames at once are all answered ok."""
    code, out, err = run(
        ["edgeserve", "send", "--target", box.target, "--model", "tiny_a", "--synthetic", "100"]
    )
    assert code == 0, err
    assert out.count(" ok ") == 100 and "rejected" not in out


def test_send_npy_converts_float64_with_a_note(box: Box) -> None:
    path = box.tmp / "f64.npy"
    np.save(path, np.zeros((2, 1, 8, 8), dtype=np.float64))
    code, out, err = run(
        ["edgeserve", "send", "--target", box.target, "--model", "tiny_a", "--npy", str(path)]
    )
    assert code == 0, err
    assert "converting float64 to the model's float32" in err and out.count(" ok ") == 2


@pytest.mark.parametrize("source", ["systemd/config.toml", "docs/runtime.md"])
def test_the_shipped_preprocess_examples_fit_the_demo_models(source: str, tmp_path: Path) -> None:
    text = (REPO / source).read_text()
    if source.endswith(".md"):
        text = re.findall(r"```toml\n(.*?)```", text, flags=re.S)[0]
    (tmp_path / "c.toml").write_text(text)
    config = ServerConfig.from_toml(tmp_path / "c.toml")
    with_preprocess = {n: m for n, m in config.models.items() if m.preprocess is not None}
    assert with_preprocess, source
    for name, model in with_preprocess.items():
        assert name.startswith("digits-")
        assert preprocess_problem(name, model.preprocess, DIGITS_INPUT_SHAPE) is None


# --- issue 65: a second newcomer pass --------------------------------------------------------------


def test_send_synthetic_streams_in_constant_memory(box: Box) -> None:
    """`send --synthetic 100000000` once built every input first (MemoryError after 35 s): now each
    input is made when a slot in the server's window frees, answers print at once, memory stays flat."""
    argv = ["send", "--target", box.target, "--model", "tiny_a", "--synthetic", "100000000"]
    process = subprocess.Popen(
        [*PROGRAMS["edgeserve"], *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "EDGESERVE_DEBUG": ""},
        cwd=REPO,
    )
    try:
        assert process.stdout is not None
        answered, rss_kb = 0, []
        for line in process.stdout:
            answered += " ok " in line
            if answered in (200, 2000) and len(rss_kb) == (answered == 2000):
                status = Path(f"/proc/{process.pid}/status").read_text()
                rss_kb.append(int(re.search(r"VmRSS:\s+(\d+)", status)[1]))
            if answered >= 2000:
                break
    finally:
        process.kill()
        process.communicate(timeout=30)
    assert answered >= 2000
    assert rss_kb[-1] < 400_000 and rss_kb[-1] - rss_kb[0] < 50_000, rss_kb  # flat, far from 100 GB


def test_send_out_and_full_show_the_output_values(box: Box) -> None:
    base = ["edgeserve", "send", "--target", box.target, "--model", "tiny_a", "--synthetic", "3"]
    code, out, err = run([*base, "--full"])
    assert code == 0 and "Traceback" not in err, err
    assert out.count(" ok ") == 3 and len(re.findall(r"^  \S+ = \[", out, flags=re.M)) == 3, out
    code, _, err = run([*base, "--out", str(box.tmp / "answers.npz")])
    assert code == 0 and f"wrote the outputs of 3 answers to {box.tmp / 'answers.npz'}" in err, err
    with np.load(box.tmp / "answers.npz") as saved:
        assert sorted(saved.files) == ["r0", "r1", "r2"] and saved["r0"].dtype == np.float32
        first = saved["r0"]
    code, _, err = run([*base, "--out", str(box.tmp / "answers.jsonl")])
    assert code == 0, err
    records = [json.loads(line) for line in (box.tmp / "answers.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok"] * 3
    (values,) = records[0]["outputs"].values()
    np.testing.assert_allclose(np.asarray(values, dtype=np.float32), first, atol=1e-6)


def test_an_expired_answer_from_an_idle_server_does_not_blame_overload(box: Box) -> None:
    """A deadline shorter than reading a request takes: `expired`, saying the server is not busy."""
    argv = ["edgeserve", "send", "--target", box.target, "--model", "tiny_a", "--synthetic", "1"]
    code, out, err = run([*argv, "--deadline-ms", "0.001"])
    assert code == 1 and "Traceback" not in out + err, err
    assert " expired " in out and "past its 0.001 ms deadline" in out, out
    assert "the server is not busy" in out and "give a longer deadline_ms or slo_ms" in out, out
    assert "overloaded" not in out


DEMO_DRIVER = """
import sys
from pathlib import Path
import edgeserve.tools.demo as demo
child = (
    "import signal, sys, time; signal.signal(signal.SIGINT, lambda *a: sys.exit(130)); "
    "print('child up', flush=True); time.sleep(60)"
)
step = demo.Step("a step that takes a while", [sys.executable, "-c", child])
demo.steps = lambda repository, plot, force: [step]
sys.exit(demo.main(["--plot", sys.argv[1]]))
"""


@pytest.mark.parametrize("whom", ["the process group (Ctrl-C)", "the step alone"])
def test_ctrl_c_during_the_demo_ends_as_interrupted(box: Box, whom: str) -> None:
    """Ctrl-C in `make demo` once ended as "serving failed, exit 1": now `interrupted`, exit 130."""
    import signal
    import time

    process = subprocess.Popen(
        [sys.executable, "-c", DEMO_DRIVER, str(box.tmp / "demo-out" / "p.png")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "EDGESERVE_DEBUG": "", "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    assert process.stdout is not None
    for line in process.stdout:
        if "child up" in line:
            break
    time.sleep(0.2)
    if whom == "the step alone":
        child = subprocess.run(
            ["pgrep", "-P", str(process.pid)], capture_output=True, text=True
        ).stdout.split()
        assert child, "the step's process is not there"
        os.kill(int(child[0]), signal.SIGINT)
    else:
        os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert "Traceback" not in out + err, err
    assert process.returncode == 130, (process.returncode, err)
    assert err.strip().splitlines()[-1] == "demo: interrupted", err
    assert "failed with exit code" not in err


def test_a_camera_set_up_error_is_its_sentence_alone_without_an_all_zero_summary(box: Box) -> None:
    argv = ["edgeserve", "camera", "--target", box.target, "--model", "tiny_x", "--source", "/dev/video97"]
    code, _, err = run([*argv, "--stats-every", "0"])
    assert code == 1 and "Traceback" not in err, err
    assert (
        err.strip().splitlines()[-1]
        == "edgeserve: error: cam0: the server does not serve 'tiny_x'; it serves tiny_a"
    )
    assert "final summary" not in err, err


def test_the_readme_says_where_the_commands_are_and_how_long_make_test_takes() -> None:
    """The README's commands are bare `edgeserve ...`: it says they live in .venv and how to reach
    them, and it gives `make test` a duration as it gives `make demo` one."""
    readme = (REPO / "README.md").read_text()
    two_commands = readme.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    assert ". .venv/bin/activate" in two_commands and ".venv/bin/edgeserve" in two_commands
    assert re.search(r"make test .*\(~\d+ min", two_commands), two_commands
