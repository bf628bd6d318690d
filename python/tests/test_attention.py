"""CPU decode and prefill over compressed caches (and the uncompressed rules) against a
float64 numpy reference written here from the design's visibility and logit rules, for
float32, bfloat16 and float16 storage, single-threaded and threaded."""

import threading

import ml_dtypes
import numpy as np
import pytest

import phasekv as pk
from conftest import assert_releases_gil, poison

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def ref_visible_rows(n, geometry, local, window):
    """(raw positions, entry indices) a query at position n - 1 sees."""
    if geometry is None:
        lo = max(0, n - window) if window else 0
        return list(range(lo, n)), []
    w, s, o = geometry.window, geometry.stride, geometry.origin
    prefix_end = min(n, o)
    j = (n - o - w) // s + 1 if n - o >= w else 0
    tail = min(n, o + j * s)
    raw_begin = max(prefix_end, min(tail, n - local))
    return list(range(prefix_end)) + list(range(raw_begin, n)), list(range(j))


def ref_decode(q, raw_k, raw_v, ent_k, ent_v, n, geometry=None, local=0, window=0, scale=None,
               softcap=0.0, entry_bias=0.0, sinks=None):
    """Float64 decode: q [Hq, dk]; K/V float64 [tokens, Hkv, d]. Returns out [Hq, dv], lse [Hq]."""
    hq, dk = q.shape
    hkv, dv = raw_k.shape[1], raw_v.shape[2]
    group = hq // hkv
    scale = 1.0 / np.sqrt(dk) if scale is None else scale
    raw_pos, ents = ref_visible_rows(n, geometry, local, window)
    out = np.zeros((hq, dv))
    lse = np.full(hq, -np.inf)
    for h in range(hq):
        kvh = h // group
        keys = [raw_k[p, kvh] for p in raw_pos] + [ent_k[j, kvh] for j in ents]
        vals = [raw_v[p, kvh] for p in raw_pos] + [ent_v[j, kvh] for j in ents]
        is_entry = np.array([False] * len(raw_pos) + [True] * len(ents))
        if not keys and sinks is None:
            continue
        s = scale * (np.array(keys).reshape(-1, dk) @ q[h].astype(np.float64))
        if softcap > 0:
            s = softcap * np.tanh(s / softcap)
        s = s + np.where(is_entry, entry_bias, 0.0)
        all_s = np.concatenate([s, [sinks[h]]]) if sinks is not None else s
        m = all_s.max()
        p = np.exp(s - m)
        denom = np.exp(all_s - m).sum()
        lse[h] = m + np.log(denom)
        if keys:
            out[h] = (p[:, None] * np.array(vals).reshape(-1, dv)).sum(axis=0) / denom
    return out, lse


def check_close(out, lse, ref_out, ref_lse, vmax):
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=2e-5 * max(1.0, vmax))
    finite = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(lse), finite)
    err = np.abs(lse[finite] - ref_lse[finite])
    assert (err <= 2e-5 * (1 + np.abs(ref_lse[finite]))).all(), (lse, ref_lse)


def setup(rng, dtype, n, hkv, dk, dv, geometry):
    cast = DTYPES[dtype]
    raw_k = rng.standard_normal((n, hkv, dk)).astype(cast)
    raw_v = rng.standard_normal((n, hkv, dv)).astype(cast)
    j = geometry.complete_windows(n) if geometry else 0
    ent_k = np.zeros((j, hkv, dk), cast)
    ent_v = np.zeros((j, hkv, dv), cast)
    if geometry:
        pk.compress_batch(pk.UniformMean(geometry, dk), raw_k, ent_k)
        pk.compress_batch(pk.UniformMean(geometry, dv), raw_v, ent_v)
    return raw_k, raw_v, ent_k, ent_v


def f64(*arrays):
    return [a.astype(np.float64) for a in arrays]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("hq,hkv,dk,dv", [(4, 2, 64, 64), (7, 1, 37, 19), (6, 3, 128, 128), (5, 5, 256, 256)])
