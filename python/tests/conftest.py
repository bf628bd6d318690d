"""Shared helpers of the phasekv pytest suite: seeded random data and poisoned outputs."""

import sys
import threading
import time

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(20261207)


def poison(shape, dtype=np.float32):
    """An output array filled with NaN, so that an element a kernel skips cannot pass."""
    return np.full(shape, np.nan, dtype=dtype)


def assert_releases_gil(call):
    """Runs `call()` repeatedly in a thread (for at least 0.25 s) while this thread keeps
    executing Python, and asserts that it did inside a call: impossible unless the kernel
    released the GIL (Python switches threads only between bytecodes). Each call must take
    longer than 3 margins (about 35 ms); the repetition keeps the check independent of how
    fast the machine is."""
    spans = []

    def work():
        start = time.perf_counter()
        while not spans or time.perf_counter() - start < 0.25:
            t0 = time.perf_counter()
            call()
            spans.append((t0, time.perf_counter()))

    ticks = []
    t = threading.Thread(target=work)
    t.start()
    while t.is_alive():
        ticks.append(time.perf_counter())
    t.join()
    # Away from both ends of each call: the interpreter may hand this thread the GIL between t0
    # and the kernel's start (and between its end and t1), and keeps it up to one switch
    # interval.
    margin = 2 * sys.getswitchinterval() + 0.001
    assert max(t1 - t0 for t0, t1 in spans) > 3 * margin, "the call was too short to tell"
    tick = np.asarray(ticks)
    inside = sum(
        int(np.count_nonzero((tick > t0 + margin) & (tick < t1 - margin))) for t0, t1 in spans
    )
    assert inside > 0, "no Python ran in this thread during the kernel"
