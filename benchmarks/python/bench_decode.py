"""Call overhead and speed of phasekv decode from Python (not a test; prints one line a case).

    PYTHONPATH=python:build/test/python python benchmarks/python/bench_decode.py

bfloat16 K/V, 32 query heads, 8 KV heads, d = 128, W = 8, S = 4, L = 128, one thread; best
of 7 repeats of 200 calls each.
"""

import timeit

import ml_dtypes
import numpy as np

import phasekv as pk

G = pk.Geometry(8, 4, 0)
RNG = np.random.default_rng(0)
HQ, HKV, D, LOCAL = 32, 8, 128, 128


def arrays(n):
    k = RNG.standard_normal((n, HKV, D)).astype(ml_dtypes.bfloat16)
    v = RNG.standard_normal((n, HKV, D)).astype(ml_dtypes.bfloat16)
    j = G.complete_windows(n)
    ek, ev = np.empty((j, HKV, D), ml_dtypes.bfloat16), np.empty((j, HKV, D), ml_dtypes.bfloat16)
    pk.compress_batch(pk.UniformMean(G, D), k, ek)
    pk.compress_batch(pk.UniformMean(G, D), v, ev)
    return k, v, ek, ev


def best_us(f):
    return min(timeit.repeat(f, number=200, repeat=7)) / 200 * 1e6


def main():
    q = RNG.standard_normal((HQ, D)).astype(np.float32)
    out, lse = np.empty((HQ, D), np.float32), np.empty(HQ, np.float32)
    for n in (1, 4096):
        k, v, ek, ev = arrays(n)
        cache = pk.CompressedCache(pk.UniformMean(G, D), kv_heads=HKV, d_k=D, d_v=D, local=LOCAL,
                                   max_length=n, dtype="bfloat16")
        cache.append(k, v)
        t = best_us(lambda: pk.decode(q, cache, out, lse))
        print(f"decode(q, cache, out, lse)                n={n:5d}: {t:8.1f} us/call")
        t = best_us(lambda: pk.decode_arrays(q, k, v, n, ek, ev, geometry=G, local=LOCAL, out=out,
                                             lse=lse))
        print(f"decode_arrays(q, k, v, n, ek, ev, ...)    n={n:5d}: {t:8.1f} us/call")
    f32 = np.zeros((HQ, D), np.float32)
    bf16 = np.zeros((4, HKV, D), ml_dtypes.bfloat16)
    print(f"import one float32 array:  {best_us(lambda: pk._core._data_pointer(f32)):.2f} us")
    print(f"import one bfloat16 array: {best_us(lambda: pk._core._data_pointer(bf16)):.2f} us")


if __name__ == "__main__":
    main()
