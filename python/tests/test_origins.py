"""Per-KV-head origins (each KV head h has windows [O_h + j*S, O_h + j*S + W)): the cache's
visibility, entries and decode, compress_batch, decode_arrays and prefill against float64 numpy
references written here from the design's rules applied per head, plus the argument checks."""

import ml_dtypes
import numpy as np
import pytest

import phasekv as pk
from conftest import poison
from test_attention import check_close, ref_decode

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
# Relative error of storing an f32 mean in the storage type (half an ulp).
STORE_EPS = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


def ref_visibility(n, w, s, o, local):
    """(prefix_end, entries, raw_begin, raw_end) of a query at n - 1 under Geometry(w, s, o)."""
    prefix_end = min(n, o)
    j = (n - o - w) // s + 1 if n - o >= w else 0
    tail = min(n, o + j * s)
    raw_begin = max(prefix_end, min(tail, n - local))
    return prefix_end, j, raw_begin, n


def ref_mean_entries(x, w, s, o):
    """Float64 UniformMean entries of one head's rows x [n, d] under Geometry(w, s, o)."""
    n, d = x.shape
    j = (n - o - w) // s + 1 if n - o >= w else 0
    return np.array([x[o + i * s : o + i * s + w].mean(axis=0) for i in range(j)]).reshape(j, d)


def head_slices(q, hkv, h):
    group = q.shape[-2] // hkv
    return slice(h * group, (h + 1) * group)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("w,s,origins", [(8, 4, [0, 1, 3]), (4, 4, [2, 9]), (6, 4, [0, 3, 21, 5]),
                                         (2, 5, [4, 1])])
