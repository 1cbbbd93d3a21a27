"""A short CPU slice for the event loop's thread, so that its wake-ups run at once.

Why: on a busy box (a client on the same cores, the executor thread inside ONNX Runtime) a loop
thread that wakes (a frame to read, a finished batch to answer) waits until the thread running on
its core has used up its slice: 0.7 ms x (1 + log2 CPUs) by default, 1.4 ms on 2 CPUs. Beside a
client written from the docs alone at 2x load, a finished batch waited 0.5-1.2 ms at the median
for the loop to write its answers, and a frame about 1 ms before its read; the 5 ms deadlines of
the digits models missed by that. Since Linux 6.12 (EEVDF) a SCHED_OTHER thread may ask for a
shorter slice (sched_setattr's `sched_runtime`, 0.1-100 ms, no privilege needed), and a waking
thread whose slice is shorter preempts the running one. The loop's work per wake-up is short: its
share of the CPU does not change, only how soon it gets it (docs/overload-journal.md, "A short
slice for the loop").

The cost: a loop that wakes on the executor thread's CPU preempts that one too (at 10x with the
project's fast generators, ~250 more preemptions of it a second and about 0.04x of capacity less
in deadline); `[backend] loop_slice_us = 0` turns the short slice off. Only the loop's thread: the
executor thread on a short slice as well did worse for both kinds of client. Kernels before 6.12
accept the call and ignore the value (they report no slice: `thread_slice_s` is None there and
nothing is set); other systems have no such call. Linux on x86-64 and arm64 (Jetson), via ctypes.
"""

from __future__ import annotations

import ctypes
import logging
import platform

_log = logging.getLogger(__name__)
MIN_S, MAX_S = 100e-6, 0.1  # the kernel clamps a requested slice to this range

_SCHED_OTHER = 0
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}  # (sched_setattr, sched_getattr)


class _SchedAttr(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("sched_policy", ctypes.c_uint32),
        ("sched_flags", ctypes.c_uint64),
        ("sched_nice", ctypes.c_int32),
        ("sched_priority", ctypes.c_uint32),
        ("sched_runtime", ctypes.c_uint64),  # a SCHED_OTHER thread's slice, ns (Linux 6.12+)
        ("sched_deadline", ctypes.c_uint64),
        ("sched_period", ctypes.c_uint64),
        ("sched_util_min", ctypes.c_uint32),
        ("sched_util_max", ctypes.c_uint32),
    ]


def _syscall() -> tuple[ctypes.CDLL, int, int] | None:
    numbers = _SYSCALLS.get(platform.machine()) if platform.system() == "Linux" else None
    if numbers is None:
        return None
    return ctypes.CDLL(None, use_errno=True), *numbers


def _fair_attr(call: tuple[ctypes.CDLL, int, int], tid: int) -> _SchedAttr | None:
    """Thread `tid`'s attributes where it is SCHED_OTHER and the kernel reports its slice."""
    libc, _, get = call
    attr = _SchedAttr()
    if libc.syscall(get, tid, ctypes.byref(attr), ctypes.sizeof(attr), 0) != 0:
        return None
    return attr if attr.sched_policy == _SCHED_OTHER and attr.sched_runtime else None


def thread_slice_s(tid: int = 0) -> float | None:
    """The CPU slice of thread `tid` (0: the calling thread) in seconds; None where the kernel
    reports none (before Linux 6.12, not Linux, a thread that is not SCHED_OTHER)."""
    call = _syscall()
    attr = None if call is None else _fair_attr(call, tid)
    return None if attr is None else attr.sched_runtime * 1e-9


def slice_ns(seconds: float) -> int:
    """The slice the kernel gives for a request of `seconds`, in ns (0: its default)."""
    return 0 if seconds <= 0 else round(min(max(seconds, MIN_S), MAX_S) * 1e9)


def set_thread_slice(seconds: float, tid: int = 0) -> bool:
    """Ask for a CPU slice of `seconds` (clamped to MIN_S..MAX_S; 0: the kernel's default) for
    thread `tid` (0: the calling thread). Leaves its policy and nice value as they are, and a
    thread that is not SCHED_OTHER (set by its operator) alone. True if the kernel took it."""
    call = _syscall()
    attr = None if call is None else _fair_attr(call, tid)
    if call is None or attr is None:
        return False
    libc, set_, _ = call
    wanted = slice_ns(seconds)
    new = _SchedAttr(
        size=ctypes.sizeof(_SchedAttr),
        sched_policy=_SCHED_OTHER,
        sched_nice=attr.sched_nice,
        sched_runtime=wanted,
    )
    if libc.syscall(set_, tid, ctypes.byref(new), 0) != 0:
        return False
    now = _fair_attr(call, tid)
    return now is not None and (wanted == 0 or now.sched_runtime == wanted)


def shorten_slice(seconds: float) -> float | None:
    """The calling thread (the loop's, after the executor's thread started, which keeps its own)
    takes a slice of `seconds`; the slice it had, for the caller to give back when done (an
    embedding app owns the thread), or None where nothing changed: no slice asked for, none
    reported, or one it has already (another Server on it: left to whoever gave it)."""
    before = thread_slice_s()
    if (
        seconds
        and before is not None
        and round(before * 1e9) != slice_ns(seconds)
        and set_thread_slice(seconds)
    ):
        _log.debug("event loop thread: CPU slice %.2f ms (was %.2f ms)", seconds * 1e3, before * 1e3)
        return before
    return None
