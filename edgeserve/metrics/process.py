"""Process metrics from /proc (Linux): resident memory, CPU time, start time, open file descriptors.

The names and meanings are Prometheus' standard process collector's, so dashboards built for any
Prometheus-instrumented process work unchanged. Anything /proc cannot give (another OS) is None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcessSample:
    rss_bytes: int | None
    virtual_bytes: int | None
    cpu_seconds: float | None
    start_time_seconds: float | None  # since the Unix epoch
    open_fds: int | None
    max_fds: int | None


def _status_kib(status: str, key: str) -> int | None:
    for line in status.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return None


def rss_bytes(pid: int | str = "self") -> int | None:
    """VmRSS of a process (this one by default), or None if it is gone or /proc is absent."""
    try:
        return _status_kib(Path(f"/proc/{pid}/status").read_text(), "VmRSS")
    except (OSError, ValueError):
        return None


def thread_cpu_wait_s(thread_id: int) -> float | None:
    """How long a thread of this process has been ready to run but waiting for a CPU (the second
    field of its schedstat, ns), or None where the kernel does not keep it. On a box with fewer
    free cores than busy threads, this is the time the executor lost to the others."""
    try:
        return int(Path(f"/proc/self/task/{thread_id}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _boot_time() -> float | None:
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except OSError:
        pass
    return None


def _max_fds(limits: str) -> int | None:
    for line in limits.splitlines():
        if line.startswith("Max open files"):
            soft = line.split()[3]
            return None if soft == "unlimited" else int(soft)
    return None


def sample(pid: int | str = "self") -> ProcessSample:
    """One reading of /proc/<pid>; fields it cannot read are None."""
    proc = Path(f"/proc/{pid}")
    rss = virtual = start = fds = max_fds = None
    cpu = None
    try:
        status = (proc / "status").read_text()
        rss, virtual = _status_kib(status, "VmRSS"), _status_kib(status, "VmSize")
        # Fields after the parenthesised command name (which may itself contain spaces).
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
        boot = _boot_time()
        start = None if boot is None else boot + int(fields[19]) / ticks
        fds = len(os.listdir(proc / "fd"))
        max_fds = _max_fds((proc / "limits").read_text())
    except (OSError, ValueError, IndexError):
        pass
    return ProcessSample(rss, virtual, cpu, start, fds, max_fds)