@pytest.mark.parametrize("threads", [1, 3])
def test_decode_over_cache_matches_reference(dtype, hq, hkv, dk, dv, threads, rng):
    g = pk.Geometry(8, 4, 3)
    local, n = 13, 301
    raw_k, raw_v, _, _ = setup(rng, dtype, n, hkv, dk, dv, None)
    cache = pk.CompressedCache(pk.UniformMean(g, dk), pk.UniformMean(g, dv), kv_heads=hkv, d_k=dk,
                               d_v=dv, local=local, max_length=n + 10, dtype=dtype)
    cache.append(raw_k[:100], raw_v[:100])
    cache.append(raw_k[100:], raw_v[100:])
    q = rng.standard_normal((hq, dk)).astype(np.float32)
    sinks = rng.standard_normal(hq).astype(np.float32)
    out, lse = poison((hq, dv)), poison(hq)
    res = pk.decode(q, cache, out, lse, softcap=5.0, entry_bias=float(np.log(8)), sinks=sinks,
                    threads=threads)
    assert res[0] is out and res[1] is lse
    ent_k, ent_v = cache.entry_keys(), cache.entry_values()
    ref = ref_decode(q, *f64(raw_k, raw_v, ent_k, ent_v), n, g, local, softcap=5.0,
                     entry_bias=np.log(8), sinks=sinks)
    check_close(out, lse, *ref, np.abs(raw_v.astype(np.float64)).max())
    # A smaller local window sees fewer raw tokens.
    out2, lse2 = pk.decode(q, cache, local=2, threads=threads)
    ref2 = ref_decode(q, *f64(raw_k, raw_v, ent_k, ent_v), n, g, 2)
    check_close(out2, lse2, *ref2, np.abs(raw_v.astype(np.float64)).max())


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("rule", ["compressed", "causal", "sliding"])
def test_decode_arrays_matches_reference(dtype, rule, rng):
    g = pk.Geometry(5, 3, 2) if rule == "compressed" else None
    window = 17 if rule == "sliding" else 0
    hq, hkv, dk, dv, n = 6, 2, 40, 24, 90
    raw_k, raw_v, ent_k, ent_v = setup(rng, dtype, n + 5, hkv, dk, dv, g)
    q = rng.standard_normal((hq, dk)).astype(np.float32)
    for count in [0, 1, 2, 7, 40, n]:
        kwargs = dict(geometry=g, local=9 if g else 0, window=window)
        out, lse = pk.decode_arrays(q, raw_k, raw_v, count, ent_k if g else None, ent_v if g else None,
                                    scale=0.3, **kwargs)
        ref = ref_decode(q, *f64(raw_k, raw_v, ent_k, ent_v), count, scale=0.3, **kwargs)
        check_close(out, lse, *ref, np.abs(raw_v.astype(np.float64)).max())
    out, lse = pk.decode_arrays(q, raw_k, raw_v, 0, geometry=g, window=window)
    assert (out == 0).all() and np.isneginf(lse).all()  # nothing visible


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("hq,hkv,dk,dv", [(4, 2, 64, 64), (3, 1, 33, 47)])
@pytest.mark.parametrize("threads", [1, 2])
def test_prefill_matches_reference(dtype, hq, hkv, dk, dv, threads, rng):
    g = pk.Geometry(8, 8, 1)
    local, first, t = 6, 37, 75
    n = first + t
    raw_k, raw_v, ent_k, ent_v = setup(rng, dtype, n, hkv, dk, dv, g)
    q = rng.standard_normal((t, hq, dk)).astype(np.float32)
    out, lse = poison((t, hq, dv)), poison((t, hq))
    pk.prefill(q, raw_k, raw_v, first=first, entry_k=ent_k, entry_v=ent_v, geometry=g, local=local,
               out=out, lse=lse, threads=threads)
    k64, v64, ek64, ev64 = f64(raw_k, raw_v, ent_k, ent_v)
    vmax = np.abs(v64).max()
    for i in range(t):
        ref = ref_decode(q[i], k64, v64, ek64, ev64, first + i + 1, g, local)
        check_close(out[i], lse[i], *ref, vmax)
    out_c, lse_c = pk.prefill(q, raw_k, raw_v, first=first, window=20, threads=threads)
    for i in range(0, t, 7):
        ref = ref_decode(q[i], k64, v64, ek64, ev64, first + i + 1, None, 0, 20)
        check_close(out_c[i], lse_c[i], *ref, vmax)


