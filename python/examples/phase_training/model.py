"""Tiny decoder-only transformers whose attention reads a chunked-compressed KV cache, written
in torch for autograd, and the synthetic retrieval corpus they are trained on.

Visibility follows phasekv's contract (DESIGN.md, docs/index.md): for KV head h with geometry
(W, S, O_h) and local window L, a query at position t (n = t + 1 tokens) sees the raw prefix
[0, min(n, O_h)), the compressed entries j < J(n) (window j covers [O_h + jS, O_h + jS + W)),
and the raw positions [max(min(n, O_h), min(O_h + J(n) S, n - L)), n). Entries are pooled
from the layer's keys and values with the design's compressor: the mean over the window
(phasekv.UniformMean) or learned scalar gates per head and offset, s_i = z_i . x_i + b_i,
alpha = softmax over the window, entry = sum_i alpha_i x_i (phasekv.GatedPool with
gates='scalar' and identity payload), separately for keys and values.
"""

import dataclasses
import math
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class Design:
    """One compression design. pooling: 'none' (uncompressed causal attention), 'mean' or
    'gated'. staggered: KV head h of every layer gets origin O_h = h * S / H. spread_init:
    the phase-spread initialization of docs/mitigations.md (head h starts with +0.5 on the key
    gate logit of the offset that serves absolute phase h * S / H and on the value gate logit
    of the offset after it)."""

    name: str
    pooling: str = "mean"
    window: int = 8
    stride: int = 8
    staggered: bool = False
    spread_init: bool = False

    def origins(self, heads: int) -> List[int]:
        if not self.staggered:
            return [0] * heads
        return [h * self.stride // heads for h in range(heads)]

    @property
    def compressed(self) -> bool:
        return self.pooling != "none"


# The study's designs. Memory per token (each compressed design, per KV head): 1/S compressed
# entries (a key and a value each) per token of context, plus a constant raw ring of
# max(W, L) tokens (+ O_h prefix tokens for staggered heads). W8/S8, W16/S8 and the staggered
# designs store the same 1/8 entry per token (equal memory); W8/S4 stores twice that.
DESIGNS = {
    d.name: d
    for d in [
        Design("full attention", pooling="none"),
        Design("mean W8/S8", pooling="mean"),
        Design("mean W8/S4 (overlap)", pooling="mean", window=8, stride=4),
        Design("mean W16/S8 (overlap)", pooling="mean", window=16, stride=8),
        Design("gated W8/S8", pooling="gated"),
        Design("gated W16/S8 (overlap)", pooling="gated", window=16, stride=8),
        Design("gated W8/S8 + spread init", pooling="gated", spread_init=True),
        Design("gated W8/S8 staggered", pooling="gated", staggered=True),
        Design("gated W8/S8 staggered + spread init", pooling="gated", staggered=True,
               spread_init=True),
    ]
}


def entries_per_token(design: Design) -> float:
    """Compressed entries stored per token of context per KV head (0 for full attention, which
    keeps every token raw)."""
    return 1.0 / design.stride if design.compressed else 0.0


@dataclass(frozen=True)
class ModelConfig:
    """task 'R1': stored records (the paper's R1): a record token carries a key and its value
    at one position (factorized embedding: key table + value table); fillers carry a value and
    no key; a query token carries a key and no value, and the model predicts the value.
    task 'R2': induction (the paper's R2): a key token followed by its value token."""

    task: str = "R1"
    fillers: int = 24  # filler (and value) tokens 0 .. fillers - 1
    keys: int = 8  # key tokens fillers .. fillers + keys - 1
    context: int = 64  # context tokens; the first query sits at position `context`
    queries: int = 4  # key/value records in a context, each queried once after it
    layers: int = 2
    d_model: int = 64
    heads: int = 8
    head_dim: int = 8
    mlp: int = 128
    local: int = 16  # the raw local window L

    @property
    def vocab(self) -> int:
        """Input token ids (R1: (key slot, value slot) pairs, slot 0 / `fillers` = none)."""
        if self.task == "R1":
            return (self.keys + 1) * (self.fillers + 1)
        return self.fillers + self.keys

    @property
    def outputs(self) -> int:
        return self.fillers if self.task == "R1" else self.vocab

    @property
    def length(self) -> int:
        """Tokens of a training sequence (the model reads length - 1 of them for R2)."""
        return self.context + (self.queries if self.task == "R1" else 2 * self.queries)


def window_count(n: int, window: int, stride: int, origin: int) -> int:
    """J(n): complete windows after n tokens."""
    return (n - origin - window) // stride + 1 if n - origin >= window else 0


def visibility_masks(length: int, design: Design, heads: int, local: int):
    """Boolean masks (raw [H, T, T], entries [H, T, J]) of what query t sees, per KV head:
    the contract of DESIGN.md written out (the tests check it against phasekv.Geometry)."""
    t = np.arange(length)
    raw = np.zeros((heads, length, length), dtype=bool)
    if not design.compressed:
        raw[:] = t[None, :] <= t[:, None]
        return raw, np.zeros((heads, length, 0), dtype=bool)
    w, s = design.window, design.stride
    origins = design.origins(heads)
    jmax = max(window_count(length, w, s, o) for o in origins)
    ent = np.zeros((heads, length, jmax), dtype=bool)
    for h, o in enumerate(origins):
        for q in range(length):
            n = q + 1
            j = window_count(n, w, s, o)
            tail = min(n, o + j * s)
            lo = max(min(n, o), min(tail, n - local))
            raw[h, q, : min(n, o)] = True
            raw[h, q, lo:n] = True
            ent[h, q, :j] = True
    return raw, ent


class Compressor(nn.Module):
    """Pools the keys or values [B, H, T, d] of one layer into entries [B, H, J, d], each head
    with its own origin. Rows j >= J_h(T) of a head are filler (the masks never show them)."""

    def __init__(self, design: Design, heads: int, dim: int, branch: str):
        super().__init__()
        self.design = design
        self.origins = design.origins(heads)
        if design.pooling == "gated":
            w = design.window
            self.gate_weight = nn.Parameter(torch.randn(heads, w, dim) * 0.02)
            bias = torch.zeros(heads, w)
            if design.spread_init:
                for h, o in enumerate(self.origins):
                    phase = h * design.stride // heads
                    r = (phase - o) % design.stride
                    r = r if branch == "key" else r + 1
                    if r < w:
                        bias[h, r] += 0.5
            self.gate_bias = nn.Parameter(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[2]
        w, s = self.design.window, self.design.stride
        jmax = max(window_count(t, w, s, o) for o in self.origins)
        o = torch.tensor(self.origins).view(-1, 1, 1)
        idx = (o + s * torch.arange(jmax).view(1, -1, 1) + torch.arange(w).view(1, 1, -1))
        idx = idx.clamp(max=t - 1)  # [H, J, W]
        heads = torch.arange(len(self.origins)).view(-1, 1, 1)
        win = x[:, heads, idx]  # [B, H, J, W, d]
        if self.design.pooling == "mean":
            return win.mean(3)
        logits = torch.einsum("bhjwd,hwd->bhjw", win, self.gate_weight) + self.gate_bias[:, None]
        return torch.einsum("bhjwd,bhjw->bhjd", win, logits.softmax(-1))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, design: Design):
        super().__init__()
        self.cfg, self.design = cfg, design
        inner = cfg.heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * inner, bias=False)
        self.proj = nn.Linear(inner, cfg.d_model, bias=False)
        raw, ent = visibility_masks(cfg.length, design, cfg.heads, cfg.local)
        self.register_buffer("raw_mask", torch.from_numpy(raw), persistent=False)
        self.register_buffer("entry_mask", torch.from_numpy(ent), persistent=False)
        if design.compressed:
            self.key_pool = Compressor(design, cfg.heads, cfg.head_dim, "key")
            self.value_pool = Compressor(design, cfg.heads, cfg.head_dim, "value")

    def qkv_heads(self, x: torch.Tensor):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.cfg.heads, self.cfg.head_dim).unbind(2)
        return q, k, v  # [B, T, H, d] each

    def attend(self, q, k, v, head_mask: Optional[torch.Tensor] = None):
        """Attention of q over raw k/v and their compressed entries, [B, T, H, d] in and out."""
        t = q.shape[1]
        q, k, v = (a.transpose(1, 2) for a in (q, k, v))  # [B, H, T, d]
        raw_mask = self.raw_mask[:, :t, :t]
        if self.design.compressed:
            ek, ev = self.key_pool(k), self.value_pool(v)
            k = torch.cat([k, ek], 2)
            v = torch.cat([v, ev], 2)
            mask = torch.cat([raw_mask, self.entry_mask[:, :t, : ek.shape[2]]], 2)
        else:
            mask = raw_mask
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if head_mask is not None:
            out = out * head_mask.view(1, -1, 1, 1)
        return out.transpose(1, 2)

    def forward(self, x, head_mask=None):
        b, t, _ = x.shape
        return self.proj(self.attend(*self.qkv_heads(x), head_mask).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, design: Design):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg, design)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.mlp), nn.GELU(),
                                 nn.Linear(cfg.mlp, cfg.d_model))

    def forward(self, x, head_mask=None):
        x = x + self.attn(self.ln1(x), head_mask)
        return x + self.mlp(self.ln2(x))


