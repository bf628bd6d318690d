"""phasekv.dsv4 (FlashMLA's sparse call, the DeepSeek-V4 sparse attention, the FP8 cache
formats) against float64 numpy references written here. The FP8 E4M3 / UE8M0 decoding and
FlashMLA's quantizer are written from the layout description in docs/deepseek_v4_engines.md,
not taken from the C++ code."""

import ml_dtypes
import numpy as np
import pytest

import phasekv as pk
from conftest import assert_releases_gil, poison

dsv4 = pk.dsv4

# ---- the formats, in numpy ------------------------------------------------------------------

MODEL1 = dict(dim=512, nope=448, tile=64, tiles=7, token=584, data=576)
V32 = dict(dim=576, nope=512, tile=128, tiles=4, token=656)


def e4m3_values():
    """The 256 E4M3 (E4M3FN) codes' values, float64: 1 sign, 4 exponent (bias 7), 3 mantissa
    bits; exponent 0 is m * 2^-9; S.1111.111 is NaN; no infinity."""
    c = np.arange(256)
    e, m = (c >> 3) & 15, c & 7
    v = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * 2.0 ** (e - 7.0))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return np.where(c & 0x80, -v, v)


E4M3 = e4m3_values()


def e4m3_encode(x):
    """float -> E4M3 codes, nearest with ties to the even code, saturating at 448."""
    x = np.asarray(x, np.float64)
    mags = E4M3[:127]  # codes 0..126, ascending
    a = np.minimum(np.abs(x), 448.0)
    hi = np.clip(np.searchsorted(mags, a), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    dlo, dhi = a - mags[lo], mags[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (pick | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)  # -0 keeps its sign


def ue8m0(e):
    e = np.asarray(e, np.float64)
    return np.where(e == 255, np.nan, 2.0 ** (e - 127))


def bf16_bits_to_f64(u16):
    return (np.asarray(u16, np.uint32) << 16).view(np.float32).astype(np.float64)


def f32_to_bf16_bits(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def tile_scale(amax):
    """FlashMLA's tile scale: the smallest power of two >= max(amax / 448, 1e-4) (in f32)."""
    s = np.maximum(np.float32(amax) / np.float32(448.0), np.float32(1e-4)).astype(np.float64)
    return 2.0 ** np.ceil(np.log2(s))


def quantize_token(fmt, x):
    """(data bytes, scale bytes) of one row x (float32 [dim]) in a FP8 format."""
    x = np.asarray(x, np.float32)
    codes = np.zeros(fmt["nope"], np.uint8)
    scales = []
    for t in range(fmt["tiles"]):
        seg = x[t * fmt["tile"]:(t + 1) * fmt["tile"]]
        s = tile_scale(np.abs(seg).max())
        scales.append(s)
        codes[t * fmt["tile"]:(t + 1) * fmt["tile"]] = e4m3_encode(seg.astype(np.float64) / s)
    rope = f32_to_bf16_bits(x[fmt["nope"]:]).view(np.uint8)
    if fmt is MODEL1:
        sb = np.array([int(np.log2(s)) + 127 for s in scales] + [0], np.uint8)
        return np.concatenate([codes, rope]), sb
    sb = np.array(scales, np.float32).view(np.uint8)
    return np.concatenate([codes, sb, rope]), None


def dequant_model1_block(block, P):
    """[P, 512] float64 values of a MODEL1 block's bytes."""
    data = block[:P * 576].reshape(P, 576)
    sc = ue8m0(block[P * 576:P * 584].reshape(P, 8)[:, :7])
    nope = E4M3[data[:, :448]] * np.repeat(sc, 64, axis=1)
    rope = bf16_bits_to_f64(data[:, 448:].copy().view("<u2"))
    return np.concatenate([nope, rope], axis=1)


def dequant_v32_rows(tokens):
    """[n, 576] float64 values of V3.2 tokens [n, 656] (bytes)."""
    tokens = np.ascontiguousarray(tokens)
    sc = tokens[:, 512:528].copy().view("<f4").astype(np.float64)
    nope = E4M3[tokens[:, :512]] * np.repeat(sc, 128, axis=1)
    rope = bf16_bits_to_f64(tokens[:, 528:].copy().view("<u2"))
    return np.concatenate([nope, rope], axis=1)


class Cache:
    """A paged latent cache of `blocks` blocks of P tokens in one format, poisoned with 0xA5 (the
    FP8 formats) or NaN, viewed as FlashMLA's [blocks, P, 1, width]."""

    def __init__(self, fmt, blocks, P, dim=None):
        self.fmt, self.blocks, self.P = fmt, blocks, P
        if fmt == "model1":
            self.block = dsv4.model1_block_bytes(P)
            self.buf = np.full((blocks, self.block), 0xA5, np.uint8)
            self.view = np.lib.stride_tricks.as_strided(
                self.buf, (blocks, P, 1, 584), (self.block, 584, 584, 1))
            self.dim = 512
        elif fmt == "v32":
            self.buf = np.full((blocks, P, 1, 656), 0xA5, np.uint8)
            self.view = self.buf
            self.dim = 576
        else:
            self.buf = np.full((blocks, P, 1, dim), np.nan, np.float32).astype(fmt)
            self.view = self.buf
            self.dim = dim

    def values(self):
        """[blocks * P, dim] float64 values of every slot."""
        if self.fmt == "model1":
            return np.concatenate([dequant_model1_block(b, self.P) for b in self.buf])
        if self.fmt == "v32":
            return dequant_v32_rows(self.buf.reshape(-1, 656))
        return self.buf.reshape(-1, self.dim).astype(np.float64)

    def write(self, rows, table, tokens, indptr):
        """Appends with the numpy quantizer (the expected bytes)."""
        for b in range(len(tokens)):
            for k in range(indptr[b], indptr[b + 1]):
                p = tokens[b] + k - indptr[b]
                blk, slot = table[b, p // self.P], p % self.P
                if self.fmt == "model1":
                    d, s = quantize_token(MODEL1, rows[k])
                    self.buf[blk, slot * 576:(slot + 1) * 576] = d
                    off = self.P * 576 + slot * 8
                    self.buf[blk, off:off + 8] = s
                elif self.fmt == "v32":
                    self.buf[blk, slot, 0] = quantize_token(V32, rows[k])[0]
                else:
                    self.buf[blk, slot, 0] = np.asarray(rows[k], np.float32).astype(self.fmt)


def spread_rows(rng, n, dim):
    """Rows whose 64-channel tiles span magnitudes (scales differ by tile), some tiny."""
    x = rng.standard_normal((n, dim)).astype(np.float32)
    mag = 2.0 ** rng.integers(-14, 6, size=(n, (dim + 63) // 64))
    return (x * np.repeat(mag, 64, axis=1)[:, :dim]).astype(np.float32)


PLAIN = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float16": np.float16}


def filled(rng, fmt, blocks, P, dim=64, scale=1.0):
    """A cache of `fmt` with every slot written by append_latent (one sequence per block)."""
    c = Cache(PLAIN.get(fmt, fmt), blocks, P, dim)
    rows = spread_rows(rng, blocks * P, c.dim) * np.float32(scale)
    table = np.arange(blocks, dtype=np.int32).reshape(blocks, 1)
    tokens = np.zeros(blocks, np.int64)
    indptr = (np.arange(blocks + 1) * P).astype(np.int32)
    dsv4.append_latent(rows, c.view, table, tokens, indptr)
    return c


# ---- cache formats: append and read ---------------------------------------------------------

@pytest.mark.parametrize("fmt", ["model1", "v32", "bfloat16", "float32"])
def test_append_latent_writes_the_formats_bytes(rng, fmt):
    P, blocks = 5, 9
    got = Cache(PLAIN.get(fmt, fmt), blocks, P, 64)
    want = Cache(PLAIN.get(fmt, fmt), blocks, P, 64)
    table = np.array([[7, 2, 5, 0], [8, 1, 3, 6]], np.int32)
    tokens = np.array([3, 11], np.int64)
    indptr = np.array([0, 9, 13], np.int32)
    rows = spread_rows(rng, 13, got.dim)
    before = got.buf.__array_interface__["data"][0]
    dsv4.append_latent(rows, got.view, table, tokens, indptr)
    want.write(rows, table, tokens, indptr)
    assert got.buf.__array_interface__["data"][0] == before
    if fmt in ("model1", "v32"):
        np.testing.assert_array_equal(got.buf, want.buf)  # untouched bytes stay 0xA5
    else:
        np.testing.assert_array_equal(got.buf.astype(np.float64), want.buf.astype(np.float64))


def test_append_latent_decode_rows_and_bf16_input(rng):
    c = Cache("model1", 3, 4)
    want = Cache("model1", 3, 4)
    rows = spread_rows(rng, 2, 512).astype(ml_dtypes.bfloat16)
    table = np.array([[2, 0], [1, 0]], np.int32)
    tokens = np.array([5, 0], np.int64)
    dsv4.append_latent(rows, c.view, table, tokens)  # decode: one row a sequence
    want.write(rows.astype(np.float32), table, tokens, np.array([0, 1, 2]))
    np.testing.assert_array_equal(c.buf, want.buf)


@pytest.mark.parametrize("fmt", ["model1", "v32", "bfloat16"])
def test_read_latent_matches_numpy_dequantization(rng, fmt):
    c = filled(rng, fmt, 3, 4)
    got = dsv4.read_latent(c.view)
    assert got.shape == (3, 4, c.dim) and got.dtype == np.float32
    np.testing.assert_array_equal(got.reshape(-1, c.dim).astype(np.float64), c.values())
    out = poison((3, 4, c.dim))
    assert dsv4.read_latent(c.view, out=out) is out
    np.testing.assert_array_equal(out, got)


def test_quantization_error_is_within_the_tile_bound(rng):
    c = Cache("model1", 2, 4)
    rows = spread_rows(rng, 8, 512)
    dsv4.append_latent(rows, c.view, np.array([[0, 1]], np.int32), np.zeros(1, np.int64),
                       np.array([0, 8], np.int32))
    v = c.values()
    err = np.abs(v[:, :448] - rows[:, :448])
    amax = np.repeat(np.abs(rows[:, :448]).reshape(8, 7, 64).max(axis=2), 64, axis=1)
    assert (err <= amax * 2.0 ** -4 + 1e-12).all()  # E4M3: 3 mantissa bits, scale <= 2 amax/448


# ---- flash_mla_with_kvcache -----------------------------------------------------------------

def ref_flash_mla(q, rows0, idx, lens, dv, scale, sink=None, rows1=None, eidx=None, elens=None):
    """float64 FlashMLA sparse decode: out [B, s_q, h, dv], lse [B, h, s_q]."""
    B, s_q, H, d = q.shape
    out = np.zeros((B, s_q, H, dv))
    lse = np.zeros((B, H, s_q))
    for b in range(B):
        for i in range(s_q):
            sel = [rows0[j] for j in idx[b, i, :lens[b]] if j >= 0]
            if rows1 is not None:
                sel += [rows1[j] for j in eidx[b, i, :elens[b]] if j >= 0]
            if not sel:
                lse[b, :, i] = np.inf
                continue
            K = np.array(sel)
            s = scale * (q[b, i].astype(np.float64) @ K[:, :d].T)  # [H, rows]
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            den = p.sum(axis=1, keepdims=True)
            l_ = (m + np.log(den))[:, 0]
            o = (p / den) @ K[:, :dv]
            if sink is not None:
                o = o / (1 + np.exp(sink.astype(np.float64) - l_))[:, None]
            out[b, i] = o
            lse[b, :, i] = l_
    return out, lse


def random_indices(rng, B, s_q, topk, rows, invalid=0.2):
    idx = rng.integers(0, rows, size=(B, s_q, topk)).astype(np.int32)
    idx[rng.random(idx.shape) < invalid] = -1
    return idx


@pytest.mark.parametrize("fmt,d,dv", [("model1", 512, 512), ("v32", 576, 512),
                                      ("bfloat16", 64, 48), ("float32", 40, 40)])
def test_flash_mla_with_kvcache_matches_float64(rng, fmt, d, dv):
    B, s_q, H, P = 3, 2, 5, 4
    k0 = filled(rng, fmt, 6, P, dim=d)
    k1 = filled(rng, fmt, 2, P, dim=d)
    q = rng.standard_normal((B, s_q, H, d)).astype(np.float32)
    idx = random_indices(rng, B, s_q, 10, 6 * P)
    idx[2, 1] = -1  # a query with nothing but its extra rows
    lens = np.array([10, 4, 7], np.int32)
    eidx = random_indices(rng, B, s_q, 3, 2 * P)
    elens = np.array([3, 0, 3], np.int32)
    sink = rng.standard_normal(H).astype(np.float32)
    scale = 0.07
    out = poison((B, s_q, H, dv))
    lse = poison((B, H, s_q))
    got_out, got_lse = dsv4.flash_mla_with_kvcache(
        q, k0.view, None, None, dv, None, softmax_scale=scale, indices=idx, attn_sink=sink,
        extra_k_cache=k1.view, extra_indices_in_kvcache=eidx, topk_length=lens,
        extra_topk_length=elens, out=out, lse=lse)
    assert got_out is out and got_lse is lse
    r_out, r_lse = ref_flash_mla(q, k0.values(), idx, lens, dv, scale, sink, k1.values(), eidx,
                                 elens)
    vmax = np.abs(k0.values()).max()
    np.testing.assert_allclose(out, r_out, rtol=0, atol=1e-5 * vmax)
    np.testing.assert_allclose(lse, r_lse, rtol=1e-5, atol=1e-4)


def test_flash_mla_defaults_and_empty_queries(rng):
    P = 8
    k0 = filled(rng, "model1", 2, P)
    q = rng.standard_normal((1, 2, 3, 512)).astype(np.float32)
    idx = random_indices(rng, 1, 2, 5, 2 * P, invalid=0.0)
    idx[0, 1] = -1
    out, lse = dsv4.flash_mla_with_kvcache(q, k0.view, indices=idx, head_dim_v=512)
    r_out, r_lse = ref_flash_mla(q, k0.values(), idx, [5], 512, 512 ** -0.5)
    np.testing.assert_allclose(out, r_out, rtol=0, atol=1e-5 * np.abs(k0.values()).max())
    np.testing.assert_allclose(lse, r_lse, rtol=1e-5)
    assert np.isposinf(lse[0, :, 1]).all() and (out[0, 1] == 0).all()


# ---- sparse_attention -----------------------------------------------------------------------

def ref_sparse(q, raw, ents, first, window, idx=None, count=None, ratio=0, dv=None, scale=None,
               sinks=None, raw_first=0, ent_first=0):
    T, H, d = q.shape
    dv = d if dv is None else dv
    scale = d ** -0.5 if scale is None else scale
    out = np.zeros((T, H, dv))
    lse = np.full((T, H), -np.inf)
    for qi in range(T):
        t = first + qi
        if idx is not None:
            js = [j for j in idx[qi] if j >= 0]
        else:
            c = count if ratio == 0 else max(0, min(count, (t + 1) // ratio - ent_first))
            js = list(range(ent_first, ent_first + c))
        sel = [ents[j - ent_first] for j in js]
        if window > 0:
            sel += [raw[p - raw_first] for p in range(max(0, t + 1 - window), t + 1)]
        if not sel and sinks is None:
            continue
        K = np.array(sel).reshape(-1, raw.shape[1])
        s = scale * (q[qi].astype(np.float64) @ K[:, :d].T)
        alls = s if sinks is None else np.concatenate([s, sinks[:, None].astype(np.float64)], 1)
        m = alls.max(axis=1, keepdims=True)
        den = np.exp(alls - m).sum(axis=1, keepdims=True)
        out[qi] = (np.exp(s - m) / den) @ K[:, :dv]
        lse[qi] = (m + np.log(den))[:, 0]
    return out, lse


@pytest.mark.parametrize("fmt,d", [("bfloat16", 64), ("float16", 32), ("v32", 576),
                                   ("model1", 512)])
def test_sparse_attention_with_indices(rng, fmt, d):
    T, H, window, first = 3, 6, 5, 20
    raw = filled(rng, fmt, 4, 8, dim=d)  # positions 0..31 in blocks of 8
    ent = filled(rng, fmt, 2, 8, dim=d)  # entries 0..15
    if fmt == "v32" or fmt in PLAIN:
        raw_arr, ent_arr = raw.view.reshape(32, -1), ent.view.reshape(16, -1)  # one run of rows
    else:
        raw_arr, ent_arr = raw.view, ent.view  # MODEL1: blocks
    q = rng.standard_normal((T, H, d)).astype(np.float32)
    idx = random_indices(rng, T, 1, 6, 16).reshape(T, 6)
    sinks = rng.standard_normal(H).astype(np.float32)
    out, lse = dsv4.sparse_attention(q, raw_arr, ent_arr, idx, first_position=first,
                                     window=window, sinks=sinks, dim_v=d - 16)
    r_out, r_lse = ref_sparse(q, raw.values(), ent.values(), first, window, idx=idx, dv=d - 16,
                              sinks=sinks)
    vmax = np.abs(raw.values()).max() + np.abs(ent.values()).max()
    np.testing.assert_allclose(out, r_out, rtol=0, atol=2e-5 * vmax)
    np.testing.assert_allclose(lse, r_lse, rtol=1e-5, atol=1e-4)


def test_sparse_attention_hca_ratio_and_scales(rng):
    T, H, d, first = 6, 4, 64, 10
    raw = rng.standard_normal((32, d)).astype(ml_dtypes.bfloat16)
    ent = rng.standard_normal((8, d)).astype(ml_dtypes.bfloat16)
    q = rng.standard_normal((T, H, d)).astype(np.float32)
    out = poison((T, H, d))
    lse = poison((T, H))
    dsv4.sparse_attention(q, raw, ent, first_position=first, window=4, ratio=4, raw_scale=0.5,
                          entry_scale=2.0, entries_first=0, out=out, lse=lse)
    r_out, r_lse = ref_sparse(q, raw.astype(np.float64) * 0.5, ent.astype(np.float64) * 2.0,
                              first, 4, count=8, ratio=4)
    np.testing.assert_allclose(out, r_out, rtol=0, atol=1e-4)
    np.testing.assert_allclose(lse, r_lse, rtol=1e-5, atol=1e-5)


def test_sparse_attention_reads_the_callers_memory(rng):
    raw = rng.standard_normal((16, 32)).astype(np.float32)
    q = rng.standard_normal((1, 2, 32)).astype(np.float32)
    out, lse = dsv4.sparse_attention(q, raw, first_position=15, window=16)
    raw[0] = 0  # the kernel read this array, so changing it changes the answer
    out2, _ = dsv4.sparse_attention(q, raw, first_position=15, window=16)
    assert not np.array_equal(out, out2)
    assert pk._core._data_pointer(raw) == raw.__array_interface__["data"][0]


# ---- bad input: named, nothing written ------------------------------------------------------

def flash_args(rng):
    k0 = filled(rng, "bfloat16", 2, 4, dim=32)
    q = rng.standard_normal((1, 1, 2, 32)).astype(np.float32)
    idx = np.array([[[0, 3, -1]]], np.int32)
    return q, k0, idx


@pytest.mark.parametrize("change,exc,name", [
    (lambda a: a.update(q=a["q"].astype(np.float64)), TypeError, "q"),
    (lambda a: a.update(q=a["q"][..., ::2]), ValueError, "q"),
    (lambda a: a.update(indices=a["indices"].astype(np.int64)), TypeError, "indices"),
    (lambda a: a.update(indices=a["indices"][:, :, :, None]), ValueError, "indices"),
    (lambda a: a.update(indices=np.array([[[0, 8, -1]]], np.int32)), ValueError, "indices"),
    (lambda a: a.update(k_cache=np.zeros((2, 4, 1, 600), np.uint8)), ValueError, "k_cache"),
    (lambda a: a.update(k_cache=np.zeros((2, 4, 1, 32), np.int16)), TypeError, "k_cache"),
    (lambda a: a.update(k_cache=np.zeros((2, 4, 1, 16), np.float32)), ValueError, "k_cache"),
    (lambda a: a.update(topk_length=np.array([4], np.int32)), ValueError, "topk_length"),
    (lambda a: a.update(topk_length=np.array([1, 1], np.int32)), ValueError, "topk_length"),
    (lambda a: a.update(attn_sink=np.zeros(3, np.float32)), ValueError, "attn_sink"),
    (lambda a: a.update(out=np.zeros((1, 1, 2, 31), np.float32)), ValueError, "out"),
    (lambda a: a.update(lse=np.zeros((1, 2, 1), np.float64)), TypeError, "lse"),
    (lambda a: a.update(block_table=np.zeros((1, 1), np.int32)), ValueError, "block_table"),
    (lambda a: a.update(causal=True), ValueError, "causal"),
    (lambda a: a.update(is_fp8_kvcache=True), ValueError, "is_fp8_kvcache"),
    (lambda a: a.update(extra_topk_length=np.array([1], np.int32)), ValueError,
     "extra_topk_length"),
])
def test_flash_mla_bad_input_is_named_and_writes_nothing(rng, change, exc, name):
    q, k0, idx = flash_args(rng)
    a = dict(q=q, k_cache=k0.view, indices=idx, head_dim_v=32, out=poison((1, 1, 2, 32)),
             lse=poison((1, 2, 1)))
    change(a)
    out, lse = a["out"], a["lse"]
    before = out.copy(), lse.copy()
    with pytest.raises(exc, match=name):
        dsv4.flash_mla_with_kvcache(**a)
    assert np.array_equal(out, before[0], equal_nan=True)
    assert np.array_equal(lse, before[1], equal_nan=True)


def test_append_latent_bad_input_is_named_and_writes_nothing(rng):
    c = Cache("model1", 2, 4)
    table = np.array([[0, 1]], np.int32)
    tokens = np.zeros(1, np.int64)
    rows = spread_rows(rng, 3, 512)
    indptr = np.array([0, 3], np.int32)
    cases = [
        (dict(rows=rows.astype(np.int32)), TypeError, "rows"),
        (dict(rows=np.ascontiguousarray(rows[:, :500])), ValueError, "cache"),
        (dict(rows=rows[:, ::2]), ValueError, "rows"),
        (dict(rows=rows[:2]), ValueError, "rows"),
        (dict(block_table=table.astype(np.int64)), TypeError, "block_table"),
        (dict(block_table=np.array([[5, 0]], np.int32)), ValueError, "table"),
        (dict(tokens=np.array([6], np.int64)), ValueError, "table"),
        (dict(tokens=tokens.astype(np.int32)), TypeError, "tokens"),
        (dict(chunk_indptr=np.array([1, 3], np.int32)), ValueError, "chunk_indptr"),
    ]
    for change, exc, name in cases:
        a = dict(rows=rows, cache=c.view, block_table=table, tokens=tokens, chunk_indptr=indptr)
        a.update(change)
        with pytest.raises(exc, match=name):
            dsv4.append_latent(**a)
        assert (c.buf == 0xA5).all(), (change, name)
    ro = c.view.copy()
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="cache.*read-only"):
        dsv4.append_latent(rows, ro, table, tokens, indptr)
    small = np.lib.stride_tricks.as_strided(np.zeros(4 * 2000, np.uint8), (2, 4, 1, 584),
                                            (2000, 584, 584, 1))
    with pytest.raises(ValueError, match="cache"):  # MODEL1 blocks too small for 4 tokens
        dsv4.append_latent(rows, small, table, tokens, indptr)


def test_sparse_attention_bad_input_is_named(rng):
    raw = rng.standard_normal((16, 32)).astype(ml_dtypes.bfloat16)
    q = rng.standard_normal((1, 2, 32)).astype(np.float32)
    out = poison((1, 2, 32))
    with pytest.raises(TypeError, match="entries"):
        dsv4.sparse_attention(q, raw, raw.astype(np.float32), first_position=15, out=out)
    with pytest.raises(ValueError, match="raw"):
        dsv4.sparse_attention(q, raw[:, :16], first_position=15, out=out)
    with pytest.raises(ValueError, match="raw"):  # the window reaches before row 0
        dsv4.sparse_attention(q, raw, first_position=15, raw_first=4, out=out)
    with pytest.raises(ValueError, match="indices"):
        dsv4.sparse_attention(q, raw, raw, np.array([[3, 16]], np.int32), first_position=15,
                              out=out)
    with pytest.raises(ValueError, match="MODEL1"):
        dsv4.sparse_attention(np.zeros((1, 2, 512), np.float32), np.zeros((4, 584), np.uint8),
                              first_position=3)
    assert np.isnan(out).all()


def test_torch_float8_cache_is_read_as_bytes(rng):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("torch without float8_e4m3fn")
    c = filled(rng, "v32", 2, 4)
    t = torch.from_numpy(c.buf).view(torch.float8_e4m3fn)
    np.testing.assert_array_equal(dsv4.read_latent(t), dsv4.read_latent(c.buf))


# ---- compressor -----------------------------------------------------------------------------

def ref_compress(kv, score, ape, ratio, coff):
    """float64 pooling from the compressor's description: entry j pools blocks j-coff+1 .. j,
    half h through channels [h*d, (h+1)*d), softmax over the window per channel of
    score + ape[p mod S]."""
    kv, score, ape = (np.asarray(x, np.float64) for x in (kv, score, ape))
    n, rw = kv.shape
    d = rw // coff
    out = np.zeros((n // ratio, d))
    for j in range(n // ratio):
        zs, vs = [], []
        for h in range(coff):
            b = j - coff + 1 + h
            if b < 0:
                continue
            for p in range(b * ratio, (b + 1) * ratio):
                zs.append(score[p, h * d:(h + 1) * d] + ape[p % ratio, h * d:(h + 1) * d])
                vs.append(kv[p, h * d:(h + 1) * d])
        z = np.array(zs)
        a = np.exp(z - z.max(axis=0))
        out[j] = (a / a.sum(axis=0) * np.array(vs)).sum(axis=0)
    return out


@pytest.mark.parametrize("dtype,ratio,coff,d", [("bfloat16", 4, 2, 32), ("float32", 8, 1, 24),
                                                ("float16", 3, 2, 16)])
def test_compress_and_streaming_match_float64(rng, dtype, ratio, coff, d):
    n = 7 * ratio + 2
    cast = PLAIN[dtype]
    kv = rng.standard_normal((n, coff * d)).astype(cast)
    score = rng.standard_normal((n, coff * d)).astype(cast)
    ape = rng.standard_normal((ratio, coff * d)).astype(np.float32)
    got = dsv4.compress(kv, score, ape, ratio=ratio, coff=coff)
    np.testing.assert_allclose(got, ref_compress(kv, score, ape, ratio, coff), rtol=0, atol=2e-5)
    c = dsv4.Compressor(ape, ratio=ratio, coff=coff, dtype=dtype)
    parts, at = [], 0
    for size in [1, 3, ratio, 2 * ratio + 1, n]:
        size = min(size, n - at)
        parts.append(c.append(kv[at:at + size], score[at:at + size]))
        at += size
    assert c.tokens == n and c.entries == n // ratio and c.dim == d
    np.testing.assert_array_equal(np.concatenate(parts), got)  # streaming = batch, bit for bit


@pytest.mark.parametrize("fmt", ["bfloat16", "model1"])
def test_compress_append_stores_the_entries_in_pages(rng, fmt):
    ratio, coff = 4, 2
    d = 512 if fmt == "model1" else 32
    cast = ml_dtypes.bfloat16
    B, P = 2, 2
    n = [13, 9]
    kvs = [rng.standard_normal((m, coff * d)).astype(cast) for m in n]
    scs = [rng.standard_normal((m, coff * d)).astype(cast) for m in n]
    ape = rng.standard_normal((ratio, coff * d)).astype(np.float32)
    cache = Cache(PLAIN.get(fmt, fmt), 5, P, d)
    table = np.array([[4, 0], [2, 3]], np.int32)
    state = np.zeros((B, dsv4.compressor_state_elements(ratio, coff, d)), cast)
    tokens = np.zeros(B, np.int64)
    for lo, hi in [(0, 1), (1, 6), (6, 13)]:  # chunks of each sequence (clipped to its length)
        c = [max(0, min(hi, m) - min(lo, m)) for m in n]
        indptr = np.concatenate([[0], np.cumsum(c)]).astype(np.int32)
        kv = np.concatenate([k[min(lo, m):min(hi, m)] for k, m in zip(kvs, n)])
        sc = np.concatenate([s[min(lo, m):min(hi, m)] for s, m in zip(scs, n)])
        dsv4.compress_append(kv, sc, ape, state, cache.view, table, tokens, indptr, ratio=ratio)
    np.testing.assert_array_equal(tokens, n)
    vals = cache.values()
    for b in range(B):
        want = dsv4.compress(kvs[b], scs[b], ape, ratio=ratio)
        for j in range(n[b] // ratio):
            row = vals[table[b, j // P] * P + j % P]
            if fmt == "model1":
                exp = want[j].copy()
                w = Cache("model1", 1, 1)
                w.write(exp[None], np.zeros((1, 1), np.int32), [0], [0, 1])
                np.testing.assert_array_equal(row, w.values()[0])
            else:
                np.testing.assert_array_equal(row, want[j].astype(cast).astype(np.float64))


def test_compressor_bad_input(rng):
    ape = np.zeros((4, 64), np.float32)
    kv = np.zeros((8, 64), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="ape"):
        dsv4.compress(kv, kv, ape[:3], ratio=4)
    with pytest.raises(TypeError, match="score"):
        dsv4.compress(kv, kv.astype(np.float32), ape, ratio=4)
    with pytest.raises(ValueError, match="coff"):
        dsv4.compress(kv, kv, ape, ratio=4, coff=3)
    c = dsv4.Compressor(ape, ratio=4, dtype="bfloat16")
    with pytest.raises(TypeError, match="kv"):
        c.append(kv.astype(np.float16), kv.astype(np.float16))
    out = poison((2, 32))
    with pytest.raises(ValueError, match="out"):
        c.append(kv, kv, out=poison((1, 32)))
    assert c.tokens == 0 and np.isnan(out).all()


# ---- indexer --------------------------------------------------------------------------------

def ref_indexer(q, w, keys, first, top_k, ratio):
    T = q.shape[0]
    idx = np.full((T, top_k), -1, np.int32)
    sc = np.full((T, top_k), -np.inf)
    for i in range(T):
        J = (first + i + 1) // ratio
        s = (w[i][:, None].astype(np.float64)
             * np.maximum(0, q[i].astype(np.float64) @ keys[:J].astype(np.float64).T)).sum(0)
        order = sorted(range(J), key=lambda j: (-s[j], j))[:top_k]
        idx[i, :len(order)] = order
        sc[i, :len(order)] = s[order]
    return idx, sc


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_indexer_top_k_matches_float64(rng, dtype):
    T, H, d, ratio, first, k = 4, 6, 32, 4, 40, 8
    keys_full = rng.standard_normal((20, 2 * d)).astype(PLAIN[dtype])
    keys = keys_full[:, :d]  # a strided view: rows 2 * d apart
    q = rng.standard_normal((T, H, d)).astype(np.float32)
    w = rng.standard_normal((T, H)).astype(np.float32)
    idx, sc = dsv4.indexer_top_k(q, w, keys, first_position=first, top_k=k, ratio=ratio)
    r_idx, r_sc = ref_indexer(q, w, keys, first, k, ratio)
    np.testing.assert_allclose(sc, r_sc, rtol=1e-5, atol=1e-4)
    # the selection may differ only where two scores are within rounding of each other
    for i in range(T):
        if not np.array_equal(idx[i], r_idx[i]):
            gap = np.sort(np.diff(np.sort(r_sc[i][np.isfinite(r_sc[i])])))
            assert gap[0] < 1e-4
    small_idx, small_sc = dsv4.indexer_top_k(q[:1], w[:1], keys, first_position=5, top_k=3,
                                             ratio=4)
    assert small_idx[0, 0] == 0 and (small_idx[0, 1:] == -1).all()
    assert np.isneginf(small_sc[0, 1:]).all()


def test_indexer_bad_input(rng):
    q = np.zeros((1, 2, 16), np.float32)
    w = np.zeros((1, 2), np.float32)
    keys = np.zeros((4, 16), np.float32)
    idx = np.full((1, 4), 7, np.int32)
    with pytest.raises(ValueError, match="w"):
        dsv4.indexer_top_k(q, w[:, :1], keys, first_position=3, top_k=4)
    with pytest.raises(ValueError, match="num_keys"):  # 20 tokens need 5 keys
        dsv4.indexer_top_k(q, w, keys, first_position=19, top_k=4, indices=idx)
    with pytest.raises(TypeError, match="indices"):
        dsv4.indexer_top_k(q, w, keys, first_position=3, top_k=4, indices=idx.astype(np.int64))
    assert (idx == 7).all()


# ---- paged sparse attention -----------------------------------------------------------------

@pytest.mark.parametrize("fmt,d", [("bfloat16", 64), ("model1", 512)])
def test_paged_sparse_attention_equals_contiguous(rng, fmt, d):
    P, B, window, ratio = 4, 2, 6, 4
    lengths = np.array([14, 9], np.int64)
    qo = np.array([0, 3, 5], np.int32)
    raw = filled(rng, fmt, 8, P, dim=d)
    ent = filled(rng, fmt, 4, P, dim=d)
    raw_table = np.array([[5, 1, 7, 2], [0, 6, 3, 4]], np.int32)
    ent_table = np.array([[3, 0], [1, 2]], np.int32)
    q = rng.standard_normal((5, 3, d)).astype(np.float32)
    idx = np.array([[0, 2, -1], [1, -1, -1], [2, 1, 0], [1, 0, -1], [-1, -1, -1]], np.int32)
    sinks = rng.standard_normal(3).astype(np.float32)
    out, lse = dsv4.paged_sparse_attention(
        q, raw.view, raw_table, lengths, entry_cache=ent.view, entry_table=ent_table,
        ratio=ratio, indices=idx, qo_indptr=qo, window=window, sinks=sinks, threads=2)
    rv, ev = raw.values(), ent.values()
    for b in range(B):
        rows = slice(qo[b], qo[b + 1])
        nb_ = int(lengths[b])
        raw_rows = np.array([rv[raw_table[b, p // P] * P + p % P] for p in range(nb_)])
        ent_rows = np.array([ev[ent_table[b, j // P] * P + j % P] for j in range(nb_ // ratio)])
        first = nb_ - (qo[b + 1] - qo[b])
        r_out, r_lse = ref_sparse(q[rows], raw_rows, ent_rows, first, window, idx=idx[rows],
                                  sinks=sinks)
        vmax = np.abs(rv).max() + np.abs(ev).max()
        np.testing.assert_allclose(out[rows], r_out, rtol=0, atol=2e-5 * vmax)
        np.testing.assert_allclose(lse[rows], r_lse, rtol=1e-5, atol=1e-4)


def test_paged_sparse_attention_bad_input(rng):
    raw = filled(rng, "bfloat16", 2, 4, dim=32)
    q = rng.standard_normal((1, 2, 32)).astype(np.float32)
    out = poison((1, 2, 32))
    with pytest.raises(ValueError, match="raw_table"):  # 9 tokens need 3 pages of 4
        dsv4.paged_sparse_attention(q, raw.view, np.array([[0, 1]], np.int32),
                                    np.array([9], np.int64), window=4, out=out)
    with pytest.raises(TypeError, match="lengths"):
        dsv4.paged_sparse_attention(q, raw.view, np.array([[0, 1]], np.int32),
                                    np.array([5], np.int32), window=4, out=out)
    with pytest.raises(ValueError, match="ratio"):
        dsv4.paged_sparse_attention(q, raw.view, np.array([[0, 1]], np.int32),
                                    np.array([5], np.int64), ratio=4, out=out)
    assert np.isnan(out).all()


def test_dsv4_kernels_release_the_gil(rng):
    c = Cache(ml_dtypes.bfloat16, 64, 64, 512)
    c.buf[:] = rng.standard_normal(c.buf.shape).astype(ml_dtypes.bfloat16)
    q = rng.standard_normal((1, 24, 64, 512)).astype(np.float32)
    idx = rng.integers(0, 64 * 64, size=(1, 24, 512)).astype(np.int32)
    assert_releases_gil(lambda: dsv4.flash_mla_with_kvcache(q, c.view, indices=idx))


def csr(table, counts):
    """FlashInfer's (indptr, indices) of a dense table's first counts[b] blocks per row."""
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = np.concatenate([table[b, :c] for b, c in enumerate(counts)]).astype(np.int32)
    return indptr, indices


def test_csr_block_tables_equal_dense(rng):
    P, d, window, ratio = 4, 64, 6, 4
    lengths = np.array([14, 9], np.int64)
    raw = filled(rng, "bfloat16", 8, P, dim=d)
    ent = filled(rng, "bfloat16", 4, P, dim=d)
    raw_table = np.array([[5, 1, 7, 2], [0, 6, 3, 4]], np.int32)
    ent_table = np.array([[3, 0], [1, 2]], np.int32)
    q = rng.standard_normal((2, 3, d)).astype(np.float32)
    kw = dict(entry_cache=ent.view, ratio=ratio, window=window)
    want = dsv4.paged_sparse_attention(q, raw.view, raw_table, lengths, entry_table=ent_table,
                                       **kw)
    got = dsv4.paged_sparse_attention(q, raw.view, csr(raw_table, [4, 3]), lengths,
                                      entry_table=csr(ent_table, [1, 1]), **kw)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    with pytest.raises(ValueError, match=r"raw_table\[0\] \(indptr\)"):
        bad = (np.array([1, 4, 7], np.int32), csr(raw_table, [4, 3])[1])
        dsv4.paged_sparse_attention(q, raw.view, bad, lengths, entry_table=ent_table, **kw)
    with pytest.raises(ValueError, match=r"raw_table\[1\] \(indices\)"):
        bad = (np.array([0, 4, 9], np.int32), csr(raw_table, [4, 3])[1])
        dsv4.paged_sparse_attention(q, raw.view, bad, lengths, entry_table=ent_table, **kw)
    # append through a CSR table writes what the dense one writes
    a, b = Cache("model1", 4, 4), Cache("model1", 4, 4)
    rows = spread_rows(rng, 6, 512)
    table = np.array([[2, 0], [3, 1]], np.int32)
    tokens, indptr = np.array([0, 2], np.int64), np.array([0, 3, 6], np.int32)
    dsv4.append_latent(rows, a.view, table, tokens, indptr)
    dsv4.append_latent(rows, b.view, csr(table, [1, 2]), tokens, indptr)
    np.testing.assert_array_equal(a.buf, b.buf)


def test_compressor_from_threads(rng):
    """Appends from two threads either run one after the other or the second is refused by
    name; neither deadlocks, and the tokens add up."""
    import threading

    ape = rng.standard_normal((4, 64)).astype(np.float32)
    c = dsv4.Compressor(ape, ratio=4, dtype="float32")
    kv = rng.standard_normal((4096, 64)).astype(np.float32)
    done, refused = [], []

    def work():
        for _ in range(20):
            try:
                c.append(kv, kv)
                done.append(1)
            except ValueError as e:
                assert "another thread" in str(e)
                refused.append(1)

    ts = [threading.Thread(target=work, daemon=True) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in ts)
    assert c.tokens == 4096 * len(done) and len(done) + len(refused) == 40