def test_outputs_are_the_callers_memory(rng):
    g = pk.Geometry(4, 4, 0)
    raw_k, raw_v, ent_k, ent_v = setup(rng, "float32", 32, 2, 16, 16, g)
    q = rng.standard_normal((4, 16)).astype(np.float32)
    # out is a row slice of a larger buffer: still C-contiguous, written in place.
    buf = poison((6, 16))
    lse = poison(4)
    out, lse_r = pk.decode_arrays(q, raw_k, raw_v, 32, ent_k, ent_v, geometry=g, out=buf[1:5], lse=lse)
    assert lse_r is lse and np.shares_memory(out, buf)
    assert not np.isnan(buf[1:5]).any() and np.isnan(buf[[0, 5]]).all()
    for a in (q, raw_k, raw_v, ent_k, ent_v):
        assert pk._core._data_pointer(a) == a.__array_interface__["data"][0]
    assert pk._core._data_pointer(buf[1:5], True) == buf[1:5].__array_interface__["data"][0]


def test_bad_arguments_raise_and_write_nothing(rng):
    g = pk.Geometry(4, 4, 0)
    raw_k, raw_v, ent_k, ent_v = setup(rng, "float32", 32, 2, 16, 16, g)
    q = rng.standard_normal((4, 16)).astype(np.float32)
    out, lse = poison((4, 16)), poison(4)
    kw = dict(geometry=g, out=out, lse=lse)
    cases = [
        (TypeError, "q has dtype float64", lambda: pk.decode_arrays(q.astype(np.float64), raw_k, raw_v, 32, ent_k, ent_v, **kw)),
        (ValueError, r"q has shape \(4, 8\)", lambda: pk.decode_arrays(q[:, :8], raw_k, raw_v, 32, ent_k, ent_v, **kw)),
        (ValueError, "q must be C-contiguous", lambda: pk.decode_arrays(np.asfortranarray(q), raw_k, raw_v, 32, ent_k, ent_v, **kw)),
        (TypeError, "raw_v has dtype float16", lambda: pk.decode_arrays(q, raw_k, raw_v.astype(np.float16), 32, ent_k, ent_v, **kw)),
        (TypeError, "entry_k has dtype bfloat16", lambda: pk.decode_arrays(q, raw_k, raw_v, 32, ent_k.astype(ml_dtypes.bfloat16), ent_v, **kw)),
        (pk.CapacityError, "raw_k.tokens = 32", lambda: pk.decode_arrays(q, raw_k, raw_v, 33, ent_k, ent_v, **kw)),
        (pk.CapacityError, "entry_k.tokens", lambda: pk.decode_arrays(q, raw_k, raw_v, 32, ent_k[:7], ent_v[:7], **kw)),
        (ValueError, "n = -1", lambda: pk.decode_arrays(q, raw_k, raw_v, -1, ent_k, ent_v, **kw)),
        (ValueError, "q_heads = 3", lambda: pk.decode_arrays(q[:3], raw_k, raw_v, 32, ent_k, ent_v, geometry=g, out=out[:3], lse=lse[:3])),
        (ValueError, r"out has shape \(4, 15\)", lambda: pk.decode_arrays(q, raw_k, raw_v, 32, ent_k, ent_v, geometry=g, out=poison((4, 15)), lse=lse)),
        (TypeError, "out has dtype float64", lambda: pk.decode_arrays(q, raw_k, raw_v, 32, ent_k, ent_v, geometry=g, out=np.zeros((4, 16)), lse=lse)),
        (ValueError, "out must be C-contiguous", lambda: pk.decode_arrays(q, raw_k, raw_v, 32, ent_k, ent_v, geometry=g, out=poison((4, 32))[:, ::2], lse=lse)),
        (ValueError, r"sinks has shape \(3,\)", lambda: pk.decode_arrays(q, raw_k, raw_v, 32, ent_k, ent_v, sinks=np.zeros(3, np.float32), **kw)),
        (ValueError, "variant.scale = nan", lambda: pk.decode_arrays(q, raw_k, raw_v, 32, ent_k, ent_v, scale=float("nan"), **kw)),
        (ValueError, "variant.softcap = -1", lambda: pk.decode_arrays(q, raw_k, raw_v, 32, ent_k, ent_v, softcap=-1.0, **kw)),
        (ValueError, "window must be 0 with a geometry", lambda: pk.decode_arrays(q, raw_k, raw_v, 32, ent_k, ent_v, window=3, **kw)),
        (ValueError, "local must be 0 without a geometry", lambda: pk.decode_arrays(q, raw_k, raw_v, 32, local=3, out=out, lse=lse)),
        (TypeError, "geometry must be a phasekv.Geometry", lambda: pk.decode_arrays(q, raw_k, raw_v, 32, geometry=(4, 4), out=out, lse=lse)),
        (ValueError, "threads = 0", lambda: pk.decode_arrays(q, raw_k, raw_v, 32, ent_k, ent_v, threads=0, **kw)),
        (TypeError, "raw_k must be an array", lambda: pk.decode_arrays(q, [[1.0]], raw_v, 32, ent_k, ent_v, **kw)),
        (ValueError, r"lse has shape \(2, 3\); expected \(2, 4\)", lambda: pk.prefill(np.stack([q, q]), raw_k, raw_v, first=30, entry_k=ent_k, entry_v=ent_v, geometry=g, out=poison((2, 4, 16)), lse=poison((2, 3)))),
        (pk.CapacityError, "raw_k.tokens = 32", lambda: pk.prefill(q[None], raw_k, raw_v, first=32, entry_k=ent_k, entry_v=ent_v, geometry=g)),
    ]
    for exc, msg, call in cases:
        with pytest.raises(exc, match=msg):
            call()
        assert np.isnan(out).all() and np.isnan(lse).all(), msg
    ro = poison((4, 16))
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        pk.decode_arrays(q, raw_k, raw_v, 32, ent_k, ent_v, geometry=g, out=ro, lse=lse)


