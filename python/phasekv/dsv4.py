"""DeepSeek-V4 operations on the CPU: FlashMLA's sparse decode call, the sparse attention over
latent rows, and FlashMLA's FP8 latent cache formats.

Latent caches (``k_cache``, ``raw``, ``entries``, ``cache``) hold one K = V row per token:

- float32, float16 or bfloat16 rows (``ml_dtypes.bfloat16`` in numpy, ``torch.bfloat16``),
  ``head_dim`` elements wide (or wider: the leading ``head_dim`` channels are used);
- or the bytes of FlashMLA's FP8 formats as ``uint8`` (or ``torch.float8_e4m3fn``, viewed as
  its bytes), told apart by the row width: 584 bytes a token for MODEL1 (DeepSeek-V4,
  ``head_dim`` 512: 448 E4M3 + 64 bf16 RoPE channels, the 7 UE8M0 scales of a token after the
  block's data, blocks padded to ``model1_block_bytes(P)``) and 656 bytes for V3.2 (``head_dim``
  576: 512 E4M3, 4 float32 scales, 64 bf16). See docs/deepseek_v4_engines.md.

Shapes: FlashMLA's ``[blocks, page_block_size, 1, width]``, or ``[blocks, page_block_size,
width]``, or (not MODEL1) one run of rows ``[rows, width]``; any block and token strides, unit
stride along the row. Queries, ``attn_sink``/``sinks``, outputs and log-sum-exps are float32;
``indices`` and lengths int32, ``tokens`` int64. Outputs given by the caller are written in
place; else new numpy arrays are returned. Bad arguments raise ``TypeError`` / ``ValueError``
naming the argument before anything is written. The kernels release the GIL.
"""

from . import _core

__all__ = [
    "MODEL1_TOKEN_BYTES",
    "V32_TOKEN_BYTES",
    "append_latent",
    "flash_mla_with_kvcache",
    "model1_block_bytes",
    "read_latent",
    "sparse_attention",
]

MODEL1_TOKEN_BYTES = 584
"""Bytes a token of FlashMLA's MODEL1 FP8 cache (DeepSeek-V4)."""
V32_TOKEN_BYTES = 656
"""Bytes a token of FlashMLA's V3.2 FP8 cache."""


def model1_block_bytes(page_block_size):
    """Bytes of a MODEL1 block of ``page_block_size`` tokens as FlashMLA pads it:
    ``page_block_size * 584`` rounded up to a multiple of 576."""
    return (int(page_block_size) * 584 + 575) // 576 * 576


def _bytes(x):
    """torch.float8_e4m3fn tensors as their bytes (uint8, the same memory); else ``x``."""
    dtype = getattr(x, "dtype", None)
    if dtype is not None and str(dtype) == "torch.float8_e4m3fn":
        import torch

        return x.view(torch.uint8)
    return x


def flash_mla_with_kvcache(q, k_cache, block_table=None, cache_seqlens=None, head_dim_v=512,
                           tile_scheduler_metadata=None, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=None, indices=None, attn_sink=None,
                           extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None, *, out=None, lse=None):
    """FlashMLA's sparse decode ``flash_mla_with_kvcache(..., indices=...)`` on the CPU, with
    FlashMLA's arguments in FlashMLA's order.

    - ``q``: float32 ``[B, s_q, h_q, head_dim]``.
    - ``k_cache``: ``[num_blocks, page_block_size, 1, width]`` (see the module description).
    - ``indices``: int32 ``[B, s_q, topk]``, each ``block * page_block_size + offset`` into
      ``k_cache`` or -1 (skipped). ``topk_length``: int32 ``[B]``, the leading indices used per
      sequence (None: all).
    - ``extra_k_cache`` + ``extra_indices_in_kvcache`` ``[B, s_q, extra_topk]`` +
      ``extra_topk_length`` ``[B]``: a second cache attended jointly (same format).
    - ``attn_sink``: float32 ``[h_q]``; ``softmax_scale``: None for ``head_dim ** -0.5``.
    - ``block_table`` and ``cache_seqlens`` must be None and ``causal`` False (the dense call
      is not implemented); ``tile_scheduler_metadata`` and ``num_splits`` are accepted and
      ignored (the CPU needs no schedule); ``is_fp8_kvcache``, when given, must match the cache.

    Returns ``(out, lse)``: float32 ``[B, s_q, h_q, head_dim_v]`` and ``[B, h_q, s_q]`` (FlashMLA
    returns bf16 ``out``). ``lse`` holds no sink; ``out`` is scaled by
    ``1 / (1 + exp(attn_sink - lse))``; a query with no valid index gets ``out = 0`` and
    ``lse = +inf`` (FlashMLA's convention).
    """
    return _core._dsv4_flash_mla_with_kvcache(
        q, _bytes(k_cache), block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
        num_splits, softmax_scale, causal, is_fp8_kvcache, indices, attn_sink,
        _bytes(extra_k_cache), extra_indices_in_kvcache, topk_length, extra_topk_length,
        out=out, lse=lse)


