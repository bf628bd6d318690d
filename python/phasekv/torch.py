"""phasekv's kernels as PyTorch custom operators (``torch.library``), written in Python over
the same bindings: no torch headers, no torch at build time, any torch >= 2.4 at run time.

Importing this module registers

- ``torch.ops.phasekv.decode(q, raw_k, raw_v, n, entry_k, entry_v, window, stride, origin,
  local, sliding_window, scale, softcap, entry_bias, sinks, threads) -> (out, lse)``
- ``torch.ops.phasekv.prefill(q, raw_k, raw_v, first, entry_k, entry_v, window, stride,
  origin, local, sliding_window, scale, softcap, entry_bias, sinks, threads) -> (out, lse)``

with fake (meta) implementations, so they trace under ``torch.compile`` without graph breaks.
``window = 0`` selects uncompressed attention (causal, or a sliding window of
``sliding_window`` tokens); otherwise the geometry is (window, stride, origin) with a local
window of ``local`` raw tokens, as in :func:`phasekv.decode_arrays`. Tensors are CPU tensors
(float32, bfloat16 or float16 K/V; float32 queries), read in place through DLPack; outputs are
new float32 tensors. The plain functions :func:`decode` and :func:`prefill` call the ops with
keyword defaults; inside ``torch.compile`` give them the geometry as a ``(window, stride,
origin)`` tuple (dynamo does not read the attributes of a compiled ``phasekv.Geometry``).
"""

from typing import Optional, Tuple

import torch

from . import _core

__all__ = ["decode", "prefill"]


def _rule(window, stride, origin, local, sliding_window):
    if window == 0:
        return dict(geometry=None, local=local, window=sliding_window)
    return dict(geometry=_core.Geometry(window, stride, origin), local=local, window=sliding_window)


def _run(kernel, position_arg, out_shape, q, raw_k, raw_v, entry_k, entry_v, sinks, rule,
         **logits):
    """Calls a phasekv kernel on CPU tensors (read in place) into new float32 outputs."""
    tensors = dict(q=q, raw_k=raw_k, raw_v=raw_v, entry_k=entry_k, entry_v=entry_v, sinks=sinks)
    for name, t in tensors.items():
        if t is not None and t.device.type != "cpu":
            raise ValueError(f"phasekv.torch: {name} is on {t.device}; the phasekv ops take CPU "
                             "tensors")
    arrays = {name: None if t is None else t.detach() for name, t in tensors.items()}
    out = torch.empty(out_shape, dtype=torch.float32)
    lse = torch.empty(out_shape[:-1], dtype=torch.float32)
    kernel(**arrays, **position_arg, out=out, lse=lse, **rule, **logits)
    return out, lse


@torch.library.custom_op("phasekv::decode", mutates_args=())
def _decode_op(q: torch.Tensor, raw_k: torch.Tensor, raw_v: torch.Tensor, n: int,
               entry_k: Optional[torch.Tensor], entry_v: Optional[torch.Tensor], window: int,
               stride: int, origin: int, local: int, sliding_window: int,
               scale: Optional[float], softcap: float, entry_bias: float,
               sinks: Optional[torch.Tensor], threads: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return _run(_core.decode_arrays, dict(n=n), (q.shape[0], raw_v.shape[-1]), q, raw_k, raw_v,
                entry_k, entry_v, sinks, _rule(window, stride, origin, local, sliding_window),
                scale=scale, softcap=softcap, entry_bias=entry_bias, threads=threads)


@_decode_op.register_fake
def _(q, raw_k, raw_v, n, entry_k, entry_v, window, stride, origin, local, sliding_window, scale,
      softcap, entry_bias, sinks, threads):
    torch._check(q.dim() == 2, lambda: "phasekv.torch.decode: q must be [q_heads, d_k]")
    torch._check(raw_v.dim() == 3, lambda: "phasekv.torch.decode: raw_v must be [tokens, heads, d_v]")
    return (q.new_empty((q.shape[0], raw_v.shape[-1]), dtype=torch.float32),
            q.new_empty((q.shape[0],), dtype=torch.float32))


@torch.library.custom_op("phasekv::prefill", mutates_args=())
def _prefill_op(q: torch.Tensor, raw_k: torch.Tensor, raw_v: torch.Tensor, first: int,
                entry_k: Optional[torch.Tensor], entry_v: Optional[torch.Tensor], window: int,
                stride: int, origin: int, local: int, sliding_window: int,
                scale: Optional[float], softcap: float, entry_bias: float,
                sinks: Optional[torch.Tensor], threads: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return _run(_core.prefill, dict(first=first), (q.shape[0], q.shape[1], raw_v.shape[-1]), q,
                raw_k, raw_v, entry_k, entry_v, sinks,
                _rule(window, stride, origin, local, sliding_window), scale=scale,
                softcap=softcap, entry_bias=entry_bias, threads=threads)


@_prefill_op.register_fake
def _(q, raw_k, raw_v, first, entry_k, entry_v, window, stride, origin, local, sliding_window,
      scale, softcap, entry_bias, sinks, threads):
    torch._check(q.dim() == 3, lambda: "phasekv.torch.prefill: q must be [T, q_heads, d_k]")
    torch._check(raw_v.dim() == 3, lambda: "phasekv.torch.prefill: raw_v must be [tokens, heads, d_v]")
    return (q.new_empty((q.shape[0], q.shape[1], raw_v.shape[-1]), dtype=torch.float32),
            q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32))


def _geometry_ints(geometry):
    if geometry is None:
        return 0, 1, 0
    if isinstance(geometry, tuple):
        if len(geometry) != 3:
            raise ValueError(f"phasekv.torch: geometry = {geometry!r} is invalid (must be "
                             "(window, stride, origin))")
        return geometry
    return geometry.window, geometry.stride, geometry.origin


def decode(q, raw_k, raw_v, n, entry_k=None, entry_v=None, *, geometry=None, local=0,
           sliding_window=0, scale=None, softcap=0.0, entry_bias=0.0, sinks=None, threads=1):
    """``torch.ops.phasekv.decode`` with keyword defaults; ``geometry`` is a phasekv.Geometry or
    a (window, stride, origin) tuple (None: uncompressed attention). Returns (out [q_heads,
    d_v], lse [q_heads])."""
    w, s, o = _geometry_ints(geometry)
    return torch.ops.phasekv.decode(q, raw_k, raw_v, n, entry_k, entry_v, w, s, o, local,
                                    sliding_window, scale, softcap, entry_bias, sinks, threads)


def prefill(q, raw_k, raw_v, first, entry_k=None, entry_v=None, *, geometry=None, local=0,
            sliding_window=0, scale=None, softcap=0.0, entry_bias=0.0, sinks=None, threads=1):
    """``torch.ops.phasekv.prefill`` with keyword defaults (see :func:`decode`). Returns
    (out [T, q_heads, d_v], lse [T, q_heads])."""
    w, s, o = _geometry_ints(geometry)
    return torch.ops.phasekv.prefill(q, raw_k, raw_v, first, entry_k, entry_v, w, s, o, local,
                                     sliding_window, scale, softcap, entry_bias, sinks, threads)
