"""Built-in policies, compress_batch and CompressedCache streaming against float64 numpy
references written here (the policy formulas of the design), for float32, bfloat16 and
float16 storage, plus streaming == batch bit for bit and the argument checks."""

import ml_dtypes
import numpy as np
import pytest

import phasekv as pk
from conftest import poison

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
# Relative error of storing a float: half an ulp of the storage type, plus f32 accumulation.
STORE_EPS = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


def ref_entries(kind, g, x, params):
    """Float64 reference entries of every complete window: x is [n, H, d] (float64)."""
    n, heads, _ = x.shape
    w, s, o = g.window, g.stride, g.origin
    j_count = (n - o - w) // s + 1 if n - o >= w else 0
    out = []
    for j in range(j_count):
        win = x[o + j * s : o + j * s + w]  # [W, H, d]
        if kind == "mean":
            e = win.mean(axis=0)
        elif kind == "select":
            e = win[params["offset"]]
        elif kind == "max":
            e = win.max(axis=0)
        elif kind == "fixed":
            wts = params["weights"].astype(np.float64)  # [H, W]
            e = np.einsum("hi,ihc->hc", wts, win)
        elif kind == "gated":
            z = params["z"].astype(np.float64)  # [H, W, G, d_in]
            b = params["b"].astype(np.float64)  # [H, W, G]
            c = params["c"].astype(np.float64)  # [H, W, d_out, d_in]
            logits = np.einsum("hwgk,whk->hwg", z, win) + b  # [H, W, G]
            alpha = np.exp(logits - logits.max(axis=1, keepdims=True))
            alpha /= alpha.sum(axis=1, keepdims=True)
            y = np.einsum("hwck,whk->hwc", c, win)  # [H, W, d_out]
            e = (alpha * y).sum(axis=1)  # G broadcasts over d_out (G = 1 or d_out)
        out.append(e)
    d_out = params.get("d_out", x.shape[2])
    return np.array(out).reshape(j_count, heads, d_out)


def make_policy(kind, g, heads, d, rng, d_out=None):
    params = {}
    if kind == "mean":
        return pk.UniformMean(g, d), params
    if kind == "select":
        params["offset"] = g.window - 1
        return pk.OffsetSelect(g, d, g.window - 1), params
    if kind == "max":
        return pk.MaxPool(g, d), params
    if kind == "fixed":
        params["weights"] = rng.random((heads, g.window)).astype(np.float32)
        return pk.FixedGates(g, d, heads, params["weights"]), params
    d_out = d_out or d
    gates = 1 if kind == "gated" else d_out
    params["d_out"] = d_out
    params["z"] = (0.3 * rng.standard_normal((heads, g.window, gates, d))).astype(np.float32)
    params["b"] = rng.standard_normal((heads, g.window, gates)).astype(np.float32)
    params["c"] = (rng.standard_normal((heads, g.window, d_out, d)) / np.sqrt(d)).astype(np.float32)
    pol = pk.GatedPool(
        g, heads, d, d_out, "scalar" if gates == 1 else "vector", params["z"], params["b"], params["c"]
    )
    return pol, params


KINDS = ["mean", "select", "max", "fixed", "gated", "gated_vector"]
CASES = [((5, 3, 2), 3, 37, 53), ((8, 4, 0), 2, 64, 70), ((8, 8, 1), 1, 128, 41), ((1, 1, 0), 2, 5, 9)]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("geo,heads,d,n", CASES)
def test_compress_batch_matches_reference(dtype, kind, geo, heads, d, n, rng):
    g = pk.Geometry(*geo)
    pol, params = make_policy(kind.replace("_vector", ""), g, heads, d, rng) if kind != "gated_vector" \
        else make_policy("gated_vector", g, heads, d, rng, d_out=d + 3)
    d_out = pol.output_dim
    raw = rng.standard_normal((n, heads, d)).astype(DTYPES[dtype])
    j = g.complete_windows(n)
    entries = poison((j + 2, heads, d_out), DTYPES[dtype])
    got_j = pk.compress_batch(pol, raw, entries)
    assert got_j == j
    ref = ref_entries("gated" if kind.startswith("gated") else kind, g, raw.astype(np.float64), params)
    got = entries[:j].astype(np.float64)
    assert not np.isnan(got).any()
    assert np.isnan(entries[j:].astype(np.float64)).all(), "wrote past J(n)"
    scale = max(1.0, np.abs(ref).max()) if ref.size else 1.0
    # f32 arithmetic over W terms (and d-term gate dot products), then one storage rounding.
    tol = STORE_EPS[dtype] * np.abs(ref) + (g.window + d) * 4 * 2.0**-24 * scale + 1e-30
    np.testing.assert_array_less(np.abs(got - ref), tol + 1e-7 * scale)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kind", ["mean", "gated", "max"])