def sparse_attention(q, raw, entries=None, indices=None, *, first_position, window=128,
                     raw_first=0, entries_first=0, index_count=None, ratio=0, dim_v=None,
                     scale=None, sinks=None, raw_scale=1.0, entry_scale=1.0, out=None, lse=None):
    """DeepSeek-V4 sparse attention of ``T`` query tokens at positions ``first_position ..
    first_position + T - 1``: q float32 ``[T, heads, dim]``.

    Each query t sees the raw rows of positions ``[max(0, t + 1 - window), t]`` (``raw`` row r
    holds position ``raw_first + r``) and the entries of its index list ``indices[t - first]``
    (int32 ``[T, k]``, entry numbers, -1 skipped; ``entries`` row r holds entry
    ``entries_first + r``), or, without indices, the first ``index_count`` entries (default: all
    rows of ``entries``; with ``ratio`` S > 0 only the ``floor((t + 1) / S)`` complete ones, as
    in HCA). Rows are key and value at once: logits ``scale * <q, row>`` over ``dim`` channels
    (scale None: ``dim ** -0.5``), output the first ``dim_v`` channels (default ``dim``),
    ``sinks`` float32 ``[heads]`` in the denominator. ``raw_scale`` / ``entry_scale`` multiply
    the stored values (per-tensor scales). ``raw`` and ``entries`` have one storage type.

    Returns ``(out, lse)``: float32 ``[T, heads, dim_v]`` and ``[T, heads]`` (``lse`` includes
    the sink; nothing visible and no sink: 0 and -inf).
    """
    return _core._dsv4_sparse_attention(
        q, _bytes(raw), _bytes(entries), indices, first_position=first_position, window=window,
        raw_first=raw_first, entries_first=entries_first, index_count=index_count, ratio=ratio,
        dim_v=dim_v, scale=scale, sinks=sinks, raw_scale=raw_scale, entry_scale=entry_scale,
        out=out, lse=lse)


def append_latent(rows, cache, block_table, tokens, chunk_indptr=None, *, ring=0, scale=1.0):
    """Writes each sequence's new latent rows into its pages of ``cache`` (in place), stored as
    the cache's type: rounded to float32/float16/bfloat16, or quantized into MODEL1 / V3.2 FP8
    as FlashMLA's reference quantizer does (per 64- or 128-channel tile the power-of-two scale
    ``2 ** ceil(log2(max(amax / 448, 1e-4)))``, E4M3 codes rounded to nearest even, RoPE
    channels in bf16).

    - ``rows``: float32/float16/bfloat16 ``[rows, dim]`` (``dim`` 512 for MODEL1, 576 for V3.2).
    - ``cache``: ``[blocks, page_block_size, (1,) width]`` (written).
    - ``block_table``: int32 ``[B, max_blocks]`` (vLLM's dense table): position p of sequence
      b goes to block ``block_table[b, p // P]``, slot ``p % P`` (``p % ring`` with a ring).
    - ``tokens``: int64 ``[B]``, tokens each sequence held before (not changed).
    - ``chunk_indptr``: int32 ``[B + 1]``, sequence b's rows are
      ``rows[chunk_indptr[b]:chunk_indptr[b + 1]]``; None: one row each (decode).
    - ``scale``: stored values are ``row / scale``.
    """
    _core._dsv4_append_latent(rows, _bytes(cache), block_table, tokens, chunk_indptr, ring=ring,
                              scale=scale)


def read_latent(cache, *, dim=None, scale=1.0, out=None):
    """The rows of a latent cache as float32 (dequantized for the FP8 formats, times
    ``scale``): ``[blocks, page_block_size, dim]`` for a blocked cache, ``[rows, dim]`` for one
    run of rows. ``dim`` defaults to the format's width (512 MODEL1, 576 V3.2, else the row
    width)."""
    return _core._dsv4_read_latent(_bytes(cache), dim=dim, scale=scale, out=out)
