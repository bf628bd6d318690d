"""The sample-size numbers of docs/real_models.md: formulas, exact power, and the doc's table."""

from __future__ import annotations

import math
import os
import random

import _run_support as S  # noqa: F401  (sets the import path)

from phasekv.run.sample_size import (Z95, exact_power, items_for_power, normal_items,  # noqa: E402
                                     table, wilson)


def test_wilson_closed_forms():
    for n in (5, 40, 333):
        lo, hi = wilson(0, n)
        assert abs(lo) < 1e-12 and math.isclose(hi, Z95 ** 2 / (n + Z95 ** 2), rel_tol=1e-12)
        lo, hi = wilson(n, n)
        assert math.isclose(lo, n / (n + Z95 ** 2), rel_tol=1e-12) and math.isclose(hi, 1.0)
    lo, hi = wilson(50, 100)
    assert math.isclose(0.5 - lo, hi - 0.5) and 0.40 < lo < 0.41  # 0.4038 by hand


def test_normal_formula_at_one_half():
    # n_50 = z^2 / d^2 when p1, p2 -> 1/2; with power, (z + z_b / sqrt 2)^2 / d^2.
    assert math.isclose(normal_items(0.5001, 0.4999), Z95 ** 2 / 0.0002 ** 2, rel_tol=1e-6)
    zb = 0.8416212335729143
    assert math.isclose(normal_items(0.5001, 0.4999, 0.8),
                        (Z95 + zb / math.sqrt(2)) ** 2 / 0.0002 ** 2, rel_tol=1e-6)


def test_exact_power_agrees_with_simulation():
    # Monte Carlo with a fixed seed: 4000 runs of n items per residue at 0.7 vs 0.3.
    n = items_for_power(0.7, 0.3, 0.8)
    p = exact_power(0.7, 0.3, n)
    assert p >= 0.8 and exact_power(0.7, 0.3, n // 2) < 0.5
    rng = random.Random(42)
    runs, hits = 4000, 0
    for _ in range(runs):
        c1 = sum(rng.random() < 0.7 for _ in range(n))
        c2 = sum(rng.random() < 0.3 for _ in range(n))
        hits += wilson(c1, n)[0] > wilson(c2, n)[1]
    se = math.sqrt(p * (1 - p) / runs)
    assert abs(hits / runs - p) < 4 * se, (hits / runs, p)


def test_doc_table_is_the_code_output():
    doc = os.path.join(S.REPO, "docs", "real_models.md")
    with open(doc) as f:
        text = f.read()
    assert table() in text, "docs/real_models.md's table differs from " \
        "`python -m phasekv.run.sample_size --table`: paste the new output"