def test_streaming_equals_batch_bit_for_bit(dtype, kind, rng):
    g = pk.Geometry(8, 4, 3)
    heads, d, local, n = 3, 64, 11, 157
    pol, _ = make_policy(kind, g, heads, d, rng)
    keys = rng.standard_normal((n, heads, d)).astype(DTYPES[dtype])
    values = rng.standard_normal((n, heads, d)).astype(DTYPES[dtype])
    cache = pk.CompressedCache(pol, kv_heads=heads, d_k=d, d_v=d, local=local, max_length=n, dtype=dtype)
    t = 0
    for chunk in [1, 2, 7, 30, 1, 64, 52]:
        cache.append(keys[t : t + chunk], values[t : t + chunk])
        t += chunk
        assert cache.size == t and cache.num_entries == g.complete_windows(t)
    assert t == n
    j = g.complete_windows(n)
    ek = poison((j, heads, d), DTYPES[dtype])
    ev = poison((j, heads, d), DTYPES[dtype])
    pk.compress_batch(pol, keys, ek, threads=3)
    pk.compress_batch(pol, values, ev)
    assert cache.entry_keys().dtype == np.dtype(DTYPES[dtype])
    assert cache.entry_keys().tobytes() == ek.tobytes()
    assert cache.entry_values().tobytes() == ev.tobytes()
    assert cache.memory_bytes < cache.uncompressed_bytes
    assert cache.visible() == g.visible(n, local)
    assert cache.visible(3) == g.visible(n, 3)


def test_strided_views_are_read_in_place(rng):
    # HND storage (a transposed view) and a head slice: any token/head stride works.
    g = pk.Geometry(4, 4, 0)
    hnd = rng.standard_normal((4, 40, 16)).astype(np.float32)  # [H, n, d]
    raw = hnd.transpose(1, 0, 2)[:, 1:3]  # [n, 2, d], token stride d, head stride n*d
    entries = poison((10, 2, 16))
    pk.compress_batch(pk.UniformMean(g, 16), raw, entries)
    ref = raw.astype(np.float64).reshape(10, 4, 2, 16).mean(axis=1)
    np.testing.assert_allclose(entries, ref, rtol=1e-6, atol=1e-6)
    assert pk._core._data_pointer(raw) == raw.__array_interface__["data"][0]
    assert pk._core._data_pointer(entries, True) == entries.__array_interface__["data"][0]


def test_empty_arrays(rng):
    # n below one window: J(n) = 0 and an empty entries array of any strides is accepted.
    g = pk.Geometry(8, 4, 0)
    raw = rng.standard_normal((5, 2, 16)).astype(np.float32)
    assert pk.compress_batch(pk.UniformMean(g, 16), raw, np.empty((0, 2, 16), np.float32)) == 0
    assert pk.compress_batch(pk.UniformMean(g, 16), raw[:0], np.empty((0, 2, 16), np.float32)) == 0
    with pytest.raises(pk.CapacityError, match="entries.tokens = 0"):
        pk.compress_batch(pk.UniformMean(g, 16), np.zeros((8, 2, 16), np.float32),
                          np.empty((0, 2, 16), np.float32))


def test_cycled_gates_move_the_gate_parameters(rng):
    g = pk.Geometry(4, 4, 0)
    heads, d = 2, 8
    pol, params = make_policy("gated", g, heads, d, rng)
    cyc = pol.cycled(1)
    assert cyc.gate_shift == 1 and pol.gate_shift == 0
    raw = rng.standard_normal((12, heads, d)).astype(np.float32)
    shifted = dict(params, z=np.roll(params["z"], 1, axis=1), b=np.roll(params["b"], 1, axis=1))
    ref = ref_entries("gated", g, raw.astype(np.float64), shifted)
    out = poison((3, heads, d))
    pk.compress_batch(cyc, raw, out)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    del params  # the policy keeps its parameter arrays alive


