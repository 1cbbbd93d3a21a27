"""Measure what one hostile OIP request costs the server: its answer's time, the worst latency of
good requests sent one after another on other connections meanwhile, and the peak RSS rise.

    .venv/bin/python benchmarks/http_hostile.py            # every case
    .venv/bin/python benchmarks/http_hostile.py bytes2m    # one case
    .venv/bin/python benchmarks/http_hostile.py half-sent  # 16 connections, bodies all but one byte

The server runs in this process (tests' server_thread), so the RSS rise is the server's: the
client side holds only the body it sends. Numbers of 2026-11-28: docs/oip.md, "Limits".
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' server helpers

from oip_support import oip_config, oip_server
from runtime_support import profiled_tiny_repository

TOKEN = "s3cret-token"


def hostile_bodies() -> dict[str, tuple[bytes, dict[str, str]]]:
    """name -> (body, extra headers) of the issue's hostile requests."""
    n = 2_000_000
    header = json.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": "BYTES", "shape": [n], "parameters": {"binary_data_size": 4 * n}}
            ]
        }
    ).encode()
    lists = (
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2000000,1],"data":['
        + b",".join([b"[0]"] * n)
        + b"]}]}"
    )
    objects = b'{"inputs":[' + b",".join([b"{}"] * 2_790_000) + b"]}"
    return {
        "bytes2m": (header + bytes(4 * n), {"Inference-Header-Content-Length": str(len(header))}),
        "lists2m": (lists, {}),
        "objects": (objects, {}),
    }


def request(port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in {"Authorization": f"Bearer {TOKEN}", **headers}.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def exchange(port: int, raw: bytes) -> tuple[float, bytes]:
    """Send `raw`, read to EOF; (seconds from the last byte sent to the answer's end, answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(raw)
        sent = time.perf_counter()
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return time.perf_counter() - sent, answer


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def main(names: list[str]) -> None:
    bodies = hostile_bodies()
    good = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": [0.0] * 64}]}
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "engines"
        profiled_tiny_repository(root)
        with oip_server(oip_config(root, token=TOKEN)) as (_, url):
            port = int(url.rsplit(":", 1)[1])
            path = "/v2/models/tiny_a/infer"
            good_raw = request(port, path, good.encode(), {"Content-Type": "application/json"})
            idle = [exchange(port, good_raw)[0] for _ in range(20)]
            print(f"good request alone: median {sorted(idle)[10] * 1e3:.1f} ms")
            for name in names or list(bodies):
                body, headers = bodies[name]
                raw = request(port, path, body, headers)
                Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
                before = rss_kib("VmRSS")
                result: dict[str, object] = {}

                def hostile(raw: bytes = raw, result: dict[str, object] = result) -> None:
                    result["s"], result["answer"] = exchange(port, raw)

                thread = threading.Thread(target=hostile)
                thread.start()
                goods = []  # good requests one after another until the hostile one is answered
                while thread.is_alive() or len(goods) < 5:
                    goods.append(exchange(port, good_raw))
                thread.join()
                peak = rss_kib("VmHWM")
                answer = result["answer"]
                assert isinstance(answer, bytes)
                status = answer.split(b" ", 2)[1].decode()
                worst = max(s for s, _ in goods)
                codes = sorted({a.split(b" ", 2)[1].decode() for _, a in goods})
                print(
                    f"{name}: {len(body) / 2**20:.1f} MiB -> {status} in {float(result['s']):.2f} s "
                    f"(its last byte to its answer); {len(goods)} good requests meanwhile: worst "
                    f"{worst * 1e3:.0f} ms {codes}; peak RSS +{(peak - before) / 1024:.0f} MiB"
                )


def half_sent(connections: int = 16, size: int = 8_000_000) -> None:
    """The issue's item 4: `connections` clients each declaring `size` bytes and sending all but
    one; what the server holds 2 s later, and how many were refused at once (503)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "engines"
        profiled_tiny_repository(root)
        with oip_server(oip_config(root, token=TOKEN)) as (_, url):
            port = int(url.rsplit(":", 1)[1])
            raw = request(port, "/v2/models/tiny_a/infer", bytes(size), {"Content-Type": "application/json"})
            time.sleep(0.5)
            before = rss_kib("VmRSS")
            socks = []
            for _ in range(connections):
                sock = socket.create_connection(("127.0.0.1", port), timeout=60)
                sock.sendall(raw[:-1])
                socks.append(sock)
            time.sleep(2.0)
            held = rss_kib("VmRSS") - before
            refused = 0
            for sock in socks:
                sock.settimeout(0.05)
                with contextlib.suppress(TimeoutError, ConnectionResetError):
                    refused += sock.recv(64).startswith(b"HTTP/1.1 503")
                sock.close()
            print(
                f"half-sent: {connections} x {size / 2**20:.1f} MiB declared, all but one byte sent: "
                f"{refused} refused 503 at once, the server holds +{held / 1024:.0f} MiB 2 s later"
            )


if __name__ == "__main__":
    if sys.argv[1:] == ["half-sent"]:
        half_sent()
    else:
        main(sys.argv[1:])
