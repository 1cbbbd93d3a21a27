"""Latest-frame semantics, server loss, start-up checks and a clean exit, on a real server."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from camera_support import Clip, MjpegHttpServer, StreamsThread, serve_config, wait_for
from net_support import server_thread
from runtime_support import HookedFactory

from edgeserve.camera.fit import CameraSetupError
from edgeserve.camera.grabber import Backoff
from edgeserve.camera.sources import ArraySource
from edgeserve.camera.stream import CameraStream, StreamConfig
from edgeserve.cli import main as cli_main
from edgeserve.loop import run


def test_a_camera_faster_than_the_server_drops_stale_frames_at_the_source(
    digits_root: Path, clip: Clip, tmp_path: Path
) -> None:
    records: list[dict[str, Any]] = []
    slow = HookedFactory(delay_s=0.05)  # ~20 batches/s of at most `window` frames
    with server_thread(serve_config(digits_root, tmp_path), backend_factory=slow) as srv:
        stream = CameraStream(
            StreamConfig("fast", "digits-s", srv.unix_url, window=1),
            ArraySource(clip.frames, fps=100),
            records.append,
        )
        with StreamsThread([stream]):
            time.sleep(2.5)
    stats = stream.stats
    assert stats.dropped > stats.sent > 20  # most frames never left the camera
    assert stats.frames_in == stats.dropped + stats.sent  # every frame sent or counted as dropped
    assert stats.sent == len(records) and stats.answered["ok"] == len(records)
    ages = sorted(r["age_ms"] for r in records)
    assert ages[-1] < 500, f"the oldest answer was {ages[-1]} ms old: frames queued somewhere"
    assert len({r["frame"] for r in records}) == len(records)


def test_the_server_absent_at_start_then_gone_then_back_is_retried_and_logged_once_each(
    digits_root: Path, clip: Clip, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="edgeserve.camera")
    config = serve_config(digits_root, tmp_path)
    target = f"unix://{config['listen']['unix']}"
    records: list[dict[str, Any]] = []
    stream = CameraStream(
        StreamConfig("cam", "digits-s", target),
        ArraySource(clip.frames, fps=50),
        records.append,
        server_backoff=Backoff(first_s=0.1, max_s=0.3),
    )
    with StreamsThread([stream]):
        time.sleep(1.0)  # no server yet: retried quietly
        with server_thread(config):
            wait_for(lambda: len(records) >= 10)
        answered = len(records)
        time.sleep(1.0)  # the server is gone again
        with server_thread(config):
            wait_for(lambda: len(records) >= answered + 10)
    messages = [
        r.getMessage() for r in caplog.records if r.name == "edgeserve.camera" and "server" in r.getMessage()
    ]
    assert messages[:4] == [  # one line when an episode starts, one when it ends
        "server unreachable; retrying with backoff",
        "server back",
        "server connection lost; reconnecting with backoff",
        "server back",
    ]
    assert len(messages) <= 5  # the second server's leaving, if noticed before the stop
    assert stream.stats.dropped > 50  # frames while no server: dropped at the source, not queued


def test_frames_that_do_not_fit_the_model_fail_at_start_up_with_one_sentence(
    digits_root: Path, clip: Clip, tmp_path: Path
) -> None:
    config = serve_config(digits_root, tmp_path)
    tiny = np.zeros((4, 12, 12, 3), dtype=np.uint8)  # smaller than digits-s's 16x16 input

    async def start(frames: np.ndarray, model: str, target: str) -> None:
        stream = CameraStream(StreamConfig("cam", model, target), ArraySource(frames, fps=20), lambda r: None)
        await stream.run()

    with server_thread(config) as srv:
        with pytest.raises(CameraSetupError) as small:
            run(start(tiny, "digits-s", srv.unix_url))
        with pytest.raises(CameraSetupError) as unknown:
            run(start(clip.frames, "digits-x", srv.unix_url))
    raw_config = serve_config(digits_root, tmp_path, preprocess=False)
    with server_thread(raw_config) as srv, pytest.raises(CameraSetupError) as raw:
        run(start(clip.frames, "digits-s", srv.unix_url))
    assert str(small.value) == (
        "cam: frames are 12x12, smaller than 'digits-s''s 16x16 input; "
        "the server would upscale them: use a larger capture size"
    )
    assert "does not serve 'digits-x'; it serves digits-s" in str(unknown.value)
    assert "add a [models.digits-s.preprocess] table" in str(raw.value)


def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["camera", "--model", "m", "--target", "unix:///nowhere.sock", "--stats-every", "0"]
    assert cli_main([*argv, "--source", str(tmp_path / "missing.mp4")]) == 1
    assert capsys.readouterr().err.strip().endswith("missing.mp4: no such video file")
    assert cli_main([*argv, "--source", "ftp://host/x"]) == 1
    assert "unknown source scheme 'ftp'" in capsys.readouterr().err


def test_sigterm_stops_several_cameras_cleanly_with_a_final_summary(
    digits_root: Path, clip: Clip, tmp_path: Path
) -> None:
    """A live camera and a missing device in one process: separate stats, no traceback, exit 0."""
    with MjpegHttpServer(clip) as camera, server_thread(serve_config(digits_root, tmp_path)) as srv:
        argv = [
            sys.executable,
            "-m",
            "edgeserve.cli",
            "camera",
            "--target",
            srv.unix_url,
            "--model",
            "digits-s",
        ]
        argv += ["--source", f"door={camera.url}", "--source", "/dev/video97", "--stats-every", "0.5"]
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3.0)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "Traceback" not in err and "Task was destroyed" not in err and "Exception ignored" not in err
    assert err.count('event="source lost; retrying with backoff" source=cam1') == 1
    assert "/dev/video97: no such device" in err
    assert 'event="final summary" source=door' in err and 'event="final summary" source=cam1' in err
    assert "event=summary source=door fps_in=" in err
    answers = out.splitlines()
    assert len(answers) >= 10 and all('"source":"door"' in line for line in answers)
