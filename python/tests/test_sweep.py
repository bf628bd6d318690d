"""phasekv.eval's idealized sweep (the R1/R2 tasks of phasekv-sweep), the specialization map,
the DeepSeek-V4 layer sweep, the induction model's gates and the mitigation study: the reports
against tallies recomputed here in numpy, the visibility costs against the design's rules written
here, and the known outcomes of one-hot gates."""

import numpy as np
import pytest

import phasekv as pk

SMALL = dict(dim=64, vocab=256, context=128, trials=32, targets_per_context=4)


def numpy_tally(positions, correct, modulus):
    r = np.asarray(positions) % modulus
    n = np.bincount(r, minlength=modulus)
    ok = np.bincount(r, weights=np.asarray(correct, np.float64), minlength=modulus)
    return ok.astype(np.int64), n


@pytest.mark.parametrize("task", ["R1", "R2"])
def test_sweep_report_is_the_tally_of_its_trials(task):
    g = pk.Geometry(8, 8)
    res = pk.eval.sweep(pk.UniformMean(g, 64), task=task, seed=5, **SMALL)
    assert res.positions.dtype == np.int64 and res.correct.dtype == np.bool_
    assert len(res.positions) == len(res.correct) == len(res.predictions) == 32 * 8
    ok, n = numpy_tally(res.positions, res.correct, 8)
    assert (n == 32).all()  # every residue group gets `trials` targets
    np.testing.assert_array_equal(res.report.column("correct"), ok)
    np.testing.assert_array_equal(res.report.column("n"), n)
    np.testing.assert_allclose(res.report.mean, (ok / n).mean())
    np.testing.assert_allclose(res.report.gap_pp, 100 * ((ok / n).max() - (ok / n).min()))
    # targets lie where the harness places them: [O, T - 1 - (L + W + S)]
    assert res.positions.min() >= 0 and res.positions.max() <= 127 - 16
    # the same seed gives the same trials
    again = pk.eval.sweep(pk.UniformMean(g, 64), task=task, seed=5, **SMALL)
    np.testing.assert_array_equal(again.predictions, res.predictions)


def test_sweep_known_outcomes():
    g = pk.Geometry(8, 8)
    full = pk.eval.sweep(None, task="R1", modulus=8, **SMALL)
    assert full.report.mean == 1.0  # uncompressed attention retrieves every record
    sel = pk.eval.sweep(pk.OffsetSelect(g, 64, 3), task="R1", **SMALL)
    acc = sel.report.column("accuracy")
    assert acc[3] == 1.0 and (np.delete(acc, 3) == 0).all()  # only phase 3 is kept
    r2 = pk.eval.sweep(pk.OffsetSelect(g, 64, 2), pk.OffsetSelect(g, 64, 3), task="R2", **SMALL)
    assert r2.report.best_residue == 2 and r2.report.column("accuracy")[2] == 1.0


def test_sweep_kernel_agrees_with_the_reference():
    g = pk.Geometry(8, 4)
    a = pk.eval.sweep(pk.UniformMean(g, 64), task="R2", local=4, **SMALL)
    b = pk.eval.sweep(pk.UniformMean(g, 64), task="R2", local=4, attention="reference", **SMALL)
    np.testing.assert_array_equal(a.positions, b.positions)
    assert (a.predictions == b.predictions).mean() >= 0.97


def test_sweep_knockout_and_bad_input():
    g = pk.Geometry(8, 8)
    k = np.zeros((2, 8), np.float32)
    v = np.zeros((2, 8), np.float32)
    k[0, 1], v[0, 2], k[1, 5], v[1, 6] = 1, 1, 1, 1
    kp, vp = pk.FixedGates(g, 64, 2, k), pk.FixedGates(g, 64, 2, v)
    base = pk.eval.sweep(kp, vp, heads=2, **SMALL)
    out = pk.eval.sweep(kp, vp, heads=2, knockout=[1], **SMALL)
    assert base.report.column("accuracy")[5] == 1.0
    assert out.report.column("accuracy")[5] < 0.5 and out.report.column("accuracy")[1] == 1.0
    with pytest.raises(ValueError, match="task"):
        pk.eval.sweep(kp, vp, heads=2, task="R3", **SMALL)
    with pytest.raises(TypeError, match="value_policy"):
        pk.eval.sweep(kp, pk.UniformMean(g, 64), heads=2, **SMALL)
    with pytest.raises(ValueError, match="knockout"):
        pk.eval.sweep(kp, vp, heads=2, knockout=[2], **SMALL)
    with pytest.raises(ValueError, match="vocab"):
        pk.eval.sweep(kp, vp, heads=2, **dict(SMALL, vocab=64))
    with pytest.raises(ValueError, match="targets_per_context"):
        pk.eval.sweep(kp, vp, heads=2, **dict(SMALL, trials=30))
    with pytest.raises(ValueError, match="attention"):
        pk.eval.sweep(kp, vp, heads=2, attention="gpu", **SMALL)


