// phasekv: the decode step of one target pass (see core/foreach_target.inc), included by
// attention/cpu/decode.hpp once per pass. No include guard, no includes.

PHASEKV_NAMESPACE_BEGIN
namespace cpu {
namespace detail {
namespace PHASEKV_TGT_NS {

/// Logits of `ng` heads starting at head `h0` against `nt` key rows (dispatch on ng), with the
/// query `qf` (`[q_heads, d_k]`, permuted when rows of T are interleaved), or the AVX512-BF16
/// split-query path when `qsplit` is non-null.
template <class Arch, class T, class Variant, class R>
PHASEKV_FORCEINLINE void qk_group(const DecodeArgs<T, Variant>& a, const float* qf, std::int64_t h0,
                                  std::int64_t ng, R kp, std::int64_t nt, const bf16_t* qsplit,
                                  float* s, R kn, std::int64_t nn) {
#if PHASEKV_TGT_AVX512BF16
  if constexpr (uses_bf16_dot<Arch, T>::value) {
    if (qsplit != nullptr) {
      for (std::int64_t t = 0; t < nn; ++t) prefetch_row(kn[t], a.d_k);
      const bf16_t* hi = qsplit + h0 * a.d_k;
      const bf16_t* lo = qsplit + (a.q_heads + h0) * a.d_k;
      switch (ng) {
        case 1: qk_rows_bf16dot<1>(hi, lo, a.d_k, kp, nt, a.d_k, s); break;
        case 2: qk_rows_bf16dot<2>(hi, lo, a.d_k, kp, nt, a.d_k, s); break;
        case 3: qk_rows_bf16dot<3>(hi, lo, a.d_k, kp, nt, a.d_k, s); break;
        default: qk_rows_bf16dot<4>(hi, lo, a.d_k, kp, nt, a.d_k, s); break;
      }
      return;
    }
  }
#endif
  (void)qsplit;
  const float* qh = qf + h0 * a.d_k;
  const std::int64_t dk = a.d_k;
  switch (ng) {
    case 1: qk_rows_d<Arch, 1>(qh, dk, kp, nt, dk, s, kn, nn); break;
    case 2: qk_rows_d<Arch, 2>(qh, dk, kp, nt, dk, s, kn, nn); break;
    case 3: qk_rows_d<Arch, 3>(qh, dk, kp, nt, dk, s, kn, nn); break;
    default: qk_rows_d<Arch, 4>(qh, dk, kp, nt, dk, s, kn, nn); break;
  }
}

/// One step of the decode kernel: the `nt` key rows `kp` and value rows `vp` of one block of
/// KV head `kh` (kind `kind`) against the G query heads of that head, head tile by head tile,
/// into the accumulators `acc`, running maxima `mx` and denominators `den`. The first head tile
/// prefetches the `nn` rows `kn`/`vn` of a later step. `s` and `corr` are scratch. The rows are
/// StridedRows (one run of rows in memory) or PtrRows (rows through a page table): the same
/// arithmetic in the same order, so the same bits.
template <class Arch, class T, class Variant, class R>
PHASEKV_FORCEINLINE void decode_step(const DecodeArgs<T, Variant>& a, const float* qf,
                                     const bf16_t* qsplit, SegmentKind kind, std::int64_t kh, R kp,
                                     R vp, std::int64_t nt, R kn, R vn, std::int64_t nn, float* acc,
                                     float* mx, float* den, float* s, float* corr) {
  const std::int64_t group = a.q_heads / a.kv_heads;
  for (std::int64_t g0 = 0; g0 < group; g0 += kHeadTile) {
    const std::int64_t ng = (group - g0) < kHeadTile ? group - g0 : kHeadTile;
    const std::int64_t h0 = kh * group + g0;
    const std::int64_t pn = g0 == 0 ? nn : 0;  // the first head tile prefetches
    qk_group<Arch>(a, qf, h0, ng, kp, nt, qsplit, s, kn, pn);
    for (std::int64_t g = 0; g < ng; ++g)
      transform_logits<Arch>(a.variant, kind, s + g * kDecodeBlock, nt);
    switch (ng) {
      case 1: softmax_heads<Arch, 1>(s, kDecodeBlock, nt, mx + h0, den + h0, corr); break;
      case 2: softmax_heads<Arch, 2>(s, kDecodeBlock, nt, mx + h0, den + h0, corr); break;
      case 3: softmax_heads<Arch, 3>(s, kDecodeBlock, nt, mx + h0, den + h0, corr); break;
      default: softmax_heads<Arch, 4>(s, kDecodeBlock, nt, mx + h0, den + h0, corr); break;
    }
    float* ah = acc + h0 * a.d_v;
    switch (ng) {
      case 1: pv_rows_d<Arch, 1>(s, vp, nt, a.d_v, ah, a.d_v, corr, vn, pn); break;
      case 2: pv_rows_d<Arch, 2>(s, vp, nt, a.d_v, ah, a.d_v, corr, vn, pn); break;
      case 3: pv_rows_d<Arch, 3>(s, vp, nt, a.d_v, ah, a.d_v, corr, vn, pn); break;
      default: pv_rows_d<Arch, 4>(s, vp, nt, a.d_v, ah, a.d_v, corr, vn, pn); break;
    }
  }
}

/// Runs the decode kernel over tokens `[begin, end)` of the concatenated segments, for every
/// KV head, into one workspace slot (accumulators, max, denominators; initialized by caller).
///
/// The work of a segment is a sequence of (token block, KV head) steps, ordered so that memory
/// is walked in address order: blocks outer and heads inner for token-major (NHD-like) views,
/// heads outer for head-major (HND-like) views. While one step is computed, the rows of the
/// next step are prefetched into L2, the keys spread over the logit tiles and the values over
/// the value passes: hardware prefetchers do not follow a per-head stride that crosses a page
/// every few rows, and even on contiguous head-major rows they fall behind when the step
/// alternates between a key block and a value block. Not into L1: the next step's rows are as
/// large as L1. Token-major views without gaps between heads and tokens are prefetched a whole
/// block ahead instead: the step of head h fetches the h-th slice of the next block's K and V,
/// which are contiguous ranges (all heads), so the memory system sees sequential reads rather
/// than one d-element row every Hkv rows. (What each choice is worth: docs/kernels.md.)
template <class Arch, class T, class Variant>
void decode_range(const DecodeArgs<T, Variant>& a, const float* qf, std::int64_t begin,
                  std::int64_t end, float* acc, float* mx, float* den, const bf16_t* qsplit) {
  alignas(64) float s[kHeadTile * kDecodeBlock];
  float corr[kHeadTile];
  std::int64_t base = 0;
  for (int si = 0; si < a.kv.count; ++si) {
    const KVSegment<T>& seg = a.kv.segments[si];
    const std::int64_t lo = begin > base ? begin - base : 0;
    const std::int64_t hi = (end - base) < seg.size() ? end - base : seg.size();
    base += seg.size();
    if (hi <= lo) continue;
    const std::int64_t blocks = (hi - lo + kDecodeBlock - 1) / kDecodeBlock;
    const bool head_outer = seg.keys.head_stride > seg.keys.token_stride;
    // token-major rows without gaps: a block of all heads is one contiguous range of K (and V)
    const bool dense_tokens = !head_outer && seg.keys.head_stride == a.d_k &&
                              seg.values.head_stride == a.d_v &&
                              seg.keys.token_stride == a.kv_heads * a.d_k &&
                              seg.values.token_stride == a.kv_heads * a.d_v;
    const std::int64_t steps = blocks * a.kv_heads;
    const auto step_at = [&](std::int64_t st, std::int64_t& t0, std::int64_t& kh) {
      const std::int64_t b = head_outer ? st % blocks : st / a.kv_heads;
      kh = head_outer ? st / blocks : st % a.kv_heads;
      t0 = lo + b * kDecodeBlock;
    };
    for (std::int64_t st = 0; st < steps; ++st) {
      std::int64_t t0, kh;
      step_at(st, t0, kh);
      const std::int64_t nt = (hi - t0) < kDecodeBlock ? hi - t0 : kDecodeBlock;
      const StridedRows<T> kp{seg.keys.ptr(t0, kh), seg.keys.token_stride};
      const StridedRows<T> vp{seg.values.ptr(t0, kh), seg.values.token_stride};
      std::int64_t nn = 0;  // rows prefetched while this step runs
      StridedRows<T> kn = kp, vn = vp;
      if (dense_tokens) {
        // slice kh of the next block's contiguous K and V (all heads), as nn rows of d
        const std::int64_t t1 = t0 + kDecodeBlock;
        if (t1 < hi) {
          nn = (hi - t1) < kDecodeBlock ? hi - t1 : kDecodeBlock;
          kn = StridedRows<T>{seg.keys.ptr(t1, 0) + kh * nn * a.d_k, a.d_k};
          vn = StridedRows<T>{seg.values.ptr(t1, 0) + kh * nn * a.d_v, a.d_v};
        }
      } else if (st + 1 < steps) {  // the rows of the next step
        std::int64_t nb, nh;
        step_at(st + 1, nb, nh);
        nn = (hi - nb) < kDecodeBlock ? hi - nb : kDecodeBlock;
        kn.base = seg.keys.ptr(nb, nh);
        vn.base = seg.values.ptr(nb, nh);
      }
      decode_step<Arch>(a, qf, qsplit, seg.kind, kh, kp, vp, nt, kn, vn, nn, acc, mx, den, s, corr);
    }
  }
}

/// Prepares one workspace slot (`slot`: accumulators, max, denominators, query section) for
/// a partial result: the query copied (permuted for interleaved rows, or split into bf16
/// halves), the state emptied. Returns the query the kernels read; sets `qsplit`.
template <class Arch, class T, class Variant>
PHASEKV_FORCEINLINE const float* decode_slot_begin(const DecodeArgs<T, Variant>& args, float* acc,
                                                   bf16_t*& qsplit) {
  float* mx = acc + args.q_heads * args.d_v;
  float* den = mx + args.q_heads;
  qsplit = nullptr;
  const float* qf = args.q;
  float* qbuf = acc + decode_q_offset(args.q_heads, args.d_v);
#if PHASEKV_TGT_AVX512BF16
  if (uses_bf16_dot<Arch, T>::value && args.d_k % 32 == 0) {
    qsplit = reinterpret_cast<bf16_t*>(qbuf);
    for (std::int64_t h = 0; h < args.q_heads; ++h)
      for (std::int64_t i = 0; i < args.d_k; i += 32)
        Vec<arch::Avx512>::split_bf16(args.q + h * args.d_k + i, qsplit + h * args.d_k + i,
                                      qsplit + (args.q_heads + h) * args.d_k + i);
  }
#endif
  constexpr bool interleaved = pairs_interleaved<Arch, T>();
  if (qsplit == nullptr) {  // an aligned copy (permuted when rows are interleaved)
    if constexpr (interleaved) {
      for (std::int64_t h = 0; h < args.q_heads; ++h)
        permute_pairs<Arch>(args.q + h * args.d_k, qbuf + h * args.d_k, args.d_k);
    } else {
      std::memcpy(qbuf, args.q, static_cast<std::size_t>(args.q_heads * args.d_k) * sizeof(float));
    }
    qf = qbuf;
  }
  std::memset(acc, 0, static_cast<std::size_t>(args.q_heads * args.d_v) * sizeof(float));
  for (std::int64_t h = 0; h < args.q_heads; ++h) {
    mx[h] = neg_inf();
    den[h] = 0.0f;
  }
  return qf;
}

/// Finishes a workspace slot: normalized output and lse (stored over the running max).
template <class Arch, class T, class Variant>
PHASEKV_FORCEINLINE void decode_slot_finish(const DecodeArgs<T, Variant>& args, float* acc) {
  float* mx = acc + args.q_heads * args.d_v;
  float* den = mx + args.q_heads;
  constexpr bool interleaved = pairs_interleaved<Arch, T>();
  for (std::int64_t h = 0; h < args.q_heads; ++h) {
    float* o = acc + h * args.d_v;
    if constexpr (interleaved) unpermute_pairs<Arch>(o, args.d_v);
    if (den[h] > 0.0f) {
      const float inv = 1.0f / den[h];
      for (std::int64_t i = 0; i < args.d_v; ++i) o[i] *= inv;
      mx[h] = mx[h] + std::log(den[h]);
    } else if (den[h] != den[h]) {  // a NaN logit (NaN in q or a key): NaN, not "empty"
      for (std::int64_t i = 0; i < args.d_v; ++i) o[i] = den[h];
      mx[h] = den[h];
    } else {
      for (std::int64_t i = 0; i < args.d_v; ++i) o[i] = 0.0f;
      mx[h] = neg_inf();
    }
  }
}

/// decode_partition after its checks: partial `thread_index` of `thread_count` into its
/// workspace slot, with the kernels of architecture `Arch` (compiled in this pass).
template <class Arch, class T, class Variant>
PHASEKV_NOINLINE void kernel_decode_partition(Target, Arch, const DecodeArgs<T, Variant>& args,
                                              void* workspace, int thread_index, int thread_count) {
  const std::int64_t slot = decode_slot_floats(args.q_heads, args.d_k, args.d_v);
  float* acc = decode_workspace_base<float>(workspace) + slot * thread_index;
  float* mx = acc + args.q_heads * args.d_v;
  float* den = mx + args.q_heads;
  bf16_t* qsplit = nullptr;
  const float* qf = decode_slot_begin<Arch>(args, acc, qsplit);
  const WorkRange r = partition_range(args.kv.total(), thread_index, thread_count, kDecodeBlock);
  if (r.size() > 0) decode_range<Arch>(args, qf, r.begin, r.end, acc, mx, den, qsplit);
  decode_slot_finish<Arch>(args, acc);
}

/// The decode kernel over items `[begin, end)` of a visible set whose rows are reached through
/// a row source `src` (a paged sequence: see serving/batch_decode.hpp), in blocks of
/// kDecodeBlock items counted from each segment's first item in the range, exactly as
/// decode_range does for a VisibleKV, so both give the same bits for the same visible set.
/// `src` provides `segments()`, `size(si)`, `kind(si)`, `key_head_stride(si)`,
/// `value_head_stride(si)`, `head_major(si)` (a head's slots are adjacent inside a page) and
/// `rows(si, t0, nt, key_rows, value_rows)` (the head-0 row pointers of items `[t0, t0 + nt)`
/// of segment si).
///
/// Steps run over tiles of blocks: in head-major pages a tile of up to kRowsTileBlocks blocks
/// is walked KV heads outer, blocks inner (each head's accumulators stay in L1 over the tile,
/// as in decode_range's head-major walk), in token-major pages one block at a time, heads inner
/// (address order). Each head sees its blocks in position order either way, so the walk does not
/// change the bits. Each step prefetches the rows of the next one, across tile and page
/// boundaries (the row pointers of a tile and of the block after it are filled up front).
template <class Arch, class T, class Variant, class Src>
void decode_range_rows(const DecodeArgs<T, Variant>& a, const Src& src, const float* qf,
                       std::int64_t begin, std::int64_t end, float* acc, float* mx, float* den,
                       const bf16_t* qsplit) {
  constexpr int TB = kRowsTileBlocks;
  alignas(64) float s[kHeadTile * kDecodeBlock];
  float corr[kHeadTile];
  // Row pointers of the tile's blocks and of the block after it (buffer TB at most).
  const T* krows[TB + 1][kDecodeBlock];
  const T* vrows[TB + 1][kDecodeBlock];
  // Per buffer: its rows, whether its K rows and its V rows are each evenly spaced (a block
  // inside one page), and their spacing. Tiles whose blocks are all even take the strided row
  // walk, as contiguous buffers do (the same arithmetic, so the same bits, without a pointer
  // load per row).
  std::int64_t cnt[TB + 1];
  bool even[TB + 1];
  std::int64_t kstep[TB + 1], vstep[TB + 1];
  const auto gather = [&](int buf, int si, std::int64_t t0, std::int64_t nt) {
    cnt[buf] = nt;
    src.rows(si, t0, nt, krows[buf], vrows[buf]);
    const T* const* kr = krows[buf];
    const T* const* vr = vrows[buf];
    const std::int64_t ks = nt > 1 ? kr[1] - kr[0] : 0, vs = nt > 1 ? vr[1] - vr[0] : 0;
    bool e = true;
    for (std::int64_t t = 2; e && t < nt; ++t)
      e = kr[t] - kr[t - 1] == ks && vr[t] - vr[t - 1] == vs;
    even[buf] = e;
    kstep[buf] = ks;
    vstep[buf] = vs;
  };
  std::int64_t base = 0;
  const int segments = src.segments();
  for (int si = 0; si < segments; ++si) {
    const std::int64_t size = src.size(si);
    const std::int64_t lo = begin > base ? begin - base : 0;
    const std::int64_t hi = (end - base) < size ? end - base : size;
    base += size;
    if (hi <= lo) continue;
    const SegmentKind kind = src.kind(si);
    const std::int64_t khs = src.key_head_stride(si), vhs = src.value_head_stride(si);
    const std::int64_t tile_blocks = src.head_major(si) ? TB : 1;
    const std::int64_t tile_items = tile_blocks * kDecodeBlock;
    for (std::int64_t t0 = lo; t0 < hi; t0 += tile_items) {
      int nb = 0;  // blocks in this tile
      for (std::int64_t b0 = t0; nb < tile_blocks && b0 < hi; b0 += kDecodeBlock, ++nb)
        gather(nb, si, b0, (hi - b0) < kDecodeBlock ? hi - b0 : kDecodeBlock);
      const std::int64_t t1 = t0 + nb * kDecodeBlock;  // the block after the tile, if any
      if (t1 < hi)
        gather(nb, si, t1, (hi - t1) < kDecodeBlock ? hi - t1 : kDecodeBlock);
      else
        cnt[nb] = 0;
      bool strided = true;
      for (int b = 0; b <= nb; ++b) strided = strided && (cnt[b] == 0 || even[b]);
      for (std::int64_t kh = 0; kh < a.kv_heads; ++kh) {
        for (int b = 0; b < nb; ++b) {
          // the next step: the next block of this head, else the first block of the next head,
          // else the block after the tile (head 0)
          int nbuf = nb;
          std::int64_t nh = 0;
          if (b + 1 < nb) {
            nbuf = b + 1;
            nh = kh;
          } else if (kh + 1 < a.kv_heads) {
            nbuf = 0;
            nh = kh + 1;
          }
          const std::int64_t pn = cnt[nbuf];
          if (strided) {
            const StridedRows<T> kp{krows[b][0] + kh * khs, kstep[b]};
            const StridedRows<T> vp{vrows[b][0] + kh * vhs, vstep[b]};
            const StridedRows<T> kn =
                pn > 0 ? StridedRows<T>{krows[nbuf][0] + nh * khs, kstep[nbuf]} : kp;
            const StridedRows<T> vn =
                pn > 0 ? StridedRows<T>{vrows[nbuf][0] + nh * vhs, vstep[nbuf]} : vp;
            decode_step<Arch>(a, qf, qsplit, kind, kh, kp, vp, cnt[b], kn, vn, pn, acc, mx, den, s,
                              corr);
          } else {
            const PtrRows<T> kp{krows[b], kh * khs}, vp{vrows[b], kh * vhs};
            const PtrRows<T> kn{krows[nbuf], nh * khs}, vn{vrows[nbuf], nh * vhs};
            decode_step<Arch>(a, qf, qsplit, kind, kh, kp, vp, cnt[b], kn, vn, pn, acc, mx, den, s,
                              corr);
          }
        }
      }
    }
  }
}

/// One partial result of a paged decode: items `[begin, end)` of the visible set that `src`
/// describes (query `args.q`, shapes and variant from `args`; `args.kv` unused) into the
/// workspace slot at `slot` (decode_slot_floats floats, 64-byte aligned), finished (normalized
/// output, lse) for decode_merge's arithmetic.
template <class Arch, class T, class Variant, class Src>
PHASEKV_NOINLINE void kernel_decode_rows(Target, Arch, const DecodeArgs<T, Variant>& args,
                                         const Src& src, float* slot, std::int64_t begin,
                                         std::int64_t end) {
  float* mx = slot + args.q_heads * args.d_v;
  float* den = mx + args.q_heads;
  bf16_t* qsplit = nullptr;
  const float* qf = decode_slot_begin<Arch>(args, slot, qsplit);
  if (end > begin) decode_range_rows<Arch>(args, src, qf, begin, end, slot, mx, den, qsplit);
  decode_slot_finish<Arch>(args, slot);
}

}  // namespace PHASEKV_TGT_NS
}  // namespace detail
}  // namespace cpu
PHASEKV_NAMESPACE_END
