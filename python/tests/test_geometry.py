"""Geometry, Visibility, phases and residues against a reference written here from the
semantics of docs (DESIGN: windows [O + jS, O + jS + W), phase (p - O) mod S, J(n), raw tail,
visible set)."""

import itertools

import numpy as np
import pytest

import phasekv as pk


def ref_complete_windows(w, s, o, n):
    return (n - o - w) // s + 1 if n - o >= w else 0


def ref_visible(w, s, o, n, local):
    prefix_end = min(n, o)
    j = ref_complete_windows(w, s, o, n)
    tail = min(n, o + j * s)
    raw_begin = max(prefix_end, min(tail, n - local))
    return prefix_end, j, raw_begin, n


GEOMETRIES = [(1, 1, 0), (8, 8, 0), (8, 4, 0), (8, 4, 3), (2, 5, 1), (5, 3, 7), (128, 128, 4)]


@pytest.mark.parametrize("w,s,o", GEOMETRIES)
def test_windows_and_phases_match_reference(w, s, o):
    g = pk.Geometry(w, s, o)
    assert (g.window, g.stride, g.origin) == (w, s, o)
    assert g.has_gaps() == (w < s) and g.overlaps() == (w > s)
    for p in range(0, o + 4 * (w + s)):
        covering = [j for j in range(0, p + 1) if o + j * s <= p < o + j * s + w]
        assert g.cover_count(p) == len(covering)
        assert g.phase(p) == (-1 if p < o else (p - o) % s)
        for j in range(0, 3 + p // s):
            assert g.covers(j, p) == (j in covering)
            assert g.offset(p, j) == p - o - j * s
    for j in range(0, 20):
        assert g.window_begin(j) == o + j * s
        assert g.window_end(j) == o + j * s + w


@pytest.mark.parametrize("w,s,o", GEOMETRIES)
def test_visible_set_matches_reference(w, s, o):
    g = pk.Geometry(w, s, o)
    for n, local in itertools.product(range(0, o + 3 * w + 2 * s + 3), [0, 1, 3, 16]):
        assert g.complete_windows(n) == ref_complete_windows(w, s, o, n)
        assert g.raw_tail_begin(n) == min(n, o + ref_complete_windows(w, s, o, n) * s)
        v = g.visible(n, local)
        assert (v.prefix_end, v.entries, v.raw_begin, v.raw_end) == ref_visible(w, s, o, n, local)
        assert v.raw_count() == v.raw_end - v.raw_begin
        assert v.total() == v.prefix_end + v.entries + v.raw_count()
    assert g.ring_capacity(3) == max(w, 3)


def test_every_position_is_seen_once_or_through_an_entry():
    # Each raw position below n is visible raw, or inside a complete window, or a gap token.
    g = pk.Geometry(5, 3, 2)
    for n in range(0, 40):
        v = g.visible(n, 4)
        raw = set(range(v.prefix_end)) | set(range(v.raw_begin, v.raw_end))
        pooled = {p for j in range(v.entries) for p in range(g.window_begin(j), g.window_end(j))}
        gaps = {p for p in range(2, n) if g.cover_count(p) == 0}
        assert set(range(n)) <= raw | pooled | gaps
        assert all(p < n for p in raw)


def test_vectorized_phases_and_residues(rng):
    g = pk.Geometry(8, 4, 3)
    pos = rng.integers(0, 10_000, size=(7, 5)).astype(np.int64)
    ph = g.phases(pos)
    assert ph.shape == pos.shape and ph.dtype == np.int64
    assert np.array_equal(ph, np.where(pos < 3, -1, (pos - 3) % 4))
    signed = rng.integers(-500, 500, size=33).astype(np.int64)
    assert np.array_equal(pk.residues(signed, 8, 5), (signed - 5) % 8)
    assert pk.residue(-3, 8) == 5 and pk.residue(10, 8, 3) == 7


def test_stride_lcm():
    assert pk.stride_lcm([4, 128]) == 128
    assert pk.stride_lcm([4, 6, 10]) == 60
    with pytest.raises(ValueError, match="count"):
        pk.stride_lcm([])
    with pytest.raises(ValueError, match="strides"):
        pk.stride_lcm([4, 0])


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="window = 0"):
        pk.Geometry(0, 4)
    with pytest.raises(ValueError, match="stride = -1"):
        pk.Geometry(4, -1)
    with pytest.raises(ValueError, match="origin = -2"):
        pk.Geometry(4, 4, -2)
    with pytest.raises(ValueError, match="window"):
        pk.Geometry(1 << 41, 4)
    g = pk.Geometry(8, 4)
    with pytest.raises(ValueError, match="n = -1"):
        g.visible(-1, 0)
    with pytest.raises(ValueError, match="local = -3"):
        g.visible(10, -3)
    with pytest.raises(ValueError, match="p = -1"):
        g.phase(-1)
    with pytest.raises(ValueError, match="j = -1"):
        g.window_begin(-1)
    with pytest.raises(ValueError, match="j = "):
        g.window_begin(1 << 61)  # O + j*S would pass 2^62
    with pytest.raises(ValueError, match="modulus = 0"):
        pk.residue(3, 0)
    with pytest.raises(TypeError, match="positions has dtype float64"):
        g.phases(np.zeros(3))
    with pytest.raises(TypeError, match="positions must be an array"):
        g.phases("abc")
    with pytest.raises(ValueError, match="positions must be C-contiguous"):
        g.phases(np.arange(10, dtype=np.int64)[::2])
    with pytest.raises(ValueError, match=r"positions\[i\] = -4"):
        g.phases(np.array([1, -4], dtype=np.int64))


def test_geometry_value_semantics():
    a, b = pk.Geometry(8, 4, 1), pk.Geometry(8, 4, 1)
    assert a == b and hash(a) == hash(b) and a != pk.Geometry(8, 4, 2)
    assert repr(a) == "Geometry(window=8, stride=4, origin=1)"
    assert "entries=1" in repr(a.visible(9, 0))
