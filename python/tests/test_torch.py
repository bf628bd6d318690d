"""phasekv.torch: the custom ops against the numpy bindings and the float64 reference of
test_attention, torch.library.opcheck, torch.compile without graph breaks, and zero-copy
torch tensors (bfloat16 included). Skipped where torch is not importable."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import phasekv as pk  # noqa: E402
import phasekv.torch as pkt  # noqa: E402
from test_attention import check_close, ref_decode  # noqa: E402


def data(dtype=torch.bfloat16, n=70, hkv=2, hq=6, dk=64, dv=48, g=pk.Geometry(8, 4, 1), seed=0):
    gen = torch.Generator().manual_seed(seed)
    raw_k = torch.randn(n, hkv, dk, generator=gen).to(dtype)
    raw_v = torch.randn(n, hkv, dv, generator=gen).to(dtype)
    j = g.complete_windows(n)
    ek = torch.empty(j, hkv, dk, dtype=dtype)
    ev = torch.empty(j, hkv, dv, dtype=dtype)
    pk.compress_batch(pk.UniformMean(g, dk), raw_k, ek)  # torch tensors through DLPack
    pk.compress_batch(pk.UniformMean(g, dv), raw_v, ev)
    q = torch.randn(hq, dk, generator=gen)
    return q, raw_k, raw_v, ek, ev, g


def f64(*ts):
    return [t.to(torch.float64).numpy() for t in ts]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decode_op_matches_reference(dtype):
    q, raw_k, raw_v, ek, ev, g = data(dtype)
    sinks = torch.randn(q.shape[0])
    out, lse = pkt.decode(q, raw_k, raw_v, 70, ek, ev, geometry=g, local=5, softcap=4.0, sinks=sinks)
    assert out.dtype == torch.float32 and out.shape == (6, 48) and lse.shape == (6,)
    ref = ref_decode(q.numpy(), *f64(raw_k, raw_v, ek, ev), 70, g, 5, softcap=4.0, sinks=sinks.numpy())
    check_close(out.numpy(), lse.numpy(), *ref, float(raw_v.abs().max()))


def test_prefill_op_matches_reference():
    _, raw_k, raw_v, ek, ev, g = data(torch.float16)
    q = torch.randn(30, 6, 64)
    out, lse = pkt.prefill(q, raw_k, raw_v, 40, ek, ev, geometry=g, local=3, threads=2)
    k, v, e_k, e_v = f64(raw_k, raw_v, ek, ev)
    for i in range(30):
        ref = ref_decode(q[i].numpy(), k, v, e_k, e_v, 41 + i, g, 3)
        check_close(out[i].numpy(), lse[i].numpy(), *ref, float(raw_v.abs().max()))


def test_tensors_are_read_in_place():
    q, raw_k, raw_v, ek, ev, g = data()
    for t in (q, raw_k, raw_v, ek):
        assert pk._core._data_pointer(t) == t.data_ptr()
    # A head-sliced (non-contiguous but unit-stride) bf16 view is read in place too.
    view = raw_k[:, 1:2]
    assert pk._core._data_pointer(view) == view.data_ptr()


def test_bad_tensors_raise_naming_the_argument():
    q, raw_k, raw_v, ek, ev, g = data()
    with pytest.raises(TypeError, match="q has dtype bfloat16"):
        pkt.decode(q.to(torch.bfloat16), raw_k, raw_v, 70, ek, ev, geometry=g)
    with pytest.raises(TypeError, match="entry_k has dtype float32; expected bfloat16"):
        pkt.decode(q, raw_k, raw_v, 70, ek.float(), ev, geometry=g)
    with pytest.raises(ValueError, match="raw_k must have unit stride"):
        pkt.decode(q, raw_k.transpose(1, 2), raw_v, 70, ek, ev, geometry=g)
    with pytest.raises(pk.CapacityError, match="raw_k.tokens = 70"):
        pkt.decode(q, raw_k, raw_v, 71, ek, ev, geometry=g)


def test_opcheck():
    q, raw_k, raw_v, ek, ev, g = data(torch.float32, n=40)
    torch.library.opcheck(torch.ops.phasekv.decode.default,
                          (q, raw_k, raw_v, 40, ek, ev, 8, 4, 1, 5, 0, None, 0.0, 0.0, None, 1))
    torch.library.opcheck(torch.ops.phasekv.prefill.default,
                          (torch.randn(5, 6, 64), raw_k, raw_v, 35, ek, ev, 8, 4, 1, 5, 0, None,
                           0.0, 0.0, None, 1))
    torch.library.opcheck(torch.ops.phasekv.decode.default,
                          (q, raw_k, raw_v, 40, None, None, 0, 1, 0, 0, 16, 0.2, 0.0, 0.0, None, 1))


def test_compile_without_graph_breaks():
    q, raw_k, raw_v, ek, ev, g = data(torch.bfloat16)
    geo = (g.window, g.stride, g.origin)

    def step(q, raw_k, raw_v, ek, ev):
        out, lse = pkt.decode(q * 2.0, raw_k, raw_v, 70, ek, ev, geometry=geo, local=5)
        return out.sum(dim=-1) + lse

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = compiled(q, raw_k, raw_v, ek, ev)
    want = step(q, raw_k, raw_v, ek, ev)
    assert torch.equal(got, want)