class Model(nn.Module):
    """Pre-norm decoder with learned absolute position embeddings."""

    def __init__(self, cfg: ModelConfig, design: Design):
        super().__init__()
        self.cfg, self.design = cfg, design
        if cfg.task == "R1":
            self.key_embed = nn.Embedding(cfg.keys + 1, cfg.d_model)
        self.embed = nn.Embedding(cfg.vocab if cfg.task == "R2" else cfg.fillers + 1, cfg.d_model)
        self.pos = nn.Embedding(cfg.length, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, design) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.outputs, bias=False)
        for name, p in self.named_parameters():
            # the compressors' gates keep their own initialization (the spread bias included)
            if p.dim() == 2 and "gate_" not in name:
                nn.init.normal_(p, std=0.02)

    def embed_tokens(self, tokens):
        if self.cfg.task == "R1":
            v = self.cfg.fillers + 1
            return self.key_embed(tokens // v) + self.embed(tokens % v)
        return self.embed(tokens)

    def forward(self, tokens, head_masks=None):
        x = self.embed_tokens(tokens) + self.pos.weight[: tokens.shape[1]]
        for i, blk in enumerate(self.blocks):
            x = blk(x, None if head_masks is None else head_masks[i])
        return self.head(self.ln_f(x))


def make_batch(rng: np.random.Generator, cfg: ModelConfig, batch: int,
               targets: Optional[np.ndarray] = None):
    """A batch of the task's corpus: (tokens [B, length], key positions [B, queries] in query
    order, query positions [queries]); the answer to the query at position i is
    answers(tokens)[:, i]. targets: when given [batch], the key queried first sits at
    targets[b]."""
    if cfg.task == "R1":
        return _records_batch(rng, cfg, batch, targets)
    return _induction_batch(rng, cfg, batch, targets)


def _records_batch(rng, cfg, batch, targets):
    """R1: `context` tokens, fillers (no key, a random value) and `queries` records (a key and
    a random value) at distinct random positions, the keys distinct; then `queries` query
    tokens (a key, no value), one per record in random order (the planned target's first)."""
    c, m, v = cfg.context, cfg.queries, cfg.fillers + 1
    values = rng.integers(0, cfg.fillers, size=(batch, cfg.length))
    keyslot = np.zeros((batch, cfg.length), dtype=np.int64)
    keypos = np.zeros((batch, m), dtype=np.int64)
    for b in range(batch):
        if targets is not None:
            rest = rng.choice(np.setdiff1d(np.arange(c), [targets[b]]), size=m - 1, replace=False)
            pos = np.concatenate([[int(targets[b])], rest])
            order = np.concatenate([[0], 1 + rng.permutation(m - 1)])
        else:
            pos = rng.choice(c, size=m, replace=False)
            order = rng.permutation(m)
        keys = 1 + rng.choice(cfg.keys, size=m, replace=False)
        keyslot[b, pos] = keys
        keypos[b] = pos[order]
        keyslot[b, c + np.arange(m)] = keys[order]
        values[b, c + np.arange(m)] = cfg.fillers  # no value
    return torch.from_numpy(keyslot * v + values), keypos, c + np.arange(m)


def answers(cfg: ModelConfig, tokens: torch.Tensor, keypos) -> torch.Tensor:
    """The value each query asks for [B, queries]."""
    kp = torch.as_tensor(keypos)
    if cfg.task == "R1":
        return torch.gather(tokens, 1, kp) % (cfg.fillers + 1)
    return torch.gather(tokens, 1, kp + 1)


def _induction_batch(rng, cfg, batch, targets):
    """A batch of the key-value retrieval corpus (the paper's R2 shape, an induction task):
    `context` filler tokens hold `queries` key tokens (distinct, never adjacent, each once) at
    positions p; the token after a key is its value. Then each key is queried once in random
    order: position context + 2i holds a key, context + 2i + 1 its value, which the model
    predicts. targets: when given [batch], the key queried first sits at targets[b].

    Returns tokens [B, length] (int64), the key positions of each query [B, queries], and the
    answer positions (the query positions) [queries]."""
    c, m = cfg.context, cfg.queries
    tokens = rng.integers(0, cfg.fillers, size=(batch, cfg.length))
    keypos = np.zeros((batch, m), dtype=np.int64)
    for b in range(batch):
        while True:
            first = [int(targets[b])] if targets is not None else []
            rest = rng.choice(c - 1, size=m - len(first), replace=False)
            pos = np.array(first + list(rest))
            gaps = np.abs(pos[:, None] - pos[None, :]) + np.eye(m, dtype=np.int64) * 10
            if len(set(pos.tolist())) == m and gaps.min() >= 2:
                break
        keypos[b] = pos
        keys = cfg.fillers + rng.choice(cfg.keys, size=m, replace=False)
        tokens[b, pos] = keys
        if targets is not None:  # the planned target is queried first
            order = np.concatenate([[0], 1 + rng.permutation(m - 1)])
        else:
            order = rng.permutation(m)
        keypos[b] = pos[order]
        tokens[b, c + 2 * np.arange(m)] = keys[order]
        tokens[b, c + 2 * np.arange(m) + 1] = tokens[b, pos[order] + 1]
    return torch.from_numpy(tokens), keypos, c + 2 * np.arange(m)


def loss_and_accuracy(model: Model, tokens: torch.Tensor, keypos, query_positions):
    inputs = tokens if model.cfg.task == "R1" else tokens[:, :-1]
    logits = model(inputs)
    qp = torch.as_tensor(query_positions)
    pred = logits[:, qp]  # [B, m, V]
    gold = answers(model.cfg, tokens, keypos)
    loss = F.cross_entropy(pred.reshape(-1, pred.shape[-1]), gold.reshape(-1))
    return loss, (pred.argmax(-1) == gold).float().mean().item()


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000
    batch: int = 32
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.01


def train(cfg: ModelConfig, design: Design, tcfg: TrainConfig, seed: int, log=None):
    """Trains one model from scratch with fixed seeds; returns (model, history)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = Model(cfg, design)
    opt = torch.optim.AdamW(model.parameters(), lr=tcfg.lr, weight_decay=tcfg.weight_decay,
                            betas=(0.9, 0.98))

    def lr_at(step):
        if step < tcfg.warmup:
            return (step + 1) / tcfg.warmup
        frac = (step - tcfg.warmup) / max(1, tcfg.steps - tcfg.warmup)
        return 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    history = []
    model.train()
    for step in range(tcfg.steps):
        tokens, keypos, qp = make_batch(rng, cfg, tcfg.batch)
        loss, acc = loss_and_accuracy(model, tokens, keypos, qp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == tcfg.steps - 1:
            history.append((step, loss.item(), acc))
            if log is not None:
                log(step, loss.item(), acc)
    model.eval()
    return model, history


def replace(cfg, **kw):
    return dataclasses.replace(cfg, **kw)
