"""Real video through `edgeserve camera` to a real server: answers checked against true labels.

The clip is scikit-learn digits rendered into 64x64 frames and encoded with PyAV (H.264 in a file
and over TCP, JPEG over HTTP as an MJPEG camera sends it); the server runs digits-s exported for
real, preprocessing the raw frames per its [preprocess] table.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from camera_support import (
    Clip,
    MjpegHttpServer,
    StreamsThread,
    TcpStreamServer,
    serve_config,
    wait_for,
    write_clip,
)
from net_support import server_thread

from edgeserve.camera.grabber import Backoff, GrabberSettings
from edgeserve.camera.sources import open_source, parse_source
from edgeserve.camera.stream import CameraStream, StreamConfig
from edgeserve.cli import main as cli_main


def correct(records: list[dict[str, Any]], clip: Clip, skipped: int = 0) -> tuple[int, int]:
    """(answers naming the frame's digit, ok answers); `skipped`: frames the demuxer ate first."""
    ok = [r for r in records if r["status"] == "ok"]
    return sum(r["class"] == clip.label_at(r["pos"] + skipped) for r in ok), len(ok)


def test_a_video_file_is_played_and_every_frame_answered_with_its_digit(
    digits_root: Path, clip: Clip, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    video = write_clip(tmp_path / "digits.mp4", clip)
    out = tmp_path / "answers.jsonl"
    with server_thread(serve_config(digits_root, tmp_path)) as srv:
        argv = ["camera", "--source", str(video), "--model", "digits-s", "--target", srv.unix_url]
        assert cli_main([*argv, "--out", str(out), "--stats-every", "1", "--full"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    good, ok = correct(records, clip)
    assert ok >= 0.9 * len(clip.labels), f"{ok} of {len(clip.labels)} frames answered ok"
    assert good >= 0.9 * ok, f"{good} of {ok} answers are the frame's digit"
    first = records[0]
    assert {"source", "frame", "pos", "capture_ts", "answer_ts", "age_ms", "status", "exit", "class"} <= set(
        first
    )
    assert first["answer_ts"] >= first["capture_ts"] and len(first["output"]) == 10
    err = capsys.readouterr().err
    assert "event=summary source=cam0 fps_in=" in err
    assert 'event="final summary" source=cam0 frames_in=75' in err


def test_an_mjpeg_http_camera_is_answered_live(digits_root: Path, clip: Clip, tmp_path: Path) -> None:
    records: list[dict[str, Any]] = []
    with MjpegHttpServer(clip) as camera, server_thread(serve_config(digits_root, tmp_path)) as srv:
        source = open_source(parse_source(camera.url + "?format=mpjpeg"))
        stream = CameraStream(StreamConfig("door", "digits-s", srv.tcp_url), source, records.append)
        with StreamsThread([stream]):
            wait_for(lambda: len(records) >= 40)
    # FFmpeg's mpjpeg demuxer consumes the first part of the stream while probing it.
    good, ok = max(correct(records, clip), correct(records, clip, skipped=1))
    assert ok >= 40 and good >= 0.9 * ok, f"{good} of {ok} answers are the frame's digit"
    assert stream.stats.frames_in >= ok and stream.stats.lost == 0


def test_a_tcp_stream_that_goes_away_is_reopened_and_logged_once_per_episode(
    digits_root: Path, clip: Clip, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edgeserve.camera")
    records: list[dict[str, Any]] = []
    camera = TcpStreamServer(clip, frames_per_connection=20)
    with camera, server_thread(serve_config(digits_root, tmp_path)) as srv:
        source = open_source(parse_source(camera.url))
        settings = GrabberSettings(backoff=Backoff(first_s=0.2, max_s=0.5))
        stream = CameraStream(
            StreamConfig("yard", "digits-s", srv.unix_url), source, records.append, settings
        )
        with StreamsThread([stream]):
            wait_for(lambda: camera.connections >= 3 and len(records) >= 40, timeout=30)
    lost = [r for r in caplog.records if r.getMessage().startswith("source lost")]
    back = [r for r in caplog.records if r.getMessage() == "source back"]
    assert len(back) >= 2 and len(lost) in (len(back), len(back) + 1)  # one line per episode
    assert all("Traceback" not in r.getMessage() for r in caplog.records)
    good, ok = correct(records, clip)
    assert good >= 0.85 * ok and ok >= 40
    assert max(r["frame"] for r in records) > max(r["pos"] for r in records)  # frames counted across episodes


def test_the_embedding_example_prints_one_line_per_frame(
    digits_root: Path, clip: Clip, tmp_path: Path
) -> None:
    import subprocess
    import sys

    from repo_paths import REPO

    video = write_clip(tmp_path / "digits.mp4", clip)
    with server_thread(serve_config(digits_root, tmp_path)) as srv:
        argv = [sys.executable, str(REPO / "examples" / "camera_embed.py"), "--target", srv.tcp_url]
        done = subprocess.run(
            [*argv, "--model", "digits-s", "--source", str(video)], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum(" ok " in line and "after capture" in line for line in lines) >= 0.9 * len(clip.labels)
    assert lines[-1].startswith("answers by status: {'ok': ")
