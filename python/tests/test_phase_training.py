"""The phase-training example (python/examples/phase_training): its torch forward pass (the one
trained with autograd) against phasekv's kernels and visibility, and a smoke run of the study.

Tolerances: both sides compute in float32 (unit roundoff u = 2^-24) in different orders. A
logit s = <q, k> / sqrt(d) of a raw key is off by at most gamma_d |q| |k| / sqrt(d), and a pooled
key (a convex combination of W rows, gates included) adds gamma_W |q| |k| / sqrt(d); a logit
error delta changes the softmax weights by a relative 2 delta at most. The output, a convex
combination of m <= T + J visible rows, adds gamma_{m+8} max|v| (sums, exp, normalization). So
each side is within max|v| (2 (gamma_d + gamma_W) A + gamma_{m+8}) of the exact result, where A
is the largest |q| |k| / sqrt(d) over the layer's queries and keys; the tests allow twice that
(both sides), plus the same again for the pooled values' rounding (gamma_W max|v|).
gamma_k = k u / (1 - k u)."""

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pk = pytest.importorskip("phasekv")

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "phase_training")
sys.path.insert(0, EXAMPLE)

import kernels  # noqa: E402
import model as M  # noqa: E402

U = 2.0**-24


def gamma(k):
    return k * U / (1 - k * U)


def _random_model(design, seed):
    torch.manual_seed(seed)
    cfg = M.ModelConfig()
    m = M.Model(cfg, design)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "gate" in name:  # sharp, head- and offset-dependent gates (not near uniform)
                p.normal_(0, 1.0)
        for blk in m.blocks:  # logits of order 1..10, not near-uniform softmaxes
            blk.attn.qkv.weight.mul_(20)
    m.eval()
    return cfg, m


@pytest.mark.parametrize("name", list(M.DESIGNS))
def test_masks_follow_phasekv_geometry(name):
    """The torch masks are DESIGN.md's visibility: the same sets phasekv.Geometry.visible
    lists, for every head (its own origin) and every n."""
    design = M.DESIGNS[name]
    cfg = M.ModelConfig()
    raw, ent = M.visibility_masks(cfg.length, design, cfg.heads, cfg.local)
    if not design.compressed:
        assert (raw == np.tril(np.ones((cfg.length, cfg.length), bool))).all()
        return
    for h, o in enumerate(design.origins(cfg.heads)):
        g = pk.Geometry(design.window, design.stride, o)
        for n in range(1, cfg.length + 1):
            vis = g.visible(n, cfg.local)
            want = np.zeros(cfg.length, bool)
            want[: vis.prefix_end] = True
            want[vis.raw_begin:vis.raw_end] = True
            assert (raw[h, n - 1] == want).all(), (h, n)
            assert ent[h, n - 1].sum() == vis.entries
            assert ent[h, n - 1, : vis.entries].all()


