"""The phase report and sweep plans: Wilson intervals, homogeneity test, period and the
summary against references written here with numpy and math, the report outputs, and the
plans' matched means."""

import json
import math

import numpy as np
import pytest

import phasekv as pk

Z95 = 1.959963984540054


def ref_wilson(c, n, z=Z95):
    if n == 0:
        return 0.0, 1.0
    p = c / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    lo, hi = centre - half, centre + half
    return (0.0 if c == 0 else lo), (1.0 if c == n else hi)


def ref_chi2_sf(x, dof):
    """P(X >= x) for chi-square with integer dof, in closed form."""
    if x <= 0:
        return 1.0
    if dof % 2 == 0:
        term, total = 1.0, 0.0
        for k in range(dof // 2):
            if k:
                term *= (x / 2) / k
            total += term
        return math.exp(-x / 2) * total
    total = math.erfc(math.sqrt(x / 2))
    term = math.sqrt(2 * x / math.pi) * math.exp(-x / 2)
    for k in range(1, (dof - 1) // 2 + 1):
        total += term
        term *= x / (2 * k + 1)
    return total


def ref_homogeneity(correct, n):
    groups = [(c, t) for c, t in zip(correct, n) if t > 0]
    total, good = sum(t for _, t in groups), sum(c for c, _ in groups)
    if len(groups) < 2 or good in (0, total):
        return 0.0, max(len(groups) - 1, 0), 1.0
    rate = good / total
    stat = sum((c - t * rate) ** 2 / (t * rate) + ((t - c) - t * (1 - rate)) ** 2 / (t * (1 - rate))
               for c, t in groups)
    dof = len(groups) - 1
    return stat, dof, ref_chi2_sf(stat, dof)


def ref_period(correct, n, alpha=0.01):
    m = len(n)
    for p in range(1, m):
        if m % p:
            continue
        if all(ref_homogeneity(correct[c::p], n[c::p])[2] >= alpha / p for c in range(p)):
            return p
    return m


def test_wilson_interval_matches_reference():
    for c, n in [(0, 10), (10, 10), (3, 7), (52, 100), (1, 1), (0, 0), (999, 1000)]:
        lo, hi = pk.eval.wilson_interval(c, n)
        rlo, rhi = ref_wilson(c, n)
        assert abs(lo - rlo) < 1e-12 and abs(hi - rhi) < 1e-12, (c, n)


def test_homogeneity_and_period_match_reference(rng):
    for trial in range(20):
        m = [4, 6, 8, 12][trial % 4]
        n = rng.integers(0 if trial % 5 == 0 else 20, 200, size=m).tolist()
        rates = rng.random(m) if trial % 3 else np.full(m, 0.6)
        correct = [int(rng.binomial(t, r)) for t, r in zip(n, rates)]
        stat, dof, p = pk.eval.homogeneity_test(correct, n)
        rstat, rdof, rp = ref_homogeneity(correct, n)
        assert dof == rdof
        assert abs(stat - rstat) <= 1e-9 * max(1.0, rstat)
        assert abs(p - rp) <= 1e-9 + 1e-7 * rp, (p, rp)
        assert pk.eval.detect_period(correct, n) == ref_period(correct, n)


def synthetic(rng, period, modulus=8, per_group=400, weak=0.3, strong=0.8):
    positions = np.concatenate([np.arange(100 + r, 100 + r + modulus * per_group, modulus)
                                for r in range(modulus)]).astype(np.int64)
    p = np.where((positions - 3) % period == period - 1, weak, strong) if period > 1 else np.full(positions.shape, strong)
    correct = rng.random(positions.shape) < p
    return positions, correct


def test_report_of_a_period_four_weak_spot(rng):
    positions, correct = synthetic(rng, 4)
    rep = pk.eval.report(positions, correct, modulus=8, origin=3)
    assert rep.modulus == 8 and len(rep.table) == 8
    # Reference numbers from the raw outcomes.
    res = (positions - 3) % 8
    acc = np.array([correct[res == r].mean() for r in range(8)])
    n = np.array([(res == r).sum() for r in range(8)])
    np.testing.assert_allclose(rep.column("accuracy"), acc, rtol=0, atol=1e-15)
    assert (rep.column("n") == n).all()
    assert rep.worst_residue == int(np.argmin(acc)) and rep.best_residue == int(np.argmax(acc))
    assert abs(rep.gap_pp - 100 * (acc.max() - acc.min())) < 1e-9
    assert abs(rep.mean - acc.mean()) < 1e-12
    assert rep.worst_residue % 4 == 3 and rep.period == 4 and rep.homogeneity_p < 1e-10
    for row in rep.table:
        lo, hi = ref_wilson(row["correct"], row["n"])
        assert abs(row["ci_low"] - lo) < 1e-12 and abs(row["ci_high"] - hi) < 1e-12
    rows = [line for line in rep.to_markdown().splitlines() if line.startswith("| ") and "residue" not in line]
    assert [int(line.split("|")[1]) for line in rows] == list(range(8))
    assert rows[3].split("|")[4].strip() == f"{100 * acc[3]:.1f}"
    d = rep.to_dict()
    assert [g["residue"] for g in d["groups"]] == list(range(8))
    assert rep.to_svg().startswith("<svg") and rep.to_svg().rstrip().endswith("</svg>")
    assert "gap" in rep.summary_line() and "period 4" in rep.summary_line()
    assert len(rep.to_csv().strip().splitlines()) == 9
    flat = pk.eval.report(*synthetic(rng, 1), modulus=8)
    assert flat.period == 1 and flat.homogeneity_p > 1e-3


def test_report_plot_with_matplotlib(rng):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    rep = pk.eval.report(*synthetic(rng, 4), modulus=8)
    ax = rep.plot()
    assert ax.get_ylabel() == "accuracy (%)" and len(ax.get_xticks()) == 8


def test_read_jsonl_and_bad_input(tmp_path, rng):
    positions, correct = synthetic(rng, 4, per_group=5)
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps({"position": int(p), "correct": bool(c)})
                              for p, c in zip(positions, correct)) + "\n")
    p2, c2 = pk.eval.read_jsonl(str(path))
    assert (p2 == positions).all() and (c2 == correct).all()
    path.write_text('{"position": 3, "correct": true}\n{"position": 4}\n')
    with pytest.raises(ValueError, match=":2:"):
        pk.eval.read_jsonl(str(path))
    with pytest.raises(ValueError, match="modulus = 0"):
        pk.eval.report([1, 2], [True, False], modulus=0)
    with pytest.raises(ValueError, match=r"correct has shape \(1,\)"):
        pk.eval.report([1, 2], [True], modulus=4)
    with pytest.raises(ValueError, match=r"correct\[i\] = 2"):
        pk.eval.report([1, 2], [1, 2], modulus=4)
    with pytest.raises(ValueError, match=r"correct\[i\] = 5"):
        pk.eval.summarize([5], [3])
    with pytest.raises(ValueError, match="alpha"):
        pk.eval.detect_period([1, 2], [3, 3], alpha=1.5)