def test_bad_arguments_raise_and_write_nothing(rng):
    g = pk.Geometry(4, 4, 0)
    pol = pk.UniformMean(g, 8)
    raw = rng.standard_normal((16, 2, 8)).astype(np.float32)
    entries = poison((4, 2, 8))

    def untouched():
        return np.isnan(entries).all()

    with pytest.raises(TypeError, match="entries has dtype float16; expected float32"):
        pk.compress_batch(pol, raw, entries.astype(np.float16))
    with pytest.raises(TypeError, match="raw has dtype float64"):
        pk.compress_batch(pol, raw.astype(np.float64), entries)
    with pytest.raises(ValueError, match="entries.tokens = 3"):
        pk.compress_batch(pol, raw, entries[:3])
    with pytest.raises(ValueError, match="raw.dim = 4"):
        pk.compress_batch(pol, raw[:, :, :4], entries)
    with pytest.raises(ValueError, match="raw must have unit stride"):
        pk.compress_batch(pol, raw[:, :, ::2], entries)
    with pytest.raises(ValueError, match="raw must have 3 dimensions"):
        pk.compress_batch(pol, raw[0], entries)
    with pytest.raises(ValueError, match="entries is read-only"):
        ro = entries.copy()
        ro.flags.writeable = False
        pk.compress_batch(pol, raw, ro)
    with pytest.raises(ValueError, match="threads = 0"):
        pk.compress_batch(pol, raw, entries, threads=0)
    with pytest.raises(pk.ShapeError, match="entries.heads"):
        pk.compress_batch(pol, raw, poison((4, 3, 8)))
    with pytest.raises(pk.CapacityError):
        pk.compress_batch(pol, raw, entries[:2])
    with pytest.raises(ValueError, match="raw data is not aligned"):
        buf = np.zeros(16 * 2 * 8 * 4 + 2, dtype=np.uint8)
        pk.compress_batch(pol, buf[2:].view(np.float32).reshape(16, 2, 8), entries)
    assert untouched()
    with pytest.raises(ValueError, match="offset = 4"):
        pk.OffsetSelect(g, 8, 4)
    with pytest.raises(ValueError, match=r"gate_weight.shape\[1\] = 3"):
        pk.GatedPool(g, 2, 8, 8, "scalar", np.zeros((2, 3, 1, 8), np.float32))
    with pytest.raises(ValueError, match="gates = 'diag'"):
        pk.GatedPool(g, 2, 8, 8, "diag")
    with pytest.raises(TypeError, match="gate_bias has dtype float64"):
        pk.GatedPool(g, 2, 8, 8, "scalar", None, np.zeros((2, 4, 1)))
    with pytest.raises(ValueError, match=r"weights has shape \(2, 3\)"):
        pk.FixedGates(g, 8, 2, np.zeros((2, 3), np.float32))


def test_cache_checks(rng):
    g = pk.Geometry(4, 2, 0)
    pol = pk.UniformMean(g, 8)
    cache = pk.CompressedCache(pol, kv_heads=2, d_k=8, d_v=8, local=4, max_length=10, dtype="bfloat16")
    kv = rng.standard_normal((6, 2, 8)).astype(ml_dtypes.bfloat16)
    cache.append(kv, kv)
    with pytest.raises(TypeError, match="keys has dtype float32; expected bfloat16"):
        cache.append(kv.astype(np.float32), kv)
    with pytest.raises(pk.CapacityError, match="max_length"):
        cache.append(kv, kv)
    assert cache.size == 6  # nothing appended by the failed calls
    with pytest.raises(pk.ShapeError, match="values.heads"):
        cache.append(kv[:2], kv[:2, :1])
    with pytest.raises(ValueError, match="local = 5"):
        cache.visible(5)
    with pytest.raises(TypeError, match="value_policy is a MaxPool"):
        pk.CompressedCache(pol, pk.MaxPool(g, 8), kv_heads=2, d_k=8, d_v=8, local=4, max_length=10)
    with pytest.raises(TypeError, match="dtype = float64"):
        pk.CompressedCache(pol, kv_heads=2, d_k=8, d_v=8, local=4, max_length=10, dtype="float64")
    with pytest.raises(ValueError, match="layout = 'XYZ'"):
        pk.CompressedCache(pol, kv_heads=2, d_k=8, d_v=8, local=4, max_length=10, layout="XYZ")
    view = cache.entry_keys()
    assert view.flags.writeable is False
    cache.clear()
    assert cache.size == 0 and len(cache) == 0


def test_non_integer_local_is_a_type_error():
    g = pk.Geometry(4, 2, 0)
    cache = pk.CompressedCache(pk.UniformMean(g, 8), kv_heads=1, d_k=8, d_v=8, local=4, max_length=10)
    with pytest.raises(TypeError):
        cache.visible("3")
    with pytest.raises(TypeError):
        pk.decode(np.zeros((1, 8), np.float32), cache, local=1.5)