def test_cache_with_origins_matches_reference(dtype, w, s, origins, rng):
    hkv, group, dk, dv, local, n = len(origins), 3, 24, 40, 5, 83
    hq = hkv * group
    cast = DTYPES[dtype]
    g = pk.Geometry(w, s, 0)
    raw_k = rng.standard_normal((n, hkv, dk)).astype(cast)
    raw_v = rng.standard_normal((n, hkv, dv)).astype(cast)
    cache = pk.CompressedCache(pk.UniformMean(g, dk), pk.UniformMean(g, dv), kv_heads=hkv, d_k=dk,
                               d_v=dv, local=local, max_length=n + 3, dtype=dtype,
                               origins=np.array(origins))
    assert cache.origins == origins
    q = rng.standard_normal((hq, dk)).astype(np.float32)
    k64, v64 = raw_k.astype(np.float64), raw_v.astype(np.float64)
    vmax = np.abs(v64).max()
    done = 0
    for upto in [1, 7, 8, 30, 31, n]:  # appends of awkward sizes, checked after each
        cache.append(raw_k[done:upto], raw_v[done:upto])
        done = upto
        js = []
        for h, o in enumerate(origins):
            want = ref_visibility(upto, w, s, o, local)
            vis = cache.visible(head=h)
            assert (vis.prefix_end, vis.entries, vis.raw_begin, vis.raw_end) == want
            assert cache.visible_per_head()[h] == vis
            assert cache.head_geometry(h) == pk.Geometry(w, s, o)
            assert cache.head_num_entries(h) == want[1]
            js.append(want[1])
            for entries, x64 in ((cache.entry_keys(head=h), k64), (cache.entry_values(head=h), v64)):
                ref = ref_mean_entries(x64[:upto, h], w, s, o)
                assert entries.shape == (want[1], 1, x64.shape[2])
                got = entries[:, 0].astype(np.float64)
                # one rounding to the storage type plus f32 accumulation of W terms
                tol = STORE_EPS[dtype] * np.abs(ref) + w * 2.0**-23 * np.abs(x64).max()
                assert np.all(np.abs(got - ref) <= tol)
        assert cache.num_entries == max(js)
        # decode: each KV head's query group against its own reference
        out, lse = poison((hq, dv)), poison(hq)
        pk.decode(q, cache, out, lse, softcap=4.0, entry_bias=0.5)
        for h, o in enumerate(origins):
            hs = head_slices(q, hkv, h)
            ek = cache.entry_keys(head=h).astype(np.float64)
            ev = cache.entry_values(head=h).astype(np.float64)
            ref = ref_decode(q[hs], k64[:, h : h + 1], v64[:, h : h + 1], ek, ev, upto,
                             pk.Geometry(w, s, o), local, softcap=4.0, entry_bias=0.5)
            check_close(out[hs], lse[hs], *ref, vmax)
    # threads split the same work: the same bits
    out1, lse1 = pk.decode(q, cache, local=2)
    out3, lse3 = pk.decode(q, cache, local=2, threads=3)
    assert np.array_equal(out1, out3) and np.array_equal(lse1, lse3)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compress_batch_decode_arrays_and_prefill_with_origins(dtype, rng):
    w, s, origins = 8, 4, [0, 2, 7]
    hkv, group, dk, dv, local, first, t = 3, 2, 32, 16, 6, 41, 29
    hq, n = hkv * group, first + t
    cast = DTYPES[dtype]
    g = pk.Geometry(w, s, 0)
    raw_k = rng.standard_normal((n, hkv, dk)).astype(cast)
    raw_v = rng.standard_normal((n, hkv, dv)).astype(cast)
    j = g.complete_windows(n)  # head 0 has the smallest origin: the most entries
    ent_k, ent_v = np.zeros((j + 2, hkv, dk), cast), np.zeros((j + 2, hkv, dv), cast)
    assert pk.compress_batch(pk.UniformMean(g, dk), raw_k, ent_k, origins=origins, threads=2) == j
    assert pk.compress_batch(pk.UniformMean(g, dv), raw_v, ent_v, origins=origins) == j
    # streaming gives the same bits
    cache = pk.CompressedCache(pk.UniformMean(g, dk), pk.UniformMean(g, dv), kv_heads=hkv, d_k=dk,
                               d_v=dv, local=local, max_length=n, dtype=dtype, origins=origins)
    cache.append(raw_k, raw_v)
    for h in range(hkv):
        jh = cache.head_num_entries(h)
        assert np.array_equal(cache.entry_keys(head=h)[:, 0].view(np.uint8),
                              ent_k[:jh, h].view(np.uint8))
        assert np.array_equal(cache.entry_values(head=h)[:, 0].view(np.uint8),
                              ent_v[:jh, h].view(np.uint8))
    k64, v64, ek64, ev64 = (a.astype(np.float64) for a in (raw_k, raw_v, ent_k, ent_v))
    vmax = np.abs(v64).max()
    q = rng.standard_normal((t, hq, dk)).astype(np.float32)
    out, lse = poison((t, hq, dv)), poison((t, hq))
    pk.prefill(q, raw_k, raw_v, first=first, entry_k=ent_k, entry_v=ent_v, geometry=g,
               local=local, origins=origins, out=out, lse=lse, threads=2)
    for i in range(t):
        d_out, d_lse = pk.decode_arrays(q[i], raw_k, raw_v, first + i + 1, ent_k, ent_v,
                                        geometry=g, local=local, origins=origins)
        for h, o in enumerate(origins):
            hs = head_slices(q[i], hkv, h)
            ref = ref_decode(q[i][hs], k64[:, h : h + 1], v64[:, h : h + 1], ek64[:, h : h + 1],
                             ev64[:, h : h + 1], first + i + 1, pk.Geometry(w, s, o), local)
            check_close(out[i][hs], lse[i][hs], *ref, vmax)
            check_close(d_out[hs], d_lse[hs], *ref, vmax)
    # the final query through the cache: the same visible sets
    c_out, c_lse = pk.decode(q[-1], cache)
    np.testing.assert_allclose(c_out, out[-1], rtol=0, atol=1e-6 * max(1, vmax))
    np.testing.assert_allclose(c_lse, lse[-1], rtol=0, atol=1e-5)


