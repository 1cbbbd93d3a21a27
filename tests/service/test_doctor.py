"""`edgeserve doctor` on real repositories: passes when all is well, FAILs with the fix otherwise."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
from runtime_support import profiled_tiny_repository
from service_support import write_serve_config

from edgeserve.cli import main as cli_main
from edgeserve.config.server import ServerConfig
from edgeserve.service.doctor_checks import Context, check_memory, check_socket, mem_available


def _doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = cli_main(["doctor", "--json", "--unit", "/nonexistent/edgeserve.service", *args])
    return code, json.loads(capsys.readouterr().out)


def _by_check(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["check"]: f for f in report["findings"]}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("doctor") / "engines"
    profiled_tiny_repository(root)
    return root


def test_doctor_passes_on_a_profiled_repository(
    profiled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "serve.toml"
    write_serve_config(config, profiled, tmp_path / "serve.sock")
    code, report = _doctor(capsys, "--config", str(config))
    checks = _by_check(report)
    assert code == 0 and report["ok"], report
    assert checks["config"]["status"] == "ok" and checks["backend"]["status"] == "ok"
    assert checks["profile tiny_a"]["status"] == "ok"
    assert checks["socket dir"]["status"] == "ok" and checks["memory"]["status"] in ("ok", "warn")
    assert checks["systemd unit"]["status"] == "warn"
    assert checks["systemd unit"]["fix"] == "sudo edgeserve install-service"


def test_doctor_fails_without_a_profile_for_this_device_and_names_the_command(
    profiled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "engines"
    shutil.copytree(profiled, root)
    shutil.rmtree(root / "tiny_a" / "profiles")
    config = tmp_path / "serve.toml"
    write_serve_config(config, root, tmp_path / "serve.sock")
    code, report = _doctor(capsys, "--config", str(config))
    finding = _by_check(report)["profile tiny_a"]
    assert code == 1 and not report["ok"]
    assert finding["status"] == "FAIL" and "no profile of 'tiny_a' for this device" in finding["finding"]
    assert (
        finding["fix"]
        == f"edgeserve-profile --model tiny_a --repository {root} --backend onnxruntime --threads 1"
    )


def test_doctor_fails_on_a_missing_config_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.toml"
    code = cli_main(["doctor", "--config", str(missing)])
    out = capsys.readouterr().out
    assert code == 1
    assert f"FAIL  config             {missing}: no such file" in out
    assert (
        "fix: sudo edgeserve install-service (writes /etc/edgeserve/config.toml), or pass --config FILE"
        in out
    )
    assert "skip  models" in out


def test_doctor_reports_a_socket_whose_mode_differs_from_the_config(
    profiled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sock_path = tmp_path / "serve.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(sock_path))
    sock.listen()
    sock_path.chmod(0o666)
    config = tmp_path / "serve.toml"
    write_serve_config(config, profiled, sock_path)
    try:
        findings = check_socket(Context(config, ServerConfig.from_toml(config)))
    finally:
        sock.close()
    socket_finding = next(f for f in findings if f.check == "socket")
    assert socket_finding.status == "warn"
    assert (
        "mode 0666, config says 0600" in socket_finding.finding
        and "a server is listening" in socket_finding.finding
    )


def test_memory_check_fails_when_the_models_do_not_fit(profiled: Path, tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  1000000 kB\nMemAvailable:  102400 kB\n")
    assert mem_available(meminfo) == 102400 * 1024
    config = tmp_path / "serve.toml"
    write_serve_config(config, profiled, tmp_path / "s.sock")
    ctx = Context(config, ServerConfig.from_toml(config), meminfo_path=meminfo)
    (finding,) = check_memory(ctx)
    assert finding.status == "FAIL" and "100 MiB available" in finding.finding and finding.fix
