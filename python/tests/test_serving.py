"""phasekv.serving: paged append, batch decode and batch prefill over caller page pools with
shuffled pages (CSR and dense block tables, NHD and HND, with and without a raw ring), against
float64 numpy references written here (the design's visibility per sequence) and against
compress_batch's entries (the same bits), plus zero-copy, stale-run refusal and bad input."""

import ml_dtypes
import numpy as np
import pytest

import phasekv as pk
from conftest import assert_releases_gil, poison
from test_attention import check_close, ref_decode

sv = pk.serving
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


class Batch:
    """B sequences of random K/V stored in shuffled pages of caller pools (more pages than
    needed, pages of different sequences interleaved), as an engine holds them."""

    def __init__(self, rng, dtype, lengths, *, hkv=2, dk=24, dv=40, geometry=None, local=0,
                 window=0, raw_page=4, entry_page=3, ring=False, dense=False, layout="NHD",
                 origins=None):
        self.cast = DTYPES[dtype]
        self.lengths_final = list(lengths)
        self.B, self.hkv, self.dk, self.dv = len(lengths), hkv, dk, dv
        self.g, self.local, self.window, self.layout = geometry, local, window, layout
        self.raw_page, self.entry_page = raw_page, entry_page
        self.origins = origins
        if ring and (geometry or window):  # a causal layer keeps every raw token
            self.ring = (geometry.ring_capacity(local) if geometry else window) + 3
        else:
            self.ring = 0
        # the truth: every sequence's raw K/V by position
        self.k = [rng.standard_normal((n, hkv, dk)).astype(self.cast) for n in lengths]
        self.v = [rng.standard_normal((n, hkv, dv)).astype(self.cast) for n in lengths]
        needs = [sv.page_needs(n, raw_page_size=raw_page, entry_page_size=entry_page,
                               geometry=geometry, local=local, window=window,
                               ring_slots=self.ring, origins=origins) for n in lengths]
        self.raw_rows = self._shuffled(rng, [r for r, _ in needs], 3)
        self.entry_rows = self._shuffled(rng, [e for _, e in needs], 2) if geometry else None
        self.raw_pool = self._pool(len(sum(self.raw_rows, [])) + 3, raw_page)
        self.entry_pool = self._pool(len(sum(self.entry_rows, [])) + 2, entry_page) if geometry else None
        self.raw_table = self._table(self.raw_rows, dense)
        self.entry_table = self._table(self.entry_rows, dense) if geometry else None
        self.lengths = np.zeros(self.B, np.int64)
        self.kv = sv.PagedKV(self.raw_pool, self.raw_table, self.lengths,
                             entry_pool=self.entry_pool, entry_table=self.entry_table,
                             geometry=geometry, local=local, window=window,
                             ring_slots=self.ring, layout=layout, origins=origins)

    @staticmethod
    def _shuffled(rng, counts, spare):
        """Page numbers per sequence: a random permutation of all pages, dealt out."""
        perm = [int(p) for p in rng.permutation(sum(counts) + spare)]
        rows, at = [], 0
        for c in counts:
            rows.append(perm[at : at + c])
            at += c
        return rows

    def _pool(self, pages, size):
        shape = ((pages, size, self.hkv) if self.layout == "NHD" else (pages, self.hkv, size))
        # poisoned: a slot read before it is written shows up as NaN
        return (np.full(shape + (self.dk,), np.nan, self.cast),
                np.full(shape + (self.dv,), np.nan, self.cast))

    @staticmethod
    def _table(rows, dense):
        if dense:
            width = max(len(r) for r in rows) + 1
            t = np.full((len(rows), width), 2**30, np.int32)  # unused entries are never read
            for b, r in enumerate(rows):
                t[b, : len(r)] = r
            return t
        indptr = np.cumsum([0] + [len(r) for r in rows]).astype(np.int32)
        return indptr, np.array(sum(rows, []), np.int32)

    def ring_origin(self):
        if self.origins:
            return max(self.origins)
        return self.g.origin if self.g else 0

    def head_geometry(self, h):
        o = self.origins[h] if self.origins else self.g.origin
        return pk.Geometry(self.g.window, self.g.stride, o)

    def slot(self, p):
        o = self.ring_origin()
        return p if self.ring == 0 or p < o else o + (p - o) % self.ring

    def read(self, pool, rows, size, b, slots):
        """[len(slots), H, d] pair (keys, values) of sequence b's slots, read through its pages."""
        out = []
        for part in pool:
            if self.layout == "NHD":
                out.append(np.stack([part[rows[b][s // size], s % size] for s in slots]))
            else:
                out.append(np.stack([part[rows[b][s // size], :, s % size] for s in slots]))
        return out

    def append_step(self, counts, policy=(None, None), workers=1, one_off=False):
        """Appends counts[b] new tokens to every sequence through an AppendPlan."""
        before = self.lengths.copy()
        indptr = np.cumsum([0] + list(counts)).astype(np.int32)
        keys = np.concatenate([self.k[b][before[b] : before[b] + c] for b, c in enumerate(counts)])
        values = np.concatenate([self.v[b][before[b] : before[b] + c] for b, c in enumerate(counts)])
        if one_off:
            sv.paged_append(self.kv, indptr, keys, values, *policy, threads=workers)
            after = before + np.asarray(counts)
        else:
            plan = sv.AppendPlan(self.kv, indptr, keys, values, *policy, workers=workers)
            plan.run(self.kv, indptr, keys, values, *policy)
            after = plan.lengths_after
        assert list(after) == list(before + np.asarray(counts))
        self.lengths[:] = after  # the engine updates its lengths in place
        return indptr, keys, values

    def entries64(self, b, n):
        """Float64 entries of sequence b after n tokens, computed by compress_batch (whose
        entries test_compress checks against float64 references)."""
        if self.origins:  # head h's rows j < J_h(n), NaN above (never read)
            js = [self.head_geometry(h).complete_windows(n) for h in range(self.hkv)]
            ek = np.full((max(js), self.hkv, self.dk), np.nan, self.cast)
            ev = np.full((max(js), self.hkv, self.dv), np.nan, self.cast)
            for h, j in enumerate(js):
                if j:
                    g = self.head_geometry(h)
                    pk.compress_batch(pk.UniformMean(g, self.dk), self.k[b][:n, h : h + 1],
                                      ek[:j, h : h + 1])
                    pk.compress_batch(pk.UniformMean(g, self.dv), self.v[b][:n, h : h + 1],
                                      ev[:j, h : h + 1])
            return ek, ev
        j = self.g.complete_windows(n) if self.g else 0
        ek = np.zeros((j, self.hkv, self.dk), self.cast)
        ev = np.zeros((j, self.hkv, self.dv), self.cast)
        if j:
            pk.compress_batch(pk.UniformMean(self.g, self.dk), self.k[b][:n], ek)
            pk.compress_batch(pk.UniformMean(self.g, self.dv), self.v[b][:n], ev)
        return ek, ev

    def policy(self):
        """(key_policy, value_policy) of the layer, (None, None) when uncompressed (with
        per-head origins the geometry's origin is 0 and the origins come from the cache)."""
        if self.g is None:
            return None, None
        return pk.UniformMean(self.g, self.dk), pk.UniformMean(self.g, self.dv)


def check_pages(batch):
    """The pools hold every sequence's visible raw tokens and its entries, bit for bit."""
    for b in range(batch.B):
        n = int(batch.lengths[b])
        o = batch.ring_origin()
        lo = 0 if batch.ring == 0 else max(o, n - batch.ring)
        positions = list(range(min(n, o))) + list(range(max(lo, min(n, o)), n))
        if batch.ring == 0:
            positions = list(range(n))
        if positions:
            k, v = batch.read(batch.raw_pool, batch.raw_rows, batch.raw_page, b,
                              [batch.slot(p) for p in positions])
            assert np.array_equal(k.view(np.uint8), batch.k[b][positions].view(np.uint8))
            assert np.array_equal(v.view(np.uint8), batch.v[b][positions].view(np.uint8))
        if batch.g is not None:
            ek, ev = batch.entries64(b, n)
            if len(ek):
                k, v = batch.read(batch.entry_pool, batch.entry_rows, batch.entry_page, b,
                                  range(len(ek)))
                for h in range(batch.hkv):  # head h's entries (all of them without origins)
                    j = batch.head_geometry(h).complete_windows(n) if batch.origins else len(ek)
                    assert np.array_equal(k[:j, h].view(np.uint8), ek[:j, h].view(np.uint8))
                    assert np.array_equal(v[:j, h].view(np.uint8), ev[:j, h].view(np.uint8))


def ref_query(batch, b, q, n, **logits):
    """Float64 decode of query q [Hq, dk] at position n - 1 of sequence b."""
    ek, ev = batch.entries64(b, n)
    k64, v64, ek64, ev64 = (a.astype(np.float64) for a in (batch.k[b], batch.v[b], ek, ev))
    return ref_decode(q, k64, v64, ek64, ev64, n, batch.g, batch.local, batch.window, **logits)


LAYERS = {
    "compressed": dict(geometry=pk.Geometry(8, 4, 2), local=5),
    "tiled": dict(geometry=pk.Geometry(4, 4, 0), local=3),
    "causal": dict(),
    "sliding": dict(window=6),
}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("dense,ring,layout", [(False, False, "NHD"), (True, True, "NHD"),
                                               (False, True, "HND"), (True, False, "HND")])
def test_append_decode_prefill_match_reference(dtype, layer, dense, ring, layout, rng):
    lengths = [0, 1, 23, 70, 9]
    batch = Batch(rng, dtype, lengths, dense=dense, ring=ring, layout=layout, **LAYERS[layer])
    policy = batch.policy()
    group, hq = 3, 3 * batch.hkv
    # step 1: a prefill chunk per sequence (0 tokens for some); step 2: the rest, then one token
    first = [min(n, c) for n, c in zip(lengths, [0, 1, 11, 37, 9])]
    batch.append_step(first, policy, workers=2)
    check_pages(batch)
    rest = [n - f for n, f in zip(lengths, first)]
    last = [1 if r else 0 for r in rest]
    batch.append_step([r - x for r, x in zip(rest, last)], policy)
    check_pages(batch)
    # prefill of the last token of each sequence that has one (the lengths include it)
    indptr, _, _ = batch.append_step(last, policy, workers=3)
    check_pages(batch)
    vmax = max(np.abs(v.astype(np.float64)).max() for v in batch.v if len(v))
    sinks = rng.standard_normal(hq).astype(np.float32)
    logits = dict(softcap=6.0, entry_bias=0.7, sinks=sinks)

    # decode: every sequence's query at n_b - 1
    q = rng.standard_normal((batch.B, hq, batch.dk)).astype(np.float32)
    out, lse = poison((batch.B, hq, batch.dv)), poison((batch.B, hq))
    plan = sv.DecodePlan(batch.kv, hq, kv_chunk=64)
    res = plan.run(q, batch.kv, out, lse, **logits)
    assert res[0] is out and res[1] is lse
    for b, n in enumerate(lengths):
        ref = ref_query(batch, b, q[b], n, **logits)
        check_close(out[b], lse[b], *ref, vmax)
    # any worker count: the same bits
    out3, lse3 = sv.DecodePlan(batch.kv, hq, workers=3, kv_chunk=64).run(q, batch.kv, **logits)
    assert np.array_equal(out3, out) and np.array_equal(lse3, lse)

    # prefill: the last token of each sequence (qo_indptr of the last step)
    rows = int(indptr[-1])
    qp = rng.standard_normal((rows, hq, batch.dk)).astype(np.float32)
    pout, plse = poison((rows, hq, batch.dv)), poison((rows, hq))
    pplan = sv.PrefillPlan(batch.kv, indptr, hq, workers=2)
    assert pplan.run(qp, batch.kv, indptr, pout, plse, **logits)[0] is pout
    for b in range(batch.B):
        for r in range(indptr[b], indptr[b + 1]):
            n = lengths[b] - (indptr[b + 1] - r) + 1
            ref = ref_query(batch, b, qp[r], n, **logits)
            check_close(pout[r], plse[r], *ref, vmax)
    assert group == hq // batch.hkv


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("ring", [False, True])
def test_per_head_origins(dtype, ring, rng):
    """Per-KV-head origins (PagedKV origins=): the append writes each head's own entries, and
    decode and prefill match a float64 reference head by head (head h with Geometry(W, S, O_h))."""
    origins = [0, 3, 3, 9]
    g0, local = pk.Geometry(8, 4, 0), 5
    lengths = [0, 1, 12, 70, 33]
    batch = Batch(rng, dtype, lengths, hkv=4, dk=16, dv=24, geometry=g0, local=local,
                  ring=ring, origins=origins, layout="HND" if ring else "NHD")
    policy = batch.policy()
    first = [min(n, c) for n, c in zip(lengths, [0, 1, 5, 40, 33])]
    batch.append_step(first, policy, workers=2)
    check_pages(batch)
    last = [1 if n - f else 0 for n, f in zip(lengths, first)]
    batch.append_step([n - f - x for n, f, x in zip(lengths, first, last)], policy, one_off=True)
    indptr, _, _ = batch.append_step(last, policy, workers=3)
    check_pages(batch)
    group, hkv = 2, batch.hkv
    hq = group * hkv
    vmax = max(np.abs(v.astype(np.float64)).max() for v in batch.v if len(v))

    def ref(b, q, n):
        """Float64 output and lse of query q [Hq, dk] at n - 1 of sequence b, head by head."""
        ek, ev = batch.entries64(b, n)
        outs, lses = [], []
        for h in range(hkv):
            f = lambda a: a[:, h : h + 1].astype(np.float64)
            o, l = ref_decode(q[h * group : (h + 1) * group], f(batch.k[b]), f(batch.v[b]),
                              f(ek), f(ev), n, batch.head_geometry(h), local, 0)
            outs.append(o)
            lses.append(l)
        return np.concatenate(outs), np.concatenate(lses)

    q = rng.standard_normal((batch.B, hq, batch.dk)).astype(np.float32)
    out, lse = sv.DecodePlan(batch.kv, hq, kv_chunk=64).run(q, batch.kv)
    for b, n in enumerate(lengths):
        check_close(out[b], lse[b], *ref(b, q[b], n), vmax)
    out3, lse3 = sv.DecodePlan(batch.kv, hq, workers=3, kv_chunk=64).run(q, batch.kv)
    assert np.array_equal(out3, out) and np.array_equal(lse3, lse)
    rows = int(indptr[-1])
    qp = rng.standard_normal((rows, hq, batch.dk)).astype(np.float32)
    pout, plse = sv.PrefillPlan(batch.kv, indptr, hq, workers=2).run(qp, batch.kv, indptr)
    for b in range(batch.B):
        for r in range(indptr[b], indptr[b + 1]):
            n = lengths[b] - (indptr[b + 1] - r) + 1
            check_close(pout[r], plse[r], *ref(b, qp[r], n), vmax)


def test_per_head_origins_bad_input(rng):
    g0 = pk.Geometry(8, 4, 0)
    pool = (np.zeros((4, 2, 2, 8), np.float32), np.zeros((4, 2, 2, 8), np.float32))
    table = np.zeros((1, 2), np.int32)
    lengths = np.zeros(1, np.int64)
    kw = dict(entry_pool=pool, entry_table=table, geometry=g0, local=2)
    with pytest.raises(ValueError, match="origins"):
        sv.PagedKV(pool, table, lengths, origins=[0, 1, 2], **kw)  # 3 origins, 2 heads
    with pytest.raises(ValueError, match=r"origins\[1\]"):
        sv.PagedKV(pool, table, lengths, origins=[0, -1], **kw)
    with pytest.raises(ValueError, match="origin"):
        sv.PagedKV(pool, table, lengths, origins=[0, 1],
                   **dict(kw, geometry=pk.Geometry(8, 4, 2)))
    with pytest.raises(TypeError, match="origins"):
        sv.PagedKV(pool, table, lengths, origins="0,1", **kw)
    assert sv.page_needs(9, raw_page_size=4, entry_page_size=1, geometry=g0, local=2,
                         origins=[5, 1]) == (3, pk.Geometry(8, 4, 1).complete_windows(9))


def test_prefill_of_long_chunks(rng):
    """Several queries per sequence (a chunked prefill), CSR tables, bfloat16."""
    lengths = [40, 0, 17]
    batch = Batch(rng, "bfloat16", lengths, geometry=pk.Geometry(6, 4, 1), local=4)
    batch.append_step(lengths, batch.policy())
    counts = [25, 0, 17]
    indptr = np.cumsum([0] + counts).astype(np.int32)
    hq = 4
    q = rng.standard_normal((int(indptr[-1]), hq, batch.dk)).astype(np.float32)
    out, lse = sv.PrefillPlan(batch.kv, indptr, hq).run(q, batch.kv, indptr)
    vmax = max(np.abs(v.astype(np.float64)).max() for v in batch.v if len(v))
    for b in range(batch.B):
        for r in range(indptr[b], indptr[b + 1]):
            n = lengths[b] - (indptr[b + 1] - r) + 1
            check_close(out[r], lse[r], *ref_query(batch, b, q[r], n), vmax)


def test_one_off_paged_append_equals_the_plan(rng):
    lengths = [13, 30]
    a = Batch(rng, "float32", lengths, geometry=pk.Geometry(5, 3, 1), local=2)
    a.append_step([7, 30], a.policy(), one_off=True, workers=2)
    a.append_step([6, 0], a.policy(), one_off=True)
    check_pages(a)


def test_pools_are_read_and_written_in_place(rng):
    batch = Batch(rng, "float32", [19, 33], geometry=pk.Geometry(4, 4, 1), local=3)
    batch.append_step([19, 33], batch.policy())
    check_pages(batch)  # the appends wrote the caller's (poisoned) arrays
    q = rng.standard_normal((2, 2, batch.dk)).astype(np.float32)
    plan = sv.DecodePlan(batch.kv, 2)
    out, lse = plan.run(q, batch.kv)
    # values doubled in place (exact): the next run reads them, out doubles exactly
    for part in (batch.raw_pool[1], batch.entry_pool[1]):
        part *= 2
    out2, lse2 = plan.run(q, batch.kv)
    assert np.array_equal(out2, 2 * out) and np.array_equal(lse2, lse)
    # outputs: a row slice of a larger caller buffer is written in place
    buf = poison((3, 2, batch.dv))
    plan.run(q, batch.kv, out=buf[1:])
    assert np.isnan(buf[0]).all() and np.array_equal(buf[1:], out2)


def test_one_pool_of_kv_pages(rng):
    """Keys and values as the two halves of one [K|V] page array (a page stride twice the
    page): the same results as separate pools."""
    g, P, H, d = pk.Geometry(4, 2, 0), 4, 2, 16
    pages = np.full((6, 2, P, H, d), np.nan, np.float32)
    epages = np.full((5, 2, P, H, d), np.nan, np.float32)
    lengths = np.zeros(1, np.int64)
    rt, et = np.array([[4, 1, 3, 0]], np.int32), np.array([[2, 0, 4]], np.int32)
    kv = sv.PagedKV((pages[:, 0], pages[:, 1]), rt, lengths, entry_pool=(epages[:, 0], epages[:, 1]),
                    entry_table=et, geometry=g, local=2)
    x = rng.standard_normal((15, H, d)).astype(np.float32)
    y = rng.standard_normal((15, H, d)).astype(np.float32)
    indptr = np.array([0, 15], np.int32)
    sv.AppendPlan(kv, indptr, x, y, pk.UniformMean(g, d)).run(kv, indptr, x, y, pk.UniformMean(g, d))
    lengths[:] = 15
    for p in range(15):
        assert np.array_equal(pages[rt[0, p // P], 0, p % P], x[p])
        assert np.array_equal(pages[rt[0, p // P], 1, p % P], y[p])
    q = rng.standard_normal((1, 4, d)).astype(np.float32)
    out, lse = sv.DecodePlan(kv, 4).run(q, kv)
    j = g.complete_windows(15)
    ek, ev = np.zeros((j, H, d), np.float32), np.zeros((j, H, d), np.float32)
    pk.compress_batch(pk.UniformMean(g, d), x, ek)
    pk.compress_batch(pk.UniformMean(g, d), y, ev)
    ref = ref_decode(q[0], *(a.astype(np.float64) for a in (x, y, ek, ev)), 15, g, 2)
    check_close(out[0], lse[0], *ref, np.abs(y).max())


def test_stale_runs_are_refused(rng):
    batch = Batch(rng, "float32", [21, 9], geometry=pk.Geometry(4, 4, 0), local=2, dense=True)
    policy = batch.policy()
    indptr = np.array([0, 12, 21], np.int32)
    keys = np.concatenate([batch.k[0][:12], batch.k[1][:9]])
    values = np.concatenate([batch.v[0][:12], batch.v[1][:9]])
    plan = sv.AppendPlan(batch.kv, indptr, keys, values, *policy)
    snapshot = [p.copy() for p in batch.raw_pool + batch.entry_pool]
    unchanged = lambda: all(  # noqa: E731
        np.array_equal(a, b, equal_nan=True) for a, b in zip(snapshot, batch.raw_pool + batch.entry_pool))
    other = np.array([0, 11, 21], np.int32)
    with pytest.raises(ValueError, match="new_indptr"):
        plan.run(batch.kv, other, keys, values, *policy)
    with pytest.raises(ValueError, match="key_policy"):
        plan.run(batch.kv, indptr, keys, values, pk.UniformMean(pk.Geometry(4, 2, 0), batch.dk),
                 policy[1])
    with pytest.raises(ValueError, match="key_policy is a MaxPool"):
        plan.run(batch.kv, indptr, keys, values, pk.MaxPool(batch.g, batch.dk),
                 pk.MaxPool(batch.g, batch.dv))
    batch.lengths[1] = 1
    with pytest.raises(ValueError, match=r"lengths\[1\]"):
        plan.run(batch.kv, indptr, keys, values, *policy)
    batch.lengths[1] = 0
    assert unchanged()
    plan.run(batch.kv, indptr, keys, values, *policy)
    batch.lengths[:] = plan.lengths_after
    q = rng.standard_normal((2, 2, batch.dk)).astype(np.float32)
    dplan = sv.DecodePlan(batch.kv, 2)
    out = poison((2, 2, batch.dv))
    batch.lengths[0] = 20
    with pytest.raises(ValueError, match=r"lengths\[0\]"):
        dplan.run(q, batch.kv, out)
    batch.lengths[0] = 12
    saved = batch.raw_table[0, 1]
    batch.raw_table[0, 1] = batch.raw_table[0, 2] if batch.raw_table[0, 2] < 2**30 else 0
    with pytest.raises(ValueError, match="raw_table"):
        dplan.run(q, batch.kv, out)
    batch.raw_table[0, 1] = saved
    assert np.isnan(out).all()  # nothing written by the refused runs
    with pytest.raises(ValueError, match="q"):
        dplan.run(rng.standard_normal((2, 4, batch.dk)).astype(np.float32), batch.kv)
    other_kv = Batch(rng, "bfloat16", [21, 9], geometry=pk.Geometry(4, 4, 0), local=2).kv
    with pytest.raises(ValueError, match="dtype"):
        dplan.run(q, other_kv)
    pplan = sv.PrefillPlan(batch.kv, np.array([0, 1, 2], np.int32), 2)
    with pytest.raises(ValueError, match="qo_indptr"):
        pplan.run(q.reshape(2, 2, -1), batch.kv, np.array([0, 2, 2], np.int32))
    dplan.run(q, batch.kv, out)
    assert not np.isnan(out).any()


def test_bad_arguments(rng):
    g = pk.Geometry(4, 4, 0)
    pool = (np.zeros((4, 2, 2, 8), np.float32), np.zeros((4, 2, 2, 8), np.float32))
    table = np.array([[0, 1]], np.int32)
    lengths = np.zeros(1, np.int64)
    epool = (np.zeros((2, 2, 2, 8), np.float32), np.zeros((2, 2, 2, 8), np.float32))
    et = np.array([[0]], np.int32)
    with pytest.raises(TypeError, match="raw_pool"):
        sv.PagedKV(pool[0], table, lengths)
    with pytest.raises(ValueError, match=r"raw_pool\[0\] \(keys\)"):
        sv.PagedKV((pool[0][0], pool[1]), table, lengths)
    with pytest.raises(ValueError, match=r"raw_pool\[1\] \(values\) has pages = 3"):
        sv.PagedKV((pool[0], pool[1][:3]), table, lengths)
    with pytest.raises(ValueError, match=r"raw_pool\[0\] \(keys\) must be dense inside a page"):
        sv.PagedKV((pool[0][:, :, :, ::2], pool[1]), table, lengths)
    with pytest.raises(TypeError, match=r"raw_pool\[1\] \(values\) has dtype"):
        sv.PagedKV((pool[0], pool[1].astype(np.float16)), table, lengths)
    with pytest.raises(TypeError, match=r"raw_pool\[0\] \(keys\) has dtype float16"):
        sv.PagedKV(tuple(p.astype(np.float16) for p in pool), table, lengths)
    with pytest.raises(TypeError, match="raw_table"):
        sv.PagedKV(pool, table.astype(np.int64), lengths)
    with pytest.raises(ValueError, match="lengths"):
        sv.PagedKV(pool, table, np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="entry_pool"):
        sv.PagedKV(pool, table, lengths, geometry=g)
    with pytest.raises(ValueError, match="entry_pool"):
        sv.PagedKV(pool, table, lengths, entry_pool=epool, entry_table=et)
    with pytest.raises(ValueError, match="layout"):
        sv.PagedKV(pool, table, lengths, layout="NDH")
    kv = sv.PagedKV(pool, table, lengths, entry_pool=epool, entry_table=et, geometry=g, local=2)
    with pytest.raises(ValueError, match="q_heads"):
        sv.DecodePlan(kv, 3)
    with pytest.raises(ValueError, match="workers"):
        sv.DecodePlan(kv, 2, workers=0)
    with pytest.raises(ValueError, match="kv_chunk"):
        sv.DecodePlan(kv, 2, kv_chunk=100)
    x = np.zeros((5, 2, 8), np.float32)
    ip = np.array([0, 5], np.int32)
    with pytest.raises(TypeError, match="key_policy"):
        sv.AppendPlan(kv, ip, x, x)
    with pytest.raises(ValueError, match="key_policy"):
        sv.AppendPlan(kv, ip, x, x, pk.UniformMean(pk.Geometry(4, 2, 0), 8))
    with pytest.raises(TypeError, match="keys"):
        sv.AppendPlan(kv, ip, x.astype(np.float16), x, pk.UniformMean(g, 8))
    # 5 tokens need 2 raw pages of 2 slots more than the table lists: the plan names it
    with pytest.raises(ValueError, match="raw_table"):
        sv.AppendPlan(kv, ip, x, x, pk.UniformMean(g, 8))
    # a page outside the pool
    bad = sv.PagedKV(pool, np.array([[0, 7]], np.int32), np.array([3], np.int64),
                     entry_pool=epool, entry_table=et, geometry=g, local=2)
    with pytest.raises(ValueError, match="raw_table"):
        sv.DecodePlan(bad, 2)
    # two sequences writing one page
    shared = sv.PagedKV(pool, np.array([[0], [0]], np.int32), np.zeros(2, np.int64),
                        entry_pool=epool, entry_table=np.array([[0], [1]], np.int32), geometry=g,
                        local=2)
    ip2 = np.array([0, 1, 2], np.int32)
    with pytest.raises(ValueError, match="raw_table"):
        sv.AppendPlan(shared, ip2, x[:2], x[:2], pk.UniformMean(g, 8))
    # read-only pools can be read, not appended to
    ro = tuple(p.copy() for p in pool)
    for p in ro:
        p.flags.writeable = False
    ro_kv = sv.PagedKV(ro, np.array([[0, 1, 2]], np.int32), np.zeros(1, np.int64))
    assert not ro_kv.writable
    with pytest.raises(ValueError, match="read-only"):
        sv.AppendPlan(ro_kv, ip, x, x)


def test_page_sharing_counts(rng):
    """Two sequences share the raw pages of a common prefix: reads give the bits of unshared
    copies, the reader counts and writable_from say so, and an append into a shared page is
    refused when the counts are given."""
    g, P = pk.Geometry(4, 4, 0), 4
    H, d = 1, 8
    pool = (np.zeros((6, P, H, d), np.float32), np.zeros((6, P, H, d), np.float32))
    epool = (np.zeros((4, P, H, d), np.float32), np.zeros((4, P, H, d), np.float32))
    rt = np.array([[0, 1, 2], [0, 1, 3]], np.int32)
    et = np.array([[0, 1], [0, 2]], np.int32)
    lengths = np.array([10, 10], np.int64)
    kv = sv.PagedKV(pool, rt, lengths, entry_pool=epool, entry_table=et, geometry=g, local=2)
    raw_readers, entry_readers = sv.count_page_readers(kv)
    assert list(raw_readers) == [2, 2, 1, 1, 0, 0] and list(entry_readers) == [2, 0, 0, 0]
    assert sv.writable_from(kv, 0) == (2, 1) and sv.writable_from(kv, 1) == (2, 1)
    with pytest.raises(ValueError, match=r"\bb = 2\b"):
        sv.writable_from(kv, 2)
    # appending 1 token to sequence 0 writes its raw page 2 (its own): accepted
    x = np.ones((1, H, d), np.float32)
    ip = np.array([0, 1, 1], np.int32)
    plan = sv.AppendPlan(kv, ip, x, x, pk.UniformMean(g, d), readers=(raw_readers, entry_readers))
    # the plan keeps the counts and its runs read them again: once another sequence lists
    # page 2 too, the run is refused and writes nothing
    raw_readers[2] = 2
    before = pool[0].copy()
    with pytest.raises(ValueError, match=r"raw_table sequence 0 index 2.*more than one live"):
        plan.run(kv, ip, x, x, pk.UniformMean(g, d))
    assert np.array_equal(pool[0], before)
    raw_readers[2] = 1
    plan.run(kv, ip, x, x, pk.UniformMean(g, d))
    assert not np.array_equal(pool[0], before)
    # a table that lists a shared page where the step writes: refused with the counts
    rt2 = np.array([[0, 1, 2], [0, 2, 3]], np.int32)
    lengths2 = np.array([10, 4], np.int64)
    kv2 = sv.PagedKV(pool, rt2, lengths2, entry_pool=epool, entry_table=et, geometry=g, local=2)
    ip2 = np.array([0, 0, 1], np.int32)
    # the tables alone allow it (sequence 0 is not part of the step's writes)
    sv.AppendPlan(kv2, ip2, x, x, pk.UniformMean(g, d))
    # the engine's counts of the tables as the step leaves them (sequence 1 then uses page 2
    # too) refuse it
    lengths2[1] = 5
    r2 = sv.count_page_readers(kv2)
    lengths2[1] = 4
    assert r2[0][2] == 2
    with pytest.raises(ValueError, match=r"raw_table sequence 1 index 1.*listed by 2 live"):
        sv.AppendPlan(kv2, ip2, x, x, pk.UniformMean(g, d), readers=r2)


def test_runs_release_the_gil(rng):
    n, hq, d, P = 1500, 8, 64, 16
    pages = n // P + 1
    pool = tuple(rng.standard_normal((pages, P, 2, d)).astype(np.float32) for _ in range(2))
    table = rng.permutation(pages).astype(np.int32)[None, :]
    lengths = np.array([n], np.int64)
    kv = sv.PagedKV(pool, table, lengths)
    indptr = np.array([0, n], np.int32)
    q = rng.standard_normal((n, hq, d)).astype(np.float32)
    plan = sv.PrefillPlan(kv, indptr, hq)
    out, lse = poison((n, hq, d)), poison((n, hq))
    assert_releases_gil(lambda: plan.run(q, kv, indptr, out, lse))
    assert not np.isnan(out).any()
