"""`edgeserve install-service`: --dry-run changes nothing; --root writes the unit and the config."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgeserve.cli import main as cli_main
from edgeserve.config.server import ServerConfig
from edgeserve.service.install import CONFIG_PATH, UNIT_PATH, InstallError, Step, execute, systemd_is_pid1


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


# --- issue 65: every prerequisite checked before anything is written; a failed step rolls back -----

REPO = Path(__file__).resolve().parents[2]


def _edgeserve(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeserve.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "EDGESERVE_DEBUG": ""},
    )


def _one_sentence(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("edgeserve: error: "), done.stderr
    return lines[-1]


@pytest.mark.skipif(os.geteuid() != 0, reason="the checks run after the root check: needs root")
@pytest.mark.skipif(systemd_is_pid1(), reason="systemd runs here: a real install would go ahead")
def test_without_systemd_as_pid1_nothing_is_written_and_the_sentence_says_what_to_do() -> None:
    before = UNIT_PATH.exists(), CONFIG_PATH.parent.exists()
    # An executable outside /tmp, wherever this checkout is (CI may clone it under /tmp, which the
    # unit's PrivateTmp hides: that check would fail first): this test is about systemd's.
    binary = ("--executable", "/bin/true")
    done = _edgeserve("install-service", "--no-start", *binary)
    line = _one_sentence(done)
    assert done.returncode == 1
    assert "nothing was changed: systemd is not running here (PID 1 is" in line
    assert "edgeserve serve --config FILE" in line and "--root DIR" in line
    assert (UNIT_PATH.exists(), CONFIG_PATH.parent.exists()) == before
    dry = _edgeserve("install-service", "--dry-run", "--no-start", *binary)
    assert dry.returncode == 0 and "check FAILED systemd runs as PID 1" in dry.stdout
    assert "a real run would stop here, before writing anything: systemd is not running" in dry.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the checks run after the root check: needs root")
def test_a_missing_binary_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "edgeserve"
    before = UNIT_PATH.exists()
    done = _edgeserve("install-service", "--no-start", "--executable", str(missing))
    line = _one_sentence(done)
    assert done.returncode == 1
    assert f"nothing was changed: {missing} is not an executable file" in line and "--executable" in line
    assert UNIT_PATH.exists() == before
    dry = _edgeserve("install-service", "--dry-run", "--root", str(tmp_path), "--executable", str(missing))
    assert dry.returncode == 0 and f"check FAILED the binary {missing}" in dry.stdout
    assert not (tmp_path / "etc").exists()


def test_a_step_that_fails_after_a_write_rolls_back_what_was_written(tmp_path: Path) -> None:
    """Under --root the config's temporary file cannot be made (a directory is in its way): the unit
    written just before and the directories made for it are removed again."""
    fake = tmp_path / "bin" / "edgeserve"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    root = tmp_path / "image"
    blocker = root / "etc" / "edgeserve" / "config.toml.tmp"
    (blocker / "x").mkdir(parents=True)
    done = _edgeserve("install-service", "--root", str(root), "--executable", str(fake))
    line = _one_sentence(done)
    assert done.returncode == 1
    unit = root / UNIT_PATH.relative_to("/")
    assert f"rolled back: removed {unit}" in line and str(root / "etc/systemd") in line
    assert not (root / "etc" / "systemd").exists() and blocker.is_dir()
    assert f"undo  removed {unit}" in done.stdout


def test_rollback_restores_a_file_that_was_there_and_runs_the_undo_commands(tmp_path: Path) -> None:
    kept = tmp_path / "kept.conf"
    kept.write_text("old\n")
    kept.chmod(0o600)
    marker = tmp_path / "undone"
    steps = [
        Step("a new file", path=tmp_path / "new" / "dir" / "a.conf", content="a\n"),
        Step("an old file", path=kept, content="new\n"),
        Step("a command", command=("true",), undo=("touch", str(marker))),
        Step("a failing command", command=("false",)),
    ]
    with pytest.raises(InstallError) as failed:
        execute(steps, out=io.StringIO())
    assert "`false` failed (1)" in str(failed.value) and "rolled back: touch" in str(failed.value)
    assert kept.read_text() == "old\n" and (kept.stat().st_mode & 0o777) == 0o600
    assert not (tmp_path / "new").exists() and marker.exists()
