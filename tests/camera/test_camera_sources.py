"""Source URIs: one scheme for V4L2, CSI, GStreamer, network streams and files."""

from __future__ import annotations

import pytest

from edgeserve.camera.cli import split_name
from edgeserve.camera.grabber import Backoff
from edgeserve.camera.sources import SourceError, parse_source


@pytest.mark.parametrize(
    ("uri", "kind", "location", "options"),
    [
        ("/dev/video0", "v4l2", "/dev/video0", {}),
        (
            "v4l2:///dev/video2?video_size=1280x720&input_format=mjpeg",
            "v4l2",
            "/dev/video2",
            {"video_size": "1280x720", "input_format": "mjpeg"},
        ),
        (
            "rtsp://u:p@cam.local:554/s1?rtsp_transport=udp",
            "stream",
            "rtsp://u:p@cam.local:554/s1",
            {"rtsp_transport": "udp"},
        ),
        (
            "http://cam/video.mjpg?resolution=720&format=mpjpeg",
            "stream",
            "http://cam/video.mjpg?resolution=720",
            {"format": "mpjpeg"},
        ),
        ("tcp://127.0.0.1:5000", "stream", "tcp://127.0.0.1:5000", {}),
        ("clip.mp4", "file", "clip.mp4", {}),
        ("file:///videos/a%20b.mkv", "file", "/videos/a%20b.mkv", {}),
    ],
)
def test_uris_name_their_kind_location_and_ffmpeg_options(uri, kind, location, options) -> None:  # type: ignore[no-untyped-def]
    spec = parse_source(uri)
    assert (spec.kind, spec.location, spec.options) == (kind, location, options)
    assert spec.live == (kind != "file")


def test_csi_is_the_documented_argus_pipeline_and_gst_passes_through() -> None:
    spec = parse_source("csi://1?width=1920&height=1080&framerate=30")
    assert spec.kind == "csi"
    assert spec.location.startswith(
        "nvarguscamerasrc sensor-id=1 ! video/x-raw(memory:NVMM),width=1920,height=1080"
    )
    assert spec.location.endswith("appsink drop=true max-buffers=1 sync=false")
    gst = parse_source("gst://videotestsrc ! videoconvert ! appsink")
    assert (gst.kind, gst.location) == ("gstreamer", "videotestsrc ! videoconvert ! appsink")


def test_unknown_schemes_fail_with_one_sentence() -> None:
    with pytest.raises(SourceError, match="unknown source scheme 'ftp'") as info:
        parse_source("ftp://host/clip.mp4")
    assert info.value.fatal
    with pytest.raises(SourceError, match="csi://SENSOR_ID"):
        parse_source("csi://left")


def test_names_and_backoff() -> None:
    assert split_name("door=rtsp://h/s?a=b", 0) == ("door", "rtsp://h/s?a=b")
    assert split_name("rtsp://h/s?a=b", 3) == ("cam3", "rtsp://h/s?a=b")
    backoff = Backoff(first_s=0.5, max_s=2.0)
    assert [backoff.next() for _ in range(4)] == [0.5, 1.0, 2.0, 2.0]
    backoff.reset()
    assert backoff.next() == 0.5