def test_uniform_origins_equal_the_plain_cache(rng):
    g0, g2 = pk.Geometry(4, 4, 0), pk.Geometry(4, 4, 2)
    x = rng.standard_normal((37, 2, 8)).astype(np.float32)
    plain = pk.CompressedCache(pk.UniformMean(g2, 8), kv_heads=2, d_k=8, d_v=8, local=3,
                               max_length=40)
    per_head = pk.CompressedCache(pk.UniformMean(g0, 8), kv_heads=2, d_k=8, d_v=8, local=3,
                                  max_length=40, origins=[2, 2])
    plain.append(x, x)
    per_head.append(x, x)
    assert plain.origins == [2, 2]
    assert np.array_equal(plain.entry_keys(), per_head.entry_keys())
    assert per_head.visible() == plain.visible()
    q = rng.standard_normal((4, 8)).astype(np.float32)
    assert all(np.array_equal(a, b) for a, b in zip(pk.decode(q, plain), pk.decode(q, per_head)))


def test_origins_bad_arguments(rng):
    g = pk.Geometry(4, 4, 0)
    make = lambda origins, policy=pk.UniformMean(g, 8): pk.CompressedCache(  # noqa: E731
        policy, kv_heads=3, d_k=8, d_v=8, local=2, max_length=30, origins=origins)
    with pytest.raises(ValueError, match=r"origins\.size\(\) = 2"):
        make([0, 1])
    with pytest.raises(ValueError, match=r"origins\[1\] = -1"):
        make([0, -1, 2])
    with pytest.raises(ValueError, match=r"origins\[2\] = 2199023255552"):
        make([0, 1, 2**41])
    with pytest.raises(TypeError, match="origins"):
        make("abc")
    with pytest.raises(ValueError, match=r"key_policy\.geometry\(\)\.origin\(\)"):
        make([0, 1, 2], pk.UniformMean(pk.Geometry(4, 4, 1), 8))
    cache = make([0, 1, 9])  # origins at or above S are allowed (a longer raw prefix)
    x = rng.standard_normal((12, 3, 8)).astype(np.float32)
    cache.append(x, x)
    assert cache.head_num_entries(2) == 0 and cache.visible(head=2).prefix_end == 9
    with pytest.raises(ValueError, match="origins"):
        cache.visible()
    with pytest.raises(ValueError, match=r"\bh = 3\b"):
        cache.head_geometry(3)
    with pytest.raises(ValueError, match=r"\bh = -1\b"):
        cache.entry_keys(head=-1)
    with pytest.raises(ValueError, match=r"\blocal = 3\b"):
        cache.visible(local=3, head=0)
    raw = rng.standard_normal((20, 3, 8)).astype(np.float32)
    ent = np.zeros((5, 3, 8), np.float32)
    q = np.ones((3, 8), np.float32)
    with pytest.raises(ValueError, match=r"origins\.size\(\) = 1"):
        pk.compress_batch(pk.UniformMean(g, 8), raw, ent, origins=[0])
    with pytest.raises(ValueError, match=r"origins\[0\] = -3"):
        pk.decode_arrays(q, raw, raw, 20, ent, ent, geometry=g, origins=[-3, 0, 0])
    with pytest.raises(ValueError, match="origins"):
        pk.decode_arrays(q, raw, raw, 20, origins=[0, 0, 0])  # no geometry
    with pytest.raises(ValueError, match=r"geometry\.origin"):
        pk.decode_arrays(q, raw, raw, 20, ent, ent, geometry=pk.Geometry(4, 4, 1),
                         origins=[0, 0, 0])
    with pytest.raises(ValueError, match=r"origins\[1\] = -2"):
        pk.prefill(q[None], raw, raw, first=3, entry_k=ent, entry_v=ent, geometry=g,
                   origins=[0, -2, 0])


def test_even_origins():
    assert pk.even_origins(8, 8) == list(range(8))
    assert pk.even_origins(4, 8) == [h * 4 // 8 for h in range(8)]
    assert pk.even_origins(128, 3) == [0, 42, 85]
    with pytest.raises(ValueError, match=r"stride = 0"):
        pk.even_origins(0, 2)
    with pytest.raises(ValueError, match=r"kv_heads = 0"):
        pk.even_origins(4, 0)
