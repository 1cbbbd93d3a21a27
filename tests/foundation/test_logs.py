"""Structured logging: one logfmt/JSON line per event, journald priority prefixes."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeserve import logs

LOGFMT_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def parse_logfmt(line: str) -> dict[str, str]:
    """A strict logfmt parser: the whole line must be key=value pairs."""
    pairs = LOGFMT_PAIR.findall(line)
    assert " ".join(f"{k}={v}" for k, v in pairs) == line, f"not logfmt: {line!r}"
    return {k: shlex.split(v)[0] if v.startswith('"') else v for k, v in pairs}


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Path]:
    """A real file as the log stream; the root logger is restored afterwards."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield tmp_path / "log.txt"
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def _emit(path: Path, fmt: str, env: dict[str, str] | None = None, level: str = "info") -> list[str]:
    with path.open("w") as stream:
        handler = logs.configure(level, fmt, stream, env=env if env is not None else {})
        log = logging.getLogger("edgeserve.test")
        log.debug("hidden at info")
        log.info("listening", extra={"url": "unix:///run/edgeserve/edgeserve.sock", "n": 3})
        log.warning('odd "value"\nsecond line', extra={"path": "/tmp/a b"})
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
        handler.flush()
        logging.getLogger().removeHandler(handler)
    return path.read_text().splitlines()


def test_logfmt_is_one_parseable_line_per_event_with_extra_fields(log_file: Path) -> None:
    lines = _emit(log_file, "logfmt")
    assert len(lines) == 3  # debug filtered; the newline and the traceback stay on their lines
    first, second, third = (parse_logfmt(line) for line in lines)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["ts"])
    assert first["level"] == "info" and first["logger"] == "edgeserve.test" and first["event"] == "listening"
    assert first["url"] == "unix:///run/edgeserve/edgeserve.sock" and first["n"] == "3"
    assert second["level"] == "warning" and second["path"] == "/tmp/a b"
    assert 'odd \\"value\\"\\nsecond line' in lines[1]
    assert third["level"] == "error" and "ValueError: boom" in third["exc"]


def test_json_lines_carry_the_same_fields(log_file: Path) -> None:
    records = [json.loads(line) for line in _emit(log_file, "json")]
    assert [r["event"] for r in records] == ["listening", 'odd "value"\nsecond line', "failed"]
    assert records[0]["url"].startswith("unix://") and records[0]["n"] == 3
    assert "Traceback" in records[2]["exc"]


def test_under_journald_lines_have_a_priority_prefix_and_no_timestamp(log_file: Path) -> None:
    log_file.touch()
    st = os.stat(log_file)
    env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    lines = _emit(log_file, "auto", env=env)
    assert [line[:3] for line in lines] == ["<6>", "<4>", "<3>"]
    assert all("ts=" not in line for line in lines)
    assert parse_logfmt(lines[0][3:])["event"] == "listening"


def test_journal_stream_of_another_file_is_not_journald(log_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.touch()
    st = os.stat(other)
    lines = _emit(log_file, "auto", env={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    assert lines[0].startswith("ts=")


def test_debug_level_from_config_shows_debug_events(log_file: Path) -> None:
    lines = _emit(log_file, "logfmt", level="debug")
    assert parse_logfmt(lines[0])["event"] == "hidden at info"