@pytest.mark.parametrize("name", [n for n in M.DESIGNS if n != "mean W16/S8 (overlap)"])
def test_torch_forward_matches_phasekv_kernels(name):
    """Per layer, the same q/k/v through the torch attention (compressor + masked softmax)
    and through phasekv (CompressedCache streaming, prefill and decode) agree within the f32
    bound; the end-to-end logits and predictions agree too."""
    design = M.DESIGNS[name]
    cfg, m = _random_model(design, seed=7)
    km = kernels.KernelModel(m)
    rng = np.random.default_rng(3)
    tokens, _, _ = M.make_batch(rng, cfg, 2)
    for b in range(2):
        seq = tokens[b, : cfg.context + 1]
        cap = {}
        logits_k = km.forward(seq, cap)
        with torch.no_grad():
            logits_t = m(seq[None])[0].numpy()
            for li, blk in enumerate(m.blocks):
                c = cap[li]
                q, k, v = (torch.from_numpy(c[a])[None] for a in ("q", "k", "v"))
                want = blk.attn.attend(q, k, v)[0].numpy()
                n, d = q.shape[1], q.shape[-1]
                w = design.window if design.compressed else 1
                qn = np.linalg.norm(c["q"], axis=-1).max()
                kn = np.linalg.norm(c["k"], axis=-1).max()
                a = qn * kn / np.sqrt(d)
                vmax = np.abs(c["v"]).max()
                m_rows = n + n // max(design.stride, 1)
                one_side = vmax * (2 * (gamma(d) + gamma(w)) * a + gamma(m_rows + 8) + gamma(w))
                bound = 2 * one_side
                err = np.abs(c["out"] - want).max()
                assert err <= bound, (li, err, bound)
        # end to end: not a derived bound (the per-layer checks above are); a coarse allowance
        # of 1e-4 relative (~1700 u) for the amplification through projections, MLPs and
        # layer norms. Observed: about 1e-6 relative.
        scale = np.abs(logits_t).max()
        assert np.abs(logits_k - logits_t).max() <= 1e-4 * scale
        top2 = np.sort(logits_t, axis=-1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 2 * np.abs(logits_k - logits_t).max()
        assert (logits_k.argmax(-1) == logits_t.argmax(-1))[clear].all()


def test_kernel_attention_uses_the_compressed_entries():
    """Not hollow: excluding the entries (entry_bias = -inf) changes the query's output of a
    compressed model, so the comparison above exercises the entries, not only raw tokens."""
    cfg, m = _random_model(M.DESIGNS["gated W8/S8 staggered"], seed=7)
    km = kernels.KernelModel(m)
    rng = np.random.default_rng(3)
    tokens, _, _ = M.make_batch(rng, cfg, 1)
    cap = {}
    km.forward(tokens[0, : cfg.context + 1], cap)
    c = cap[cfg.layers - 1]
    n = c["q"].shape[0]
    change = [np.abs(km.groups[cfg.layers - 1][h].decode_knocked(c["q"][n - 1], c["k"], c["v"], h)
                     - c["out"][n - 1, h]).max() for h in range(cfg.heads)]
    assert max(change) > 1e-2 * np.abs(c["v"]).max()  # far above the f32 bound (~3e-4)


def test_study_smoke(tmp_path):
    """The study's smoke mode end to end: trains every design a few steps, evaluates through
    the kernels, writes the page and the figure."""
    r = subprocess.run([sys.executable, os.path.join(EXAMPLE, "study.py"), "--smoke", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    page = (tmp_path / "trained_models.md").read_text()
    assert "SMOKE RUN" in page
    for name in M.DESIGNS:
        assert name in page
    assert (tmp_path / "trained_models.svg").exists()
    assert (tmp_path / "trained_models_results.json.gz").exists()


def test_spread_init_survives_model_initialization():
    """The phase-spread bias is in the gates the model trains from (a regression: a generic
    re-initialization of 2-D parameters once erased it)."""
    cfg = M.ModelConfig()
    with_spread = M.Model(cfg, M.DESIGNS["gated W8/S8 staggered + spread init"])
    without = M.Model(cfg, M.DESIGNS["gated W8/S8 staggered"])
    for blk in with_spread.blocks:
        kb = blk.attn.key_pool.gate_bias.detach()
        vb = blk.attn.value_pool.gate_bias.detach()
        assert (kb[:, 0] == 0.5).all() and (vb[:, 1] == 0.5).all()  # O_h = h: phase h at 0
        assert kb.abs().sum() == 0.5 * cfg.heads and vb.abs().sum() == 0.5 * cfg.heads
    for blk in without.blocks:
        assert blk.attn.key_pool.gate_bias.abs().sum() == 0
    uni = M.Model(cfg, M.DESIGNS["gated W8/S8 + spread init"])
    kb = uni.blocks[0].attn.key_pool.gate_bias.detach()
    assert [int(kb[h].argmax()) for h in range(cfg.heads)] == list(range(cfg.heads))
