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
    Case("serve: no listener", _serve("nolisten", listen=""), lambda b: ["no listener configured"]),
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
        lambda b: ["models.tiny_a.preprocess.mean", "1 channel"],
    ),
    Case(
        "serve: threads differ from the profile's",
        lambda b: ["edgeserve", "serve", "--config", str(_threads(b))],
        lambda b: ["--threads 2", "--backend onnxruntime"],
        fix=_fix_threads,
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


def _threads(box: Box) -> Path:
    path = box.config("threads", "")
    path.write_text(path.read_text().replace("threads = 1", "threads = 2"))
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
