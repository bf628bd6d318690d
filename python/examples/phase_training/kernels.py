"""The trained models' forward pass with every attention layer run by phasekv's kernels.

Per layer, the keys and values of a sequence are streamed into phasekv.CompressedCache
objects (the compressor runs inside the cache: phasekv.UniformMean, or phasekv.GatedPool
reading the model's trained gate parameters in place); the positions before the query are
attended with phasekv.prefill over the raw K/V and the cache's entries, and the query
position with phasekv.decode over the cache. A model with per-head origins uses one
single-head cache per KV head, each with its own origin in its policy's geometry (exactly
the per-head-origin semantics of DESIGN.md). Uncompressed models use the same kernels
without a geometry (plain causal attention).

Everything else (embeddings, projections, layer norms, MLPs) is the torch model's own code,
run without autograd.
"""

import math

import numpy as np
import torch

import phasekv as pk

from model import Model


class _Group:
    """KV heads [lo, hi) sharing one cache (all heads, or one head with its own origin)."""

    def __init__(self, attn, lo, hi, origin, threads):
        cfg, design = attn.cfg, attn.design
        self.lo, self.hi, self.threads = lo, hi, threads
        self.local = cfg.local
        self.cache = None
        self.geometry = None
        self.params = []  # keeps the gate arrays alive while the policies read them
        if not design.compressed:
            return
        g = pk.Geometry(design.window, design.stride, origin)
        self.geometry = g
        d = cfg.head_dim
        if design.pooling == "mean":
            kp = vp = pk.UniformMean(g, d)
        else:
            pols = []
            for pool in (attn.key_pool, attn.value_pool):
                z = pool.gate_weight.detach()[lo:hi].numpy()[:, :, None, :].copy()  # [h, W, 1, d]
                b = pool.gate_bias.detach()[lo:hi].numpy()[:, :, None].copy()  # [h, W, 1]
                self.params += [z, b]
                pols.append(pk.GatedPool(g, hi - lo, d, d, "scalar", gate_weight=z,
                                         gate_bias=b))
            kp, vp = pols
        self.cache = pk.CompressedCache(kp, vp, kv_heads=hi - lo, d_k=d, d_v=d,
                                        local=cfg.local, max_length=cfg.length)

    def run(self, q, k, v, out, last_only=False):
        """Attention of q [n, H, d] over k/v [n, H, d] for this group's heads into out
        (last_only: the last position only, the others left as they are)."""
        n = q.shape[0]
        hs = slice(self.lo, self.hi)
        qh = np.ascontiguousarray(q[:, hs])
        if self.cache is None:
            if n > 1 and not last_only:
                o, _ = pk.prefill(qh[: n - 1], k[:, hs], v[:, hs], first=0, threads=self.threads)
                out[: n - 1, hs] = o
            o, _ = pk.decode_arrays(qh[n - 1], k[:, hs], v[:, hs], n, threads=self.threads)
            out[n - 1, hs] = o
            return
        self.cache.clear()
        self.cache.append(k[:, hs], v[:, hs])  # streaming: entries emitted as windows complete
        if n > 1 and not last_only:
            o, _ = pk.prefill(qh[: n - 1], k[:, hs], v[:, hs], first=0,
                              entry_k=self.cache.entry_keys(), entry_v=self.cache.entry_values(),
                              geometry=self.geometry, local=self.local, threads=self.threads)
            out[: n - 1, hs] = o
        o, _ = pk.decode(qh[n - 1], self.cache, threads=self.threads)
        out[n - 1, hs] = o

    def without_entries(self, q, k, v, head):
        """Head `head`'s output [n, d] at every position with its compressed entries excluded
        from its softmax (entry_bias = -inf), the knockout of phasekv's specialization map
        (phasekv/eval/specialization.hpp); None for an uncompressed model. The cache must hold
        this sequence (run() was called on it)."""
        if self.cache is None:
            return None
        i = head - self.lo
        ek, ev = self.cache.entry_keys(), self.cache.entry_values()
        o, _ = pk.prefill(np.ascontiguousarray(q[:, head:head + 1]), k[:, head:head + 1],
                          v[:, head:head + 1], first=0, entry_k=ek[:, i:i + 1],
                          entry_v=ev[:, i:i + 1], geometry=self.geometry, local=self.local,
                          entry_bias=-math.inf, threads=self.threads)
        return o[:, 0]