def test_plan_has_matched_means_and_valid_layouts():
    items = pk.eval.plan(modulus=8, count=16, query_position=2000, record_length=10,
                         padding="in_sequence")
    assert len(items) == 8 * 16
    by_res = {}
    for it in items:
        assert (it["target"] - 0) % 8 == it["residue"]
        by_res.setdefault(it["residue"], []).append(it["target"])
        segs = it["segments"]
        assert segs[0]["start"] == 0 and segs[-1]["kind"] == "query" and segs[-1]["start"] == 2000
        for a, b in zip(segs, segs[1:]):
            assert a["start"] + a["length"] == b["start"]  # contiguous, no overlap
        target = [s for s in segs if s["kind"] == "target"]
        assert len(target) == 1 and target[0]["start"] == it["target"]
    means = [np.mean(v) for v in by_res.values()]
    assert max(means) - min(means) < 1e-9
    var = [np.var(v) for v in by_res.values()]
    assert max(var) / min(var) - 1 <= 0.01
    tp = pk.eval.plan_targets(8, 16, 0, 1990)
    assert tp.variance_spread() <= 0.01 and len(tp.positions) == 8
    with pytest.raises(ValueError, match="count = 12"):
        pk.eval.plan_targets(8, 12, 0, 1990)
    with pytest.raises(ValueError, match="padding = 'middle'"):
        pk.eval.layout_prompt(100, 200, 10, "middle")
