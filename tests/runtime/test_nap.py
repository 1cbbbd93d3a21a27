"""The compiled nap of the loop's step_aside (runtime/_nap.c): it returns as the counter changes,
from another thread, and gives up at its deadline; it reads only an aligned, writable int64."""

from __future__ import annotations

import array
import shutil
import threading
import time

import pytest

from edgeserve.runtime.executor import nap

needs_nap = pytest.mark.skipif(nap is None, reason="edgeserve.runtime._nap is not built")


def test_the_nap_is_built_wherever_a_c_compiler_is() -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine: the loop blocks on a lock")
    assert nap is not None, "reinstall (`pip install -e .`, `make` does it) to build _nap.c"


@needs_nap
def test_returns_true_soon_after_another_thread_bumps_the_counter() -> None:
    counter = array.array("q", [41])
    bumped: list[float] = []

    def bump() -> None:
        time.sleep(0.05)
        bumped.append(time.monotonic())
        counter[0] += 1

    thread = threading.Thread(target=bump)
    thread.start()
    assert nap(counter, 41, time.monotonic() + 10.0, 20e-6) is True
    back = time.monotonic()
    thread.join()
    assert counter[0] == 42
    assert 0.0 <= back - bumped[0] < 1.0  # a nap step is 20 us; a loaded CI machine is slower


@needs_nap
def test_returns_at_once_when_the_counter_already_differs() -> None:
    t = time.monotonic()
    assert nap(array.array("q", [7]), 6, t + 10.0, 1.0) is True
    assert time.monotonic() - t < 1.0


@needs_nap
def test_gives_up_at_its_deadline_with_false() -> None:
    counter = array.array("q", [0])
    t = time.monotonic()
    assert nap(counter, 0, t + 0.02, 1e-3) is False
    assert 0.02 <= time.monotonic() - t < 2.0
    assert nap(counter, 0, t - 1.0, 1e-3) is False  # a deadline already past: one look, no nap


@needs_nap
def test_lets_other_threads_run_while_it_naps() -> None:
    """The GIL is released: a Python thread bumps the counter while the caller naps."""
    counter = array.array("q", [0])
    thread = threading.Thread(target=lambda: counter.__setitem__(0, 1))
    thread.start()  # it needs the GIL to run its Python
    assert nap(counter, 0, time.monotonic() + 10.0, 50e-6) is True
    thread.join()


@needs_nap
@pytest.mark.parametrize(
    "counter, error",
    [
        (b"\0" * 8, BufferError),  # read-only
        (array.array("b", [0] * 4), ValueError),  # shorter than an int64
        (memoryview(bytearray(16))[1:9], ValueError),  # not aligned (a sliced bytearray)
        (12, TypeError),  # no buffer at all
    ],
)
def test_rejects_a_counter_it_cannot_read_as_an_aligned_int64(counter: object, error: type) -> None:
    with pytest.raises(error):
        nap(counter, 0, time.monotonic() + 1.0, 1e-3)


@needs_nap
@pytest.mark.parametrize(
    "args", [(), (array.array("q", [0]), 0, 1.0), (array.array("q", [0]), "0", 1.0, 1e-3)]
)
def test_rejects_wrong_arguments(args: tuple) -> None:
    with pytest.raises(TypeError):
        nap(*args)
