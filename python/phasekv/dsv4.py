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
``indices`` and lengths int32, ``tokens`` int64. Block tables are vLLM's dense int32
``[B, max_blocks]`` arrays or FlashInfer's CSR form as a tuple ``(indptr [B + 1], indices)`` of
int32 arrays. Outputs given by the caller are written in
place; else new numpy arrays are returned. Bad arguments raise ``TypeError`` / ``ValueError``
naming the argument before anything is written. The kernels release the GIL.
"""

from . import _core

__all__ = [
    "MODEL1_TOKEN_BYTES",
    "V32_TOKEN_BYTES",
    "Compressor",
    "append_latent",
    "compress",
    "compress_append",
    "compressor_state_elements",
    "flash_mla_with_kvcache",
    "indexer_top_k",
    "model1_block_bytes",
    "paged_sparse_attention",
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
    - ``block_table``: int32 ``[B, max_blocks]`` (vLLM's dense table) or ``(indptr, indices)``
      (CSR): position p of sequence b goes to its block ``p // P``, slot ``p % P`` (``p % ring``
      with a ring).
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


def compress(kv, score, ape, *, ratio, coff=2, out=None):
    """DeepSeek-V4 batch compression of a whole prefill: ``kv`` and ``score`` ``[n, coff * dim]``
    (float32, bfloat16 or float16, C-contiguous), ``ape`` float32 ``[ratio, coff * dim]``.
    Entry j pools the blocks ``j - coff + 1 .. j`` of ``ratio`` tokens (half h through the
    channels ``[h * dim, (h + 1) * dim)``) with a per-channel softmax of ``score + ape[p % ratio]``
    over the window. ``coff`` 2 is CSA (ratio 4, overlapping windows of 2 * ratio), 1 is HCA
    (ratio 128). Returns the ``floor(n / ratio)`` entries, float32 ``[n // ratio, dim]``; the
    same bits as streaming the tokens through a Compressor."""
    return _core._dsv4_compress(kv, score, ape, ratio=ratio, coff=coff, out=out)


class Compressor:
    """The streaming DeepSeek-V4 compressor of one sequence (decode or chunked prefill): holds
    the trailing tokens' kv and score rows; appending tokens in any chunking emits the entries
    of ``compress`` over the whole sequence, bit for bit. ``ape`` float32 ``[ratio, coff * dim]``
    is read in place (keep it unchanged); ``dtype`` is the kv/score storage type."""

    def __init__(self, ape, *, ratio, coff=2, dtype="bfloat16"):
        width = int(ape.shape[1]) if len(getattr(ape, "shape", ())) == 2 else coff
        self._c = _core._Dsv4Compressor(ape, ratio=ratio, coff=coff, dim=max(1, width // coff),
                                        dtype=dtype)

    def append(self, kv, score, out=None):
        """Appends tokens (``kv``, ``score``: ``[count, coff * dim]``); returns the entries that
        complete, float32 ``[k, dim]`` (written into ``out`` when given)."""
        return self._c.append(kv, score, out)

    def reset(self):
        """Forgets every token."""
        self._c.reset()

    tokens = property(lambda self: self._c.tokens, doc="Tokens appended so far (n).")
    entries = property(lambda self: self._c.entries, doc="Entries emitted: floor(n / ratio).")
    ratio = property(lambda self: self._c.ratio, doc="S, tokens per block.")
    coff = property(lambda self: self._c.coff, doc="2 (CSA, overlapping) or 1 (HCA).")
    dim = property(lambda self: self._c.dim, doc="Entry width d.")


def compressor_state_elements(ratio, coff, dim):
    """Elements of one sequence's streaming state in ``compress_append``'s ``state``."""
    return _core._dsv4_compressor_state_elements(ratio, coff, dim)


def compress_append(kv, score, ape, state, cache, block_table, tokens, chunk_indptr=None, *,
                    ratio, coff=2, entry_scale=1.0):
    """Batched streaming compression into pages (an engine's decode or chunked prefill step):
    sequence b, holding ``tokens[b]`` tokens, appends its rows of ``kv`` / ``score``
    (``chunk_indptr`` as in ``append_latent``; None: one row each) to its compressor, whose
    trailing rows live in ``state[b]`` (same dtype as kv, ``[B, compressor_state_elements(...)]``,
    any content while ``tokens[b]`` is 0); every entry that completes is stored into its pages of
    ``cache`` (entry j at block ``block_table[b, j // P]``, slot ``j % P``; any latent cache
    format, quantized as ``append_latent`` does, divided by ``entry_scale``). ``tokens`` (int64,
    written) is advanced by each chunk's length. Entries equal ``compress`` over each whole
    sequence before storage."""
    _core._dsv4_compress_append(kv, score, ape, state, _bytes(cache), block_table, tokens,
                                chunk_indptr, ratio=ratio, coff=coff, entry_scale=entry_scale)


def indexer_top_k(q, w, keys, *, first_position, top_k, ratio=4, geometry=None, indices=None,
                  scores=None):
    """The DeepSeek-V4 lightning indexer for ``T`` queries at positions ``first_position ..
    first_position + T - 1``: ``q`` float32 ``[T, heads, dim]``, ``w`` float32 ``[T, heads]``,
    ``keys`` ``[num_keys, dim]`` (float32/bfloat16/float16, any row stride). The score of entry j
    is ``sum_h w[t, h] * max(0, <q[t, h], keys[j]>)`` over the entries visible at t, ``j <
    floor((t + 1) / ratio)`` (or ``geometry.complete_windows(t + 1)``). Returns ``(indices,
    scores)``: int32 and float32 ``[T, top_k]``, the top k in descending score, ties to the lower
    index, padded with -1 / -inf."""
    return _core._dsv4_indexer_top_k(q, w, keys, first_position=first_position, top_k=top_k,
                                     ratio=ratio, geometry=geometry, indices=indices,
                                     scores=scores)


def paged_sparse_attention(q, raw_cache, raw_table, lengths, *, entry_cache=None,
                           entry_table=None, ratio=0, indices=None, qo_indptr=None, window=128,
                           raw_ring=0, dim_v=None, scale=None, sinks=None, raw_scale=1.0,
                           entry_scale=1.0, out=None, lse=None, threads=1):
    """DeepSeek-V4 sparse attention for a batch over paged caches (decode, or ragged prefill with
    ``qo_indptr``): sequence b has seen ``lengths[b]`` (int64) tokens and has q_b queries (1, or
    ``qo_indptr[b + 1] - qo_indptr[b]``) at the last q_b positions, rows of ``q`` float32
    ``[rows, heads, dim]`` in sequence order. Raw position p lives at block
    ``raw_table[b, s // P]`` slot ``s % P`` of ``raw_cache``, with ``s = p`` (or ``p %
    raw_ring``); entry j at ``entry_table[b, j // P]`` of ``entry_cache`` (sequence b holds
    ``floor(lengths[b] / ratio)`` entries). Each query sees its window and its ``indices`` row
    (int32 ``[rows, k]``, -1 skipped) or, without indices, every entry visible at its position.
    Results equal ``sparse_attention`` over the same rows gathered contiguously, bit for bit.
    ``threads`` splits the sequences over a thread pool. Returns ``(out, lse)``."""
    return _core._dsv4_paged_sparse_attention(
        q, _bytes(raw_cache), raw_table, lengths, entry_cache=_bytes(entry_cache),
        entry_table=entry_table, ratio=ratio, indices=indices, qo_indptr=qo_indptr,
        window=window, raw_ring=raw_ring, dim_v=dim_v, scale=scale, sinks=sinks,
        raw_scale=raw_scale, entry_scale=entry_scale, out=out, lse=lse, threads=threads)
