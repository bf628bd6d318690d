"""How many items per residue the 95 % Wilson intervals need to separate a given gap.

Two residues with accuracies p1 > p2, gap d = p1 - p2, n items each; z = 1.96.
The Wilson interval of p_hat over n items has half-width

    w(p_hat, n) = z / (1 + z^2/n) * sqrt(p_hat (1 - p_hat) / n + z^2 / (4 n^2))
               ~= z * sqrt(p_hat (1 - p_hat) / n)            (normal approximation)

- The intervals *at the expected accuracies* just separate when w(p1, n) + w(p2, n) = d:

      n_50 = z^2 (sqrt(p1 q1) + sqrt(p2 q2))^2 / d^2          (q = 1 - p)

  A run of that size separates them only about half the time (p_hat1 - p_hat2 scatters
  around d).
- To separate them with probability 1 - beta (power), the observed difference must exceed the
  two half-widths: d - z (sqrt(p1 q1) + sqrt(p2 q2)) / sqrt(n) >= z_beta sqrt(p1 q1 + p2 q2)
  / sqrt(n), so

      n_power = (z (sqrt(p1 q1) + sqrt(p2 q2)) + z_beta sqrt(p1 q1 + p2 q2))^2 / d^2

  At p ~ 1/2, 80 % power (z_beta = 0.8416): n ~ 6.5 / d^2.

``exact_power`` computes the probability of separation from the binomial distributions and the
Wilson bounds themselves (no approximation), and ``items_for_power`` searches the smallest n
that reaches a power; ``python -m phasekv.run.sample_size`` prints both for a gap.
"""

from __future__ import annotations

import argparse
import math
import sys
from statistics import NormalDist
from typing import List

Z95 = NormalDist().inv_cdf(0.975)


def wilson(c: int, n: int, z: float = Z95):
    """The Wilson score interval (low, high) of c successes in n trials."""
    p = c / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z / den * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def normal_items(p1: float, p2: float, power: float = 0.5, z: float = Z95) -> float:
    """The normal-approximation n of the formulas above (power 0.5 gives n_50)."""
    d = abs(p1 - p2)
    s1, s2 = math.sqrt(p1 * (1 - p1)), math.sqrt(p2 * (1 - p2))
    zb = NormalDist().inv_cdf(power)
    return (z * (s1 + s2) + zb * math.sqrt(s1 * s1 + s2 * s2)) ** 2 / (d * d)


def _pmf(n: int, p: float) -> List[float]:
    lg = math.lgamma
    lp, lq = (math.log(p) if p > 0 else -math.inf), (math.log1p(-p) if p < 1 else -math.inf)
    out = []
    for c in range(n + 1):
        a = (c * lp if c else 0.0) + ((n - c) * lq if n - c else 0.0)
        out.append(math.exp(lg(n + 1) - lg(c + 1) - lg(n - c + 1) + a) if a > -math.inf
                   else 0.0)
    return out


def exact_power(p1: float, p2: float, n: int, z: float = Z95) -> float:
    """P(Wilson low of the better residue > Wilson high of the worse one), n items each."""
    hi_p, lo_p = max(p1, p2), min(p1, p2)
    f1, f2 = _pmf(n, hi_p), _pmf(n, lo_p)
    lows = [wilson(c, n, z)[0] for c in range(n + 1)]
    highs = [wilson(c, n, z)[1] for c in range(n + 1)]  # increasing in c
    cum, acc = [], 0.0
    for v in f2:
        acc += v
        cum.append(acc)
    total, k = 0.0, -1
    for c1 in range(n + 1):  # lows increase with c1: k only moves up
        while k + 1 <= n and highs[k + 1] < lows[c1]:
            k += 1
        if k >= 0:
            total += f1[c1] * cum[k]
    return total


def items_for_power(p1: float, p2: float, power: float, z: float = Z95) -> int:
    """The smallest n whose exact separation probability reaches `power` and stays there for
    the next 10 n (the binomial's steps make it wobble)."""
    n = max(2, int(normal_items(p1, p2, power, z) * 0.6))
    while True:
        if exact_power(p1, p2, n, z) >= power and all(
                exact_power(p1, p2, n + k, z) >= power for k in range(1, 11)):
            return n
        n += 1 if n < 200 else max(1, n // 200)


def table(gaps=(0.05, 0.1, 0.2, 0.3, 0.4, 0.6), mean=0.5, power=0.8) -> str:
    rows = ["| gap | accuracies | n, normal, expected intervals touch | n, normal, "
            f"{power:.0%} power | n, exact binomial + Wilson, {power:.0%} power |",
            "|---|---|---|---|---|"]
    for d in gaps:
        p1, p2 = mean + d / 2, mean - d / 2
        rows.append(f"| {d:.2f} | {p1:.3g} vs {p2:.3g} | {math.ceil(normal_items(p1, p2)):d} | "
                    f"{math.ceil(normal_items(p1, p2, power)):d} | "
                    f"{items_for_power(p1, p2, power):d} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m phasekv.run.sample_size",
        description="Items per residue for 95 %% Wilson intervals to separate a gap")
    ap.add_argument("--gap", type=float, help="accuracy gap to resolve, in (0, 1)")
    ap.add_argument("--mean", type=float, default=0.5,
                    help="mean accuracy of the two residues (default 0.5, the worst case)")
    ap.add_argument("--power", type=float, default=0.8,
                    help="probability of separating them (default 0.8)")
    ap.add_argument("--modulus", type=int, default=1,
                    help="round up to a multiple of this (phasekv-plan --count needs it)")
    ap.add_argument("--table", action="store_true", help="print the table of docs/real_models.md")
    a = ap.parse_args(argv)
    if a.table:
        print(table())
        return 0
    if a.gap is None or not 0 < a.gap < 1:
        ap.error(f"--gap = {a.gap} must be in (0, 1)")
    p1, p2 = a.mean + a.gap / 2, a.mean - a.gap / 2
    if not (0 <= p2 and p1 <= 1):
        ap.error(f"--mean = {a.mean} with --gap = {a.gap} gives accuracies {p2:.3f} and "
                 f"{p1:.3f}, outside [0, 1]")
    if not 0 < a.power < 1:
        ap.error(f"--power = {a.power} must be in (0, 1)")
    if a.modulus < 1:
        ap.error(f"--modulus = {a.modulus} must be >= 1")
    n = items_for_power(p1, p2, a.power)
    count = -(-n // a.modulus) * a.modulus
    print(f"{p1:.3f} vs {p2:.3f}: {n} items per residue separate the 95 % Wilson intervals with "
          f"probability >= {a.power} (normal approximation {math.ceil(normal_items(p1, p2, a.power))})"
          f"; phasekv-plan --modulus {a.modulus} --count {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
