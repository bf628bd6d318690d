"""Shared helpers of the phasekv pytest suite: seeded random data and poisoned outputs."""

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
    """Runs `call()` in a thread while this thread keeps executing Python, and asserts that it
    did during the call: impossible unless the kernel released the GIL (Python switches
    threads only between bytecodes). The call must take well over 60 ms."""
    span = {}

    def work():
        span["t0"] = time.perf_counter()
        call()
        span["t1"] = time.perf_counter()

    ticks = []
    t = threading.Thread(target=work)
    t.start()
    while t.is_alive():
        ticks.append(time.perf_counter())
    t.join()
    # Away from both ends of the call: the interpreter may hand this thread the GIL (every 5 ms)
    # between t0 and the kernel's start, and between its end and t1.
    margin = 0.02
    assert span["t1"] - span["t0"] > 3 * margin, "the call was too short to tell"
    inside = [x for x in ticks if span["t0"] + margin < x < span["t1"] - margin]
    assert len(inside) > 0, "no Python ran in this thread during the kernel"
