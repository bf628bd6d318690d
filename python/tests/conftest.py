"""Shared helpers of the phasekv pytest suite: seeded random data and poisoned outputs."""

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(20261207)


def poison(shape, dtype=np.float32):
    """An output array filled with NaN, so that an element a kernel skips cannot pass."""
    return np.full(shape, np.nan, dtype=dtype)