def test_specialization_map_finds_the_one_hot_heads():
    g = pk.Geometry(8, 8)
    offsets = [1, 4, 4]  # heads 1 and 2 collide
    k = np.zeros((3, 8), np.float32)
    v = np.zeros((3, 8), np.float32)
    for h, r in enumerate(offsets):
        k[h, r], v[h, r + 1] = 1, 1
    m = pk.eval.specialization_map(pk.FixedGates(g, 64, 3, k), pk.FixedGates(g, 64, 3, v),
                                   heads=3, **SMALL)
    assert m.heads == 3 and m.modulus == 8 and len(m.knocked) == len(m.alone) == 3
    assert not m.needed(1, 4) and not m.needed(2, 4)  # a collision: either head serves phase 4
    assert m.suffices(0, 1) and m.suffices(1, 4) and m.suffices(2, 4)
    assert not m.suffices(0, 4) and not m.suffices(1, 1)
    for h in range(3):
        for r in range(8):
            want = m.baseline.groups[r].accuracy - m.knocked[h].groups[r].accuracy
            assert m.drop(h, r) == pytest.approx(want)
    assert "collisions: r=4 by heads 1, 2" in m.findings() and m.to_svg().startswith("<svg")


def test_train_induction_gates_are_softmax_rows():
    k, v, ko, vo = pk.eval.train_induction(window=8, heads=4, steps=200, seed=11)
    assert k.shape == v.shape == (4, 8) and k.dtype == np.float32
    np.testing.assert_allclose(k.sum(axis=1), 1, rtol=1e-6)
    np.testing.assert_allclose(v.sum(axis=1), 1, rtol=1e-6)
    assert list(np.argmax(k, axis=1)) == ko and list(np.argmax(v, axis=1)) == vo
    res = pk.eval.sweep(pk.FixedGates(pk.Geometry(8, 8), 64, 4, k),
                        pk.FixedGates(pk.Geometry(8, 8), 64, 4, v), heads=4, **SMALL)
    assert res.report.mean > 0


def visible_rows(window, stride, local, n):
    """Rows a decode query sees (design rule, origin 0): J(n) entries plus the raw band."""
    j = (n - window) // stride + 1 if n >= window else 0
    tail = min(n, j * stride)
    return j + n - max(0, min(tail, n - local))


def test_design_cost_matches_the_visibility_rule():
    designs = pk.eval.mitigation_designs(8)
    names = [d.name for d in designs]
    assert names[0].startswith("uniform") and len(designs) == 9
    for d in designs:
        c = pk.eval.design_cost(d, 4, 4096)
        assert c.compress == d.window / d.stride
        if d.staggered:
            continue
        ref = sum(visible_rows(d.window, d.stride, d.local, n) for n in range(4096, 4104))
        uni = sum(visible_rows(8, 8, 0, n) for n in range(4096, 4104))
        np.testing.assert_allclose(c.attend, ref / uni, rtol=1e-12)
    assert pk.eval.design_cost(designs[0], 4).memory == 1.0


def test_measure_design_small_study():
    s = pk.eval.StudyConfig()
    s.seeds, s.train_steps, s.contexts, s.targets_per_group = 2, 30, 4, 2
    d = pk.eval.mitigation_designs(8)[1]
    r = pk.eval.measure_design(d, s)
    assert r.design.name == d.name and len(r.per_seed) == 2 and len(r.key_offsets) == 2
    assert r.r1.modulus == 8 and sum(g.n for g in r.trained.groups) == 2 * 8 * 4 * 2
    means = [p.mean for p in r.per_seed]
    np.testing.assert_allclose(r.seed_mean.mean, np.mean(means))
    study = pk.eval.StudyResult  # the type run_study returns (not run here: minutes)
    assert study.__name__ == "StudyResult"


def test_dsv4_sweep_layers():
    res, sel = pk.eval.dsv4_sweep("hca", ratio=8, indexer="all", window=16, dim=64, vocab=512,
                                  context=256, trials=16)
    assert len(res.positions) == 16 * 8
    assert sel.mean == 1.0  # HCA attends every entry: one always holds the target
    ok, n = numpy_tally(res.positions, res.correct, 8)
    np.testing.assert_array_equal(res.report.column("correct"), ok)
    with pytest.raises(ValueError, match="layer"):
        pk.eval.dsv4_sweep("mla")
