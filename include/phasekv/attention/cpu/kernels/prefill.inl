// phasekv: one prefill work item of one target pass (see core/foreach_target.inc), included
// by attention/cpu/prefill.hpp once per pass. No include guard, no includes.

PHASEKV_NAMESPACE_BEGIN
namespace cpu {
namespace detail {
namespace PHASEKV_TGT_NS {

/// The rows of a PrefillArgs' own views: `key(kind, p, kh)` / `value(kind, p, kh)` give the
/// key / value vector of position p (raw, prefix) or entry p (compressed), KV head kh.
template <class T, class Variant>
struct PrefillViewRows {
  const PrefillArgs<T, Variant>* a;  ///< The call.
  /// Key vector.
  PHASEKV_FORCEINLINE const T* key(SegmentKind kind, std::int64_t p, std::int64_t kh) const {
    return kind == SegmentKind::compressed ? a->entry_k.ptr(p, kh) : a->raw_k.ptr(p, kh);
  }
  /// Value vector.
  PHASEKV_FORCEINLINE const T* value(SegmentKind kind, std::int64_t p, std::int64_t kh) const {
    return kind == SegmentKind::compressed ? a->entry_v.ptr(p, kh) : a->raw_v.ptr(p, kh);
  }
};

/// One work item: KV head `kh`, queries `[i0, i1)`, keys and values found through the row
/// source `rs` (PrefillViewRows, or a paged sequence: serving/batch_prefill.hpp); the
/// arithmetic does not depend on where the rows are. Loops: key block (packed once to f32)
/// outer, row tiles of kPrefillRowTile query rows inner.
template <class Arch, class T, class Variant, class Src>
void prefill_item_rows(const PrefillArgs<T, Variant>& a, const Src& rs, std::int64_t kh,
                       std::int64_t i0, std::int64_t i1, PrefillScratch<T>& w) {
  using O = Vec<Arch>;
  constexpr std::int64_t KB = kPrefillKeys;
  constexpr std::int64_t RT = kPrefillRowTile;
  const std::int64_t G = a.q_heads / a.kv_heads;
  const std::int64_t nq = i1 - i0, M = nq * G;
  const std::int64_t dkp = round_up(a.d_k, O::W), dvp = round_up(a.d_v, 2 * O::W);
  static_assert(KB <= kPrefillScratchKeys && O::W <= 16, "the scratch layout is too small");
  w.prepare(M, nq, a.d_k, a.d_v);
  for (std::int64_t i = 0; i < M * dvp; ++i) w.o[i] = 0.0f;
  for (std::int64_t r = 0; r < M; ++r) {
    w.mx[r] = neg_inf();
    w.den[r] = 0.0f;
  }
  // rows r = (i - i0) * G + g
  const VisibilityRule rule = a.head_rule(kh);
  std::int64_t pre_hi = 0, raw_lo = -1, raw_hi = 0, ent_hi = 0;
  for (std::int64_t i = i0; i < i1; ++i) {
    const Visibility v = rule.at(a.first + i + 1);
    w.vis[static_cast<std::size_t>(i - i0)] = v;
    pre_hi = v.prefix_end > pre_hi ? v.prefix_end : pre_hi;
    ent_hi = v.entries > ent_hi ? v.entries : ent_hi;
    if (v.raw_count() > 0) {
      raw_lo = (raw_lo < 0 || v.raw_begin < raw_lo) ? v.raw_begin : raw_lo;
      raw_hi = v.raw_end > raw_hi ? v.raw_end : raw_hi;
    }
    for (std::int64_t g = 0; g < G; ++g) {
      const float* src = a.q + (i * a.q_heads + kh * G + g) * a.d_k;
      pack_row<Arch>(src, a.d_k, dkp, w.qp + ((i - i0) * G + g) * dkp);
    }
  }
  float* s = w.s;
  // one run of keys [lo, hi) of one kind from (keys, values) views
  const auto run = [&](std::int64_t lo, std::int64_t hi, SegmentKind kind) {
    for (std::int64_t b0 = lo; b0 < hi; b0 += KB) {
      const std::int64_t nk = (hi - b0) < KB ? hi - b0 : KB;
      constexpr int P = 2 * O::W;
      const std::int64_t ncols = round_up(nk, P);
      const T** krows = w.rows;
      // the rows of the next block are fetched while this one is multiplied (packing stalled
      // on their loads otherwise: about a quarter of the time in perf)
      const std::int64_t nb = b0 + KB, nn = (hi - nb) < KB ? hi - nb : KB;
      for (std::int64_t k = 0; k < nn; ++k) {
        prefetch_row(rs.key(kind, nb + k, kh), a.d_k);
        prefetch_row(rs.value(kind, nb + k, kh), a.d_v);
      }
      for (std::int64_t k = 0; k < nk; ++k) {
        krows[k] = rs.key(kind, b0 + k, kh);
        pack_value_panels<Arch, P>(rs.value(kind, b0 + k, kh), a.d_v, dvp, k, KB, w.vp);
      }
      pack_keys_panels<P>(krows, nk, ncols, a.d_k, w.kp);
      for (std::int64_t r0 = 0; r0 < M; r0 += RT) {
        const std::int64_t rows = (M - r0) < RT ? M - r0 : RT;
        bool any = false;
        for (std::int64_t r = 0; r < rows; ++r) {
          const Visibility& v = w.vis[static_cast<std::size_t>((r0 + r) / G)];
          std::int64_t vlo, vhi;  // visible interval of this row, in run coordinates
          if (kind == SegmentKind::prefix) {
            vlo = 0;
            vhi = v.prefix_end;
          } else if (kind == SegmentKind::compressed) {
            vlo = 0;
            vhi = v.entries;
          } else {
            vlo = v.raw_begin;
            vhi = v.raw_end;
          }
          std::int64_t a0 = vlo - b0, a1 = vhi - b0;  // visible keys [a0, a1) in the block
          a0 = a0 < 0 ? 0 : (a0 > nk ? nk : a0);
          a1 = a1 < a0 ? a0 : (a1 > nk ? nk : a1);
          w.lo[static_cast<std::size_t>(r)] = a0;
          w.hi[static_cast<std::size_t>(r)] = a1;
          any = any || a1 > a0;
        }
        if (!any) continue;  // no row of the tile sees this block
        qk_block<Arch>(w.qp + r0 * dkp, rows, dkp, w.kp, a.d_k, ncols, s, KB);
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t a0 = w.lo[static_cast<std::size_t>(r)];
          const std::int64_t a1 = w.hi[static_cast<std::size_t>(r)];
          float* row = s + r * KB;
          if (a1 > a0) transform_logits<Arch>(a.variant, kind, row + a0, a1 - a0);
          for (std::int64_t k = 0; k < a0; ++k) row[k] = neg_inf();
          for (std::int64_t k = a1; k < KB; ++k) row[k] = neg_inf();
          w.corr[static_cast<std::size_t>(r)] =
              softmax_block<Arch>(row, KB, KB, w.mx[static_cast<std::size_t>(r0 + r)],
                                  w.den[static_cast<std::size_t>(r0 + r)]);
        }
        pv_block<Arch>(s, rows, KB, w.vp, KB, nk, dvp, w.o + r0 * dvp, w.corr);
      }
    }
  };
  if (pre_hi > 0) run(0, pre_hi, SegmentKind::prefix);
  if (ent_hi > 0) run(0, ent_hi, SegmentKind::compressed);
  if (raw_lo >= 0 && raw_hi > raw_lo) run(raw_lo, raw_hi, SegmentKind::raw);
  // finish rows
  for (std::int64_t r = 0; r < M; ++r) {
    const std::int64_t i = i0 + r / G, h = kh * G + r % G;
    float* dst = a.out + (i * a.q_heads + h) * a.d_v;
    const float* src = w.o + r * dvp;
    const float den = w.den[static_cast<std::size_t>(r)];
    float l = neg_inf();
    if (den > 0.0f) {
      const float inv = 1.0f / den;
      for (std::int64_t c = 0; c < a.d_v; ++c) dst[c] = src[c] * inv;
      l = w.mx[static_cast<std::size_t>(r)] + std::log(den);
    } else if (den != den) {  // a NaN logit (NaN in q or a key): NaN, not "empty"
      for (std::int64_t c = 0; c < a.d_v; ++c) dst[c] = den;
      l = den;
    } else {
      for (std::int64_t c = 0; c < a.d_v; ++c) dst[c] = 0.0f;
    }
    if (a.variant.has_sink()) apply_sink(dst, l, a.variant.sink(h), a.d_v);
    a.lse[i * a.q_heads + h] = l;
  }
}

/// One work item over the call's own views (prefill_partition).
template <class Arch, class T, class Variant>
PHASEKV_NOINLINE void kernel_prefill_item(Target, Arch, const PrefillArgs<T, Variant>& a,
                                          std::int64_t kh, std::int64_t i0, std::int64_t i1,
                                          PrefillScratch<T>& w) {
  prefill_item_rows<Arch>(a, PrefillViewRows<T, Variant>{&a}, kh, i0, i1, w);
}

/// One work item whose rows come from the row source `src` (`key(kind, p, kh)`,
/// `value(kind, p, kh)`; the views of `a` are not read).
template <class Arch, class T, class Variant, class Src>
PHASEKV_NOINLINE void kernel_prefill_rows(Target, Arch, const PrefillArgs<T, Variant>& a,
                                          const Src& src, std::int64_t kh, std::int64_t i0,
                                          std::int64_t i1, PrefillScratch<T>& w) {
  prefill_item_rows<Arch>(a, src, kh, i0, i1, w);
}

}  // namespace PHASEKV_TGT_NS
}  // namespace detail
}  // namespace cpu
PHASEKV_NAMESPACE_END
