"""sd_notify: the datagrams systemd would receive, from the real server and the real loop."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import threading
import time
from pathlib import Path

from runtime_support import profiled_tiny_repository
from service_support import NotifyListener, serve_process, write_serve_config

from edgeserve.service.sd_notify import LoadStatus, Notifier, notify, notify_socket, watchdog_interval


def test_notify_is_a_no_op_without_notify_socket() -> None:
    assert notify_socket({}) is None
    assert notify("READY=1", env={}) is False


def test_notify_reaches_an_abstract_socket(tmp_path: Path) -> None:
    name = f"edgeserve-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    try:
        assert notify("READY=1", "STATUS=up", env={"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(1024) == b"READY=1\nSTATUS=up"
    finally:
        sock.close()


def test_watchdog_interval_reads_usec_and_respects_watchdog_pid() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "400000", "WATCHDOG_PID": str(os.getpid())}) == 0.4
    assert watchdog_interval({"WATCHDOG_USEC": "400000", "WATCHDOG_PID": "1"}, pid=2) is None
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "zero"}) is None


def test_a_blocked_event_loop_stops_petting_the_watchdog(tmp_path: Path) -> None:
    listener = NotifyListener(tmp_path / "notify.sock")
    reader = threading.Thread(target=listener.receive_all, args=(2.5,), daemon=True)
    reader.start()
    hang: list[float] = []

    async def main() -> None:
        notifier = Notifier(notify_socket({"NOTIFY_SOCKET": str(listener.path)}), 0.1, lambda: "testing")
        notifier.start()
        await asyncio.sleep(0.3)
        hang.append(time.monotonic())
        time.sleep(0.6)  # the loop hangs: no callback can run
        hang.append(time.monotonic())
        await asyncio.sleep(0.3)
        notifier.stop()

    asyncio.run(main())
    reader.join()
    listener.close()
    pets = [t for t, fields in listener.messages if fields.get("WATCHDOG") == "1"]
    assert len(pets) >= 5, listener.messages  # every 0.05 s while the loop runs (~12)
    during = [t for t in pets if hang[0] + 0.01 < t < hang[1] - 0.01]
    assert not during, "a hung loop must not pet the watchdog"
    assert max(b - a for a, b in itertools.pairwise(pets)) >= 0.55


def test_load_status_reports_queue_rate_violations_and_utilisation() -> None:
    snapshots = iter(
        [
            {
                "requests": {"a": {"ok": 10}},
                "queue_depth": {"a": 3},
                "violations": {"a": 1},
                "utilisation": 0.25,
            },
            {"requests": {"a": {"ok": 30, "expired": 2}}, "queue_depth": {"a": 0}, "utilisation": 0.5},
        ]
    )
    status = LoadStatus(lambda: next(snapshots))
    first = status()
    assert first.startswith(
        "serving: 3 queued, 0.0 req/s, 10 answered, 1 deadline violations, executor 25% busy"
    )
    time.sleep(0.05)
    second = status()
    rate = float(second.split(", ")[1].split()[0])
    assert 22 / 0.5 < rate < 22 / 0.04 and "32 answered" in second


def test_serve_under_systemd_sends_ready_after_listening_then_watchdog_status_and_stopping(
    tmp_path: Path,
) -> None:
    repository = tmp_path / "engines"
    profiled_tiny_repository(repository)
    sock = tmp_path / "serve.sock"
    config = tmp_path / "serve.toml"
    write_serve_config(config, repository, sock)
    listener = NotifyListener(tmp_path / "notify.sock")
    env = {"NOTIFY_SOCKET": str(listener.path), "WATCHDOG_USEC": "400000"}
    try:
        with serve_process(config, env) as server:
            ready = listener.wait_for("READY", "1")
            # READY=1 means serving: the socket accepts a connection at once.
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.connect(str(sock))
            probe.close()
            assert ready["STATUS"].startswith("serving:")
            assert not [m for _, m in listener.messages[:-1] if "READY" in m]
            ready_at = listener.messages[-1][0]
            listener.receive_all(1.2)
            pets = [t for t, m in listener.messages if m.get("WATCHDOG") == "1" and t >= ready_at]
            assert len(pets) >= 4, listener.messages  # every 0.2 s (half of WATCHDOG_USEC)
            assert any("STATUS" in m and "READY" not in m for _, m in listener.messages)
            server.wait_ready()
            server.process.send_signal(signal.SIGTERM)
            stopping = listener.wait_for("STOPPING", "1", timeout=30)
            assert stopping["STATUS"].startswith("stopping")
            code, err = server.finish()
        assert code == 0, err
        assert "event=listening" in err and "event=stopped" in err
    finally:
        listener.close()
