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

    def run(self, q, k, v, out, entry_bias=0.0):
        """Attention of q [n, H, d] over k/v [n, H, d] for this group's heads into out."""
        n = q.shape[0]
        hs = slice(self.lo, self.hi)
        qh = np.ascontiguousarray(q[:, hs])
        if self.cache is None:
            if n > 1:
                o, _ = pk.prefill(qh[: n - 1], k[:, hs], v[:, hs], first=0, threads=self.threads)
                out[: n - 1, hs] = o
            o, _ = pk.decode_arrays(qh[n - 1], k[:, hs], v[:, hs], n, threads=self.threads)
            out[n - 1, hs] = o
            return
        self.cache.clear()
        self.cache.append(k[:, hs], v[:, hs])  # streaming: entries emitted as windows complete
        ek, ev = self.cache.entry_keys(), self.cache.entry_values()
        if n > 1:
            o, _ = pk.prefill(qh[: n - 1], k[:, hs], v[:, hs], first=0, entry_k=ek, entry_v=ev,
                              geometry=self.geometry, local=self.local, entry_bias=entry_bias,
                              threads=self.threads)
            out[: n - 1, hs] = o
        o, _ = pk.decode(qh[n - 1], self.cache, entry_bias=entry_bias, threads=self.threads)
        out[n - 1, hs] = o

    def decode_knocked(self, q_last, k, v, head):
        """The query position's output of one head of this group with its compressed entries
        excluded from its softmax (entry_bias = -inf), the knockout of phasekv's
        specialization map (phasekv/eval/specialization.hpp)."""
        n = k.shape[0]
        if self.cache is None:
            return None
        i = head - self.lo
        ek, ev = self.cache.entry_keys(), self.cache.entry_values()
        o, _ = pk.decode_arrays(np.ascontiguousarray(q_last[head:head + 1]),
                                k[:, head:head + 1], v[:, head:head + 1], n,
                                ek[:, i:i + 1], ev[:, i:i + 1], geometry=self.geometry,
                                local=self.local, entry_bias=-math.inf, threads=self.threads)
        return o[0]


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

    @torch.no_grad()
    def forward(self, tokens, capture=None):
        """Logits [n, vocab] of one sequence (int tokens [n]). capture: a dict that receives,
        per layer, the q/k/v and attention outputs ([n, H, d] numpy arrays)."""
        m, cfg = self.model, self.cfg
        tokens = torch.as_tensor(tokens)
        n = tokens.shape[0]
        x = m.embed_tokens(tokens) + m.pos.weight[:n]
        for li, blk in enumerate(m.blocks):
            q, k, v = self._qkv(blk.attn, blk.ln1(x))
            out = np.zeros((n, cfg.heads, cfg.head_dim), np.float32)
            for g in self.groups[li]:
                g.run(q, k, v, out)
            if capture is not None:
                capture[li] = dict(q=q, k=k, v=v, out=out.copy(), x=x.clone())
            x = x + blk.attn.proj(torch.from_numpy(out).reshape(n, -1))
            x = x + blk.mlp(blk.ln2(x))
        return m.head(m.ln_f(x)).numpy()

    @torch.no_grad()
    def last_layer_outcomes(self, tokens, answer):
        """Runs one sequence (the query at its last position) and returns a dict of
        correct/incorrect outcomes at the query position: 'base' (the intact model),
        'zeroed'[h] (head h of the last layer outputs zero), 'knocked'[h] (head h of the last
        layer attends without its compressed entries; None for uncompressed models) and
        'none' (every head of the last layer without its entries) and 'alone'[h] (every head
        but h without its entries)."""
        m, cfg = self.model, self.cfg
        cap = {}
        logits = self.forward(tokens, cap)
        last = cfg.layers - 1
        c = cap[last]
        blk = m.blocks[last]
        n = c["q"].shape[0]
        x_in = c["x"][n - 1]

        def predict(head_out):
            x = x_in + blk.attn.proj(torch.from_numpy(head_out.reshape(-1)))
            x = x + blk.mlp(blk.ln2(x))
            return int(m.head(m.ln_f(x)).argmax())

        base = int(np.argmax(logits[n - 1]))
        res = {"base": base == answer, "zeroed": [], "knocked": None, "none": None,
               "alone": None}
        out_last = c["out"][n - 1]
        for h in range(cfg.heads):
            o = out_last.copy()
            o[h] = 0
            res["zeroed"].append(predict(o) == answer)
        if m.design.compressed:
            knocked = []
            all_out = out_last.copy()
            for h in range(cfg.heads):
                g = next(g for g in self.groups[last] if g.lo <= h < g.hi)
                o = out_last.copy()
                o[h] = g.decode_knocked(c["q"][n - 1], c["k"], c["v"], h)
                all_out[h] = o[h]
                knocked.append(predict(o) == answer)
            res["knocked"] = knocked
            res["none"] = predict(all_out) == answer
            alone = []  # every head but h without its entries
            for h in range(cfg.heads):
                o = all_out.copy()
                o[h] = out_last[h]
                alone.append(predict(o) == answer)
            res["alone"] = alone
        return res
