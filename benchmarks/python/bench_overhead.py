"""The Python call overhead of one CPU decode, side by side with the same call from C++, in one
process (issue 41, point 7). Not a test: prints a table.

    PYTHONPATH=python:build/<preset>/python python benchmarks/python/bench_overhead.py

For each context length n, the same cache, query and outputs are timed two ways, in alternating
rounds so that both see the same machine load:

- Python: ``pk.decode(q, cache, out, lse)`` in a Python loop (``timeit`` with a statement, no
  lambda), i.e. argument conversion, checks, the GIL release and the kernel;
- C++: ``phasekv._core._time_decode(...)``, a C++ loop over the same per-step work that a C++
  engine does for this call (the cache's visible set, ``check_decode_args``, ``cpu::decode``),
  timed with ``std::chrono::steady_clock`` and the GIL released.

Each time is the best over rounds of the mean over the calls of a round: 41 rounds of 50 calls
for n <= 1024, 201 rounds of 5 calls up to n = 8192 and of 1 call above (on a shared machine,
short rounds catch the moments when other processes leave the core alone). Overhead =
Python - C++, from the best times and as the median over rounds of the paired differences (the
robust figure on a loaded machine).
Bytes/s: the K/V bytes one call reads (visible rows x KV heads x (d_k + d_v) x 2 bytes of
bfloat16) over the time. bfloat16 K/V, 32 query heads, 8 KV heads, d = 128, W = 8, S = 4,
L = 128, one thread.
"""

import sys
import timeit

import ml_dtypes
import numpy as np

import phasekv as pk

G = pk.Geometry(8, 4, 0)
HQ, HKV, D, LOCAL = 32, 8, 128, 128
CALLS, ROUNDS = 50, 41  # n <= 1024; above, 201 rounds of 5 calls (1 above n = 8192)


def make_cache(n, rng):
    cache = pk.CompressedCache(pk.UniformMean(G, D), kv_heads=HKV, d_k=D, d_v=D, local=LOCAL,
                               max_length=n, dtype="bfloat16")
    step = 8192
    for at in range(0, n, step):
        m = min(step, n - at)
        k = rng.standard_normal((m, HKV, D)).astype(ml_dtypes.bfloat16)
        v = rng.standard_normal((m, HKV, D)).astype(ml_dtypes.bfloat16)
        cache.append(k, v)
    return cache


def measure(n, rng, calls=CALLS, rounds=ROUNDS):
    cache = make_cache(n, rng)
    q = rng.standard_normal((HQ, D)).astype(np.float32)
    out, lse = np.empty((HQ, D), np.float32), np.empty(HQ, np.float32)
    env = {"decode": pk.decode, "q": q, "cache": cache, "out": out, "lse": lse}
    py, cpp = [], []
    for _ in range(rounds):
        t = timeit.timeit("decode(q, cache, out, lse)", globals=env, number=calls)
        py.append(t / calls * 1e6)
        cpp.append(pk._core._time_decode(q, cache, out, lse, calls=calls, repeat=1))
    rows = G.visible(n, LOCAL).total()
    nbytes = rows * HKV * 2 * D * 2
    paired = float(np.median(np.array(py) - np.array(cpp)))
    return min(py), min(cpp), paired, nbytes


def main():
    lengths = [int(a) for a in sys.argv[1:]] or [1, 4096, 32768]
    rng = np.random.default_rng(0)
    print("| n | visible rows | Python us/call | C++ us/call | overhead us (best, paired "
          "median) | Python GB/s | C++ GB/s |")
    print("|--:|--:|--:|--:|--:|--:|--:|")
    for n in lengths:
        calls = CALLS if n <= 1024 else 5 if n <= 8192 else 1
        py, cpp, paired, nbytes = measure(n, rng, calls=calls,
                                          rounds=ROUNDS if n <= 1024 else 201)
        print(f"| {n} | {G.visible(n, LOCAL).total()} | {py:.1f} | {cpp:.1f} | {py - cpp:+.2f}, "
              f"{paired:+.2f} | {nbytes / py / 1e3:.2f} | {nbytes / cpp / 1e3:.2f} |")


if __name__ == "__main__":
    main()