def test_concurrent_calls_from_python_threads(rng):
    # Kernels release the GIL; calls from several threads give the single-thread results.
    g = pk.Geometry(8, 4, 0)
    raw_k, raw_v, ent_k, ent_v = setup(rng, "bfloat16", 2048, 2, 128, 128, g)
    qs = [rng.standard_normal((8, 128)).astype(np.float32) for _ in range(4)]
    want = [pk.decode_arrays(q, raw_k, raw_v, 2048, ent_k, ent_v, geometry=g, local=64) for q in qs]
    got = [None] * 4

    def work(i):
        for _ in range(5):
            got[i] = pk.decode_arrays(qs[i], raw_k, raw_v, 2048, ent_k, ent_v, geometry=g, local=64,
                                      threads=1 + i % 2)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for (wo, wl), (go, gl) in zip(want, got):
        np.testing.assert_allclose(go, wo, rtol=0, atol=1e-5)
        np.testing.assert_allclose(gl, wl, rtol=0, atol=1e-5)


def test_kernels_release_the_gil(rng):
    raw = rng.standard_normal((4096, 4, 128)).astype(np.float32)
    q = rng.standard_normal((256, 8, 128)).astype(np.float32)
    assert_releases_gil(lambda: pk.prefill(q, raw, raw, first=4096 - 256))


def test_time_decode_runs_the_same_step_as_decode(rng):
    """The overhead benchmark's C++ loop (phasekv._core._time_decode) computes what decode does."""
    g = pk.Geometry(8, 4)
    cache = pk.CompressedCache(pk.UniformMean(g, 32), kv_heads=2, d_k=32, d_v=32, local=8,
                               max_length=64)
    k = rng.standard_normal((50, 2, 32)).astype(np.float32)
    cache.append(k, k)
    q = rng.standard_normal((4, 32)).astype(np.float32)
    out, lse = pk.decode(q, cache)
    out2, lse2 = poison((4, 32)), poison(4)
    t = pk._core._time_decode(q, cache, out2, lse2, calls=3, repeat=2)
    assert t > 0
    np.testing.assert_array_equal(out2, out)
    np.testing.assert_array_equal(lse2, lse)
    with pytest.raises(ValueError, match="calls"):
        pk._core._time_decode(q, cache, out2, lse2, calls=0)


def test_threads_share_one_cache_without_deadlock(rng):
    """Decodes and appends on one CompressedCache from several threads finish: the cache's lock
    is never held while waiting for the GIL."""
    g = pk.Geometry(8, 4)
    cache = pk.CompressedCache(pk.UniformMean(g, 64), kv_heads=2, d_k=64, d_v=64, local=16,
                               max_length=20000)
    k = rng.standard_normal((4096, 2, 64)).astype(np.float32)
    cache.append(k, k)
    q = rng.standard_normal((8, 64)).astype(np.float32)
    errors = []

    def decode_loop():
        try:
            for _ in range(200):
                pk.decode(q, cache)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def append_loop():
        try:
            for _ in range(100):
                cache.append(k[:8], k[:8])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=f, daemon=True) for f in (decode_loop, decode_loop, append_loop)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in ts), "threads deadlocked on the cache"
    assert not errors, errors
    assert cache.size == 4096 + 800
