"""`edgeserve install-service`: --dry-run changes nothing; --root writes the unit and the config."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from edgeserve.cli import main as cli_main
from edgeserve.config.server import ServerConfig
from edgeserve.service.install import CONFIG_PATH, UNIT_PATH


def _tree(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*"))


def test_dry_run_prints_every_step_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "marker").touch()
    model = tmp_path / "var/lib/edgeserve/engines/digits-m"
    model.mkdir(parents=True)
    (model / "manifest.json").write_text("{}")  # a repository with a model: the service is started
    before = _tree(tmp_path)
    assert cli_main(["install-service", "--dry-run", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert _tree(tmp_path) == before
    assert out.startswith("dry run: nothing is changed")
    assert f"write {tmp_path}/etc/systemd/system/edgeserve.service" in out
    assert f"write {tmp_path}/etc/edgeserve/config.toml" in out
    assert "    | Type=notify" in out and "    | [logging]" in out  # the files' contents
    executable = Path(sys.executable).parent / "edgeserve"
    assert f"    | ExecStart={executable} serve --config /etc/edgeserve/config.toml" in out
    assert "useradd --system --no-create-home" in out and "systemctl enable --now edgeserve" in out
    assert "skipped under --root" in out


def test_an_empty_repository_is_not_started_and_tmp_paths_warn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    executable = Path("/tmp/venv/bin/edgeserve")
    assert (
        cli_main(["install-service", "--dry-run", "--root", str(tmp_path), "--executable", str(executable)])
        == 0
    )
    out = capsys.readouterr().out
    assert "not starting the service" in out and "edgeserve export --demo --repository" in out
    assert "--now" not in out
    assert f"{executable} is under /tmp, which PrivateTmp=yes" in out


def test_dry_run_on_the_real_system_lists_useradd_and_systemctl_as_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main(["install-service", "--dry-run", "--no-start"]) == 0
    out = capsys.readouterr().out
    assert f"write {UNIT_PATH}" in out
    assert "run   systemctl daemon-reload" in out
    assert "run   systemctl enable edgeserve" in out and "--now" not in out
    assert not UNIT_PATH.exists() or "edgeserve" in UNIT_PATH.read_text()  # nothing written by us


def test_root_writes_the_unit_and_config_and_never_overwrites_a_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "bin" / "edgeserve"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert cli_main(["install-service", "--root", str(tmp_path), "--executable", str(fake)]) == 0
    unit = tmp_path / UNIT_PATH.relative_to("/")
    config = tmp_path / CONFIG_PATH.relative_to("/")
    assert f"ExecStart={fake} serve --config /etc/edgeserve/config.toml" in unit.read_text()
    assert ServerConfig.from_toml(config).listen.unix == Path("/run/edgeserve/edgeserve.sock")
    assert (config.stat().st_mode & 0o777) == 0o640
    assert "skipped under --root" in capsys.readouterr().out

    config.write_text("# mine\n")
    assert cli_main(["install-service", "--root", str(tmp_path), "--executable", str(fake)]) == 0
    assert config.read_text() == "# mine\n"
    assert f"keep the existing {config}" in capsys.readouterr().out


def test_without_root_and_without_dry_run_it_refuses_with_the_ways_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # as an ordinary user would be
    assert cli_main(["install-service"]) == 1
    err = capsys.readouterr().err
    assert "run it as root (sudo edgeserve install-service)" in err and "--dry-run" in err
