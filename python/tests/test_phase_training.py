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
import study  # noqa: E402

U = 2.0**-24

# The study's regimes (R1: 2 layers, L = 16; R2-1L: 1 layer, L = 0).
CONFIGS = {name: r.cfg for name, r in study.REGIMES.items()}


@pytest.fixture(autouse=True)
def one_torch_thread():
    """These models are tiny: torch's thread pool only adds synchronization (tens of ms per
    call on a loaded 2-core machine), so the tests run torch on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def gamma(k):
    return k * U / (1 - k * U)


def _random_model(design, seed, cfg=None):
    torch.manual_seed(seed)
    cfg = cfg or M.ModelConfig()
    m = M.Model(cfg, design)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "gate" in name:  # sharp, head- and offset-dependent gates (not near uniform)
                p.normal_(0, 1.0)
        for blk in m.blocks:  # logits of order 1..10, not near-uniform softmaxes
            blk.attn.qkv.weight.mul_(20)
    m.eval()
    return cfg, m


@pytest.mark.parametrize("local", sorted({c.local for c in CONFIGS.values()}))
@pytest.mark.parametrize("name", list(M.DESIGNS))
def test_masks_follow_phasekv_geometry(name, local):
    """The torch masks are DESIGN.md's visibility: the same sets phasekv.Geometry.visible
    lists, for every head (its own origin) and every n, with the study's two local windows."""
    design = M.DESIGNS[name]
    cfg = M.ModelConfig(local=local)
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


@pytest.mark.parametrize("regime", list(CONFIGS))
@pytest.mark.parametrize("name", list(M.DESIGNS))
def test_torch_forward_matches_phasekv_kernels(name, regime):
    """Per layer, the same q/k/v through the torch attention (compressor + masked softmax)
    and through phasekv (CompressedCache streaming, prefill and decode) agree within the f32
    bound; the end-to-end logits and predictions agree too."""
    design = M.DESIGNS[name]
    cfg, m = _random_model(design, seed=7, cfg=CONFIGS[regime])
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
    group = km.groups[cfg.layers - 1]
    change = [np.abs(group[h].without_entries(c["q"], c["k"], c["v"], h)[n - 1]
                     - c["out"][n - 1, h]).max() for h in range(cfg.heads)]
    assert max(change) > 1e-2 * np.abs(c["v"]).max()  # far above the f32 bound (~3e-4)


def test_knockouts_through_the_kernels_match_torch():
    """KernelModel.outcomes (the study's knockouts, every layer, propagated through the later
    layers by the kernels) against the torch model with the same change: zeroing head h of
    layer l is the torch forward with head_masks; excluding head h's entries is the torch
    forward with that head's entry logits at -inf (a mask without its entries). Compared where
    the torch logits have a clear top class."""
    cfg, m = _random_model(M.DESIGNS["gated W8/S8 staggered"], seed=5)
    km = kernels.KernelModel(m)
    rng = np.random.default_rng(11)
    tokens, _, _ = M.make_batch(rng, cfg, 3)
    seqs = tokens[:, : cfg.context + 1]
    with torch.no_grad():
        logits = m(seqs)[:, -1]
    answers = logits.argmax(-1).tolist()
    res = [km.outcomes(seqs[b], answers[b], list(range(cfg.layers))) for b in range(3)]
    assert all(r["base"] for r in res)
    checked = 0
    for li in range(cfg.layers):
        attn = m.blocks[li].attn
        for h in range(cfg.heads):
            masks = torch.ones(cfg.layers, cfg.heads)
            masks[li, h] = 0
            saved = attn.entry_mask.clone()
            with torch.no_grad():
                zeroed = m(seqs, masks)[:, -1]
                attn.entry_mask[h] = False
                knocked = m(seqs)[:, -1]
                attn.entry_mask.copy_(saved)
            for out, key in ((zeroed, "zeroed"), (knocked, "knocked")):
                for b in range(3):
                    top2 = torch.topk(out[b], 2).values
                    if top2[0] - top2[1] > 1e-3 * out[b].abs().max():
                        assert res[b]["layers"][li][key][h] == (int(out[b].argmax())
                                                                == answers[b]), (b, li, h, key)
                        checked += 1
    assert checked >= 0.9 * 3 * cfg.layers * cfg.heads * 2


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
    for regime in study.REGIMES:
        assert f"## {regime}:" in page
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
