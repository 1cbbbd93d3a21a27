"""`edgeserve camera`: cameras, streams and files to a running server, newest frame first.

    sources.py   URI -> a frame source (PyAV; OpenCV+GStreamer for Jetson CSI)
    grabber.py   a source's thread: decode, pace, reconnect with backoff
    stream.py    one camera: latest-frame sending within the server's window, server reconnects
    fit.py       start-up checks of the frames against the model's preprocess table
    output.py    JSON lines and per-stream counters (P50/P99 age in constant memory)
    runner.py    several streams, periodic summaries, clean stop on SIGINT/SIGTERM
    cli.py       the argparse front

A client of the socket protocol: it imports wire/, config/ and net/preprocess, never the runtime.
"""