class KernelModel:
    """A trained Model whose attention runs through phasekv (see the module docstring)."""

    def __init__(self, model: Model, threads: int = 1):
        self.model = model
        cfg, design = model.cfg, model.design
        self.cfg = cfg
        self.groups = []
        for blk in model.blocks:
            if design.staggered:
                origins = design.origins(cfg.heads)
                gs = [_Group(blk.attn, h, h + 1, origins[h], threads) for h in range(cfg.heads)]
            else:
                gs = [_Group(blk.attn, 0, cfg.heads, 0, threads)]
            self.groups.append(gs)

    def _qkv(self, attn, x):
        q, k, v = attn.qkv_heads(x[None])
        return (np.ascontiguousarray(a[0].numpy(), dtype=np.float32) for a in (q, k, v))

    def _layer(self, li, x, capture=None, last_only=False):
        """Layer li of the residual stream x [n, d_model]: attention through the kernels, then
        the MLP (last_only: only the last position's attention output is computed, the rest
        left at zero; the caller reads the last position only)."""
        blk = self.model.blocks[li]
        n = x.shape[0]
        q, k, v = self._qkv(blk.attn, blk.ln1(x))
        out = np.zeros((n, self.cfg.heads, self.cfg.head_dim), np.float32)
        for g in self.groups[li]:
            g.run(q, k, v, out, last_only=last_only)
        if capture is not None:
            capture[li] = dict(q=q, k=k, v=v, out=out.copy(), x=x.clone())
        return self._after_attention(li, x, out)

    def _after_attention(self, li, x, out):
        """x + attention projection + MLP; x [..., n, d_model], out [..., n, H, d] numpy."""
        blk = self.model.blocks[li]
        o = torch.from_numpy(np.ascontiguousarray(out))
        x = x + blk.attn.proj(o.reshape(*o.shape[:-2], -1))
        return x + blk.mlp(blk.ln2(x))

    def _predictions(self, li, x, outs):
        """The predicted token at the last position for each of A alternative attention
        outputs outs [A, n, H, d] of layer li (input x [n, d_model]); the later layers run
        through the kernels, batched in torch around them."""
        m = self.model
        last = len(m.blocks) - 1
        if li == last:  # only the last position matters
            x = self._after_attention(li, x[-1:], outs[:, -1:])
        else:
            x = self._after_attention(li, x, outs)
        for lj in range(li + 1, len(m.blocks)):
            blk = m.blocks[lj]
            a, n = x.shape[:2]
            q, k, v = (np.ascontiguousarray(t.numpy(), dtype=np.float32)
                       for t in blk.attn.qkv_heads(blk.ln1(x)))
            out = np.zeros((a, n, self.cfg.heads, self.cfg.head_dim), np.float32)
            for i in range(a):
                for g in self.groups[lj]:
                    g.run(q[i], k[i], v[i], out[i], last_only=lj == last)
            x = self._after_attention(lj, x[:, -1:] if lj == last else x,
                                      out[:, -1:] if lj == last else out)
        return m.head(m.ln_f(x[:, -1])).argmax(-1).tolist()

    @torch.no_grad()
    def forward(self, tokens, capture=None):
        """Logits [n, vocab] of one sequence (int tokens [n]). capture: a dict that receives,
        per layer, the q/k/v and attention outputs ([n, H, d] numpy arrays) and the layer's
        input x."""
        m = self.model
        tokens = torch.as_tensor(tokens)
        n = tokens.shape[0]
        x = m.embed_tokens(tokens) + m.pos.weight[:n]
        for li in range(len(m.blocks)):
            x = self._layer(li, x, capture)
        return m.head(m.ln_f(x)).numpy()

    @torch.no_grad()
    def outcomes(self, tokens, answer, layers):
        """Runs one sequence (the query at its last position) and returns correct/incorrect
        outcomes at the query position: 'base' (the intact model) and, per layer li in
        `layers`, a dict with 'zeroed'[h] (head h of layer li outputs zero at every position),
        'knocked'[h] (head h attends without its compressed entries at every position; None
        for uncompressed models), 'none' (every head of the layer without its entries) and
        'alone'[h] (every head but h without its entries). The layers after li are rerun
        through the kernels on the changed residual stream."""
        m, cfg = self.model, self.cfg
        cap = {}
        logits = self.forward(tokens, cap)
        res = {"base": int(np.argmax(logits[-1])) == answer, "layers": {}}
        for li in layers:
            c = cap[li]
            for g in self.groups[li]:  # the caches hold the last run: refill layer li's
                g.run(c["q"], c["k"], c["v"], np.zeros_like(c["out"]), last_only=True)
            h_all = range(cfg.heads)
            outs = []
            for h in h_all:
                o = c["out"].copy()
                o[:, h] = 0
                outs.append(o)
            if m.design.compressed:
                without = []
                for h in h_all:
                    g = next(g for g in self.groups[li] if g.lo <= h < g.hi)
                    without.append(g.without_entries(c["q"], c["k"], c["v"], h))
                none = np.stack(without, 1)
                for h in h_all:
                    o = c["out"].copy()
                    o[:, h] = without[h]
                    outs.append(o)
                outs.append(none)
                for h in h_all:
                    o = none.copy()
                    o[:, h] = c["out"][:, h]
                    outs.append(o)
            ok = [p == answer for p in self._predictions(li, c["x"], np.stack(outs))]
            hn = cfg.heads
            res["layers"][li] = {"zeroed": ok[:hn], "knocked": None, "none": None,
                                 "alone": None}
            if m.design.compressed:
                res["layers"][li].update(knocked=ok[hn:2 * hn], none=ok[2 * hn],
                                         alone=ok[2 * hn + 1:])
        return res
