"""The package's shape: import names stay under edgeserve, and serving never pulls in torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from repo_paths import REPO

SERVING_MODULES = [
    "edgeserve",
    "edgeserve.cli",
    "edgeserve.repository",
    "edgeserve.runtime.backends.onnxruntime",
    "edgeserve.runtime.backends.select",
    "edgeserve.profiler.cli",
    "edgeserve.profiler.measure",
    "edgeserve.scheduler",
    "edgeserve.scheduler.cli",
    "edgeserve.export.cli",
    "edgeserve.service.process",
    "edgeserve.wire.client",
    "edgeserve.tools.bench",
    "edgeserve.tools.send_cli",
    "edgeserve.oip.frontend",
    "edgeserve.wire.oip_client",
    "edgeserve.metrics.endpoint",
    "edgeserve.runtime.offload.offloader",
    "edgeserve.service.doctor",
    "edgeserve.service.install",
]
# prometheus_client is a serving dependency since the metrics endpoint's exposition is its own (issue 64).
TEST_ONLY = ("torch", "onnxscript", "tritonclient", "mlserver", "gevent", "lightgbm")


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_serving_modules_and_the_command_group_import_neither_torch_nor_test_only_peers(
    tmp_path: Path,
) -> None:
    code = (
        "import importlib, json, sys\n"
        f"for name in {SERVING_MODULES!r}: importlib.import_module(name)\n"
        "from edgeserve.cli import build_parser\n"
        "build_parser()\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {TEST_ONLY!r})))\n"
    )
    done = _python(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_export_and_profiler_install_under_edgeserve_not_as_top_level_packages(tmp_path: Path) -> None:
    done = _python(
        "import importlib.util as u, edgeserve.export, edgeserve.profiler\n"
        "print(u.find_spec('export') is None, u.find_spec('profiler') is None)",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


def test_console_scripts_answer_help() -> None:
    bindir = Path(sys.executable).parent
    for script in (
        ["edgeserve", "--help"],
        ["edgeserve-profile", "--help"],
        ["edgeserve", "export", "--help"],
    ):
        done = subprocess.run(
            [str(bindir / script[0]), *script[1:]], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert "usage:" in done.stdout


def test_the_wheel_ships_weights_and_the_systemd_templates_under_edgeserve(tmp_path: Path) -> None:
    import shutil
    import zipfile

    root = REPO
    source = tmp_path / "src"  # a copy: building in place would write build/ into the checkout
    source.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    for name in ("edgeserve", "export", "profiler", "systemd"):
        shutil.copytree(root / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("edgeserve-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"edgeserve/systemd/edgeserve.service", "edgeserve/systemd/config.toml"} <= names
    assert {f"edgeserve/export/weights/digits-{s}.npz" for s in "sml"} <= names
    assert not [n for n in names if n.split("/")[0] in ("export", "profiler", "systemd", "tests")]
