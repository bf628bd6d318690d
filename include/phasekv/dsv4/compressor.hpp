/// @file
/// @brief The DeepSeek-V4 KV compressor (CSA ratio 4 with overlap, HCA ratio 128): per-channel
/// softmax pooling of projected `kv` rows weighted by projected `score` rows plus a learned
/// per-slot bias `ape`, in batch and streaming form (same bits), and a batched streaming append
/// whose entries go into pages (compress_append_paged).
///
/// Notation: ratio S, `coff` in {1, 2}, entry width d. Per token p the model projects
/// `kv(p)` and `score(p)`, each `coff * d` wide; `ape` is `[S, coff * d]`. Block b holds the
/// tokens `[b*S, (b+1)*S)`. Entry j pools the blocks `j - coff + 1 .. j` (blocks below 0 are
/// absent): half h in `[0, coff)` takes block `j - coff + 1 + h` through the channels
/// `[h*d, (h+1)*d)` of kv, score and ape. With coff = 2 (CSA) the window is 2S tokens: the
/// previous S tokens through the first d channels and the current S through the second d; with
/// coff = 1 (HCA) the window is the S tokens of block j. For channel c in `[0, d)`:
///
///     z(p, h, c) = score(p)[h*d + c] + ape[p mod S][h*d + c]
///     a(p, h, c) = exp(z(p, h, c)) / sum_{(p', h') in window j} exp(z(p', h', c))
///     e_j[c]     = sum_{(p, h) in window j} a(p, h, c) * kv(p)[h*d + c]
///
/// Entry j is complete when token `(j+1)*S - 1` arrives, so after n tokens `floor(n / S)`
/// entries exist (`Geometry(S, S).complete_windows(n)`; with coff = 2 this is also
/// `Geometry(2S, S).complete_windows(n + S)`: window j spans `[(j-1)*S, (j+1)*S)` and window 0
/// has only its current half). Norm, RoPE and quantization are not part of the pooling: the
/// engine supplies them as a hook called on each finished entry (see EntryInfo).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "phasekv/attention/cpu/dispatch.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/target.hpp"
#include "phasekv/dsv4/fp8.hpp"
#include "phasekv/dsv4/paged_latent.hpp"

PHASEKV_NAMESPACE_BEGIN

/// DeepSeek-V4 attention building blocks: compressor, lightning indexer, sparse attention.
namespace dsv4 {

/// Shape and learned bias of one DeepSeek-V4 compressor.
struct CompressorParams {
  std::int64_t ratio = 4;      ///< S: tokens per block (4 for CSA, 128 for HCA).
  std::int64_t coff = 2;       ///< 2: overlapping window of 2S (CSA); 1: window of S (HCA).
  std::int64_t dim = 512;      ///< d: width of one pooled entry.
  const float* ape = nullptr;  ///< Per-slot score bias, `[ratio, coff * dim]` row-major.

  /// Width of one token's kv (and score) row: `coff * dim`.
  std::int64_t row_width() const { return coff * dim; }
  /// Tokens one window spans: `coff * ratio` (W).
  std::int64_t window() const { return coff * ratio; }
  /// Entries complete after `n` tokens: `floor(n / ratio)`.
  std::int64_t entries(std::int64_t n) const { return n / ratio; }

  /// Host check; throws phasekv::invalid_argument naming `where` and the bad field.
  void check(const char* where) const {
    phasekv::detail::check_arg(ratio >= 1 && ratio <= (std::int64_t{1} << 20), where,
                               "params.ratio", ratio, "must be in [1, 2^20]");
    phasekv::detail::check_arg(coff == 1 || coff == 2, where, "params.coff", coff,
                               "must be 1 (no overlap) or 2 (overlapping window of 2 * ratio)");
    phasekv::detail::check_arg(dim >= 1 && dim <= (std::int64_t{1} << 20), where, "params.dim", dim,
                               "must be in [1, 2^20]");
    phasekv::detail::check_arg(ape != nullptr, where, "params.ape", "null",
                               "must point to [ratio, coff * dim] floats");
  }
};

/// What a hook learns about an entry the compressor has just pooled.
///
/// The hook is any callable `void(const EntryInfo&, float* entry)`; `entry` holds the d pooled
/// floats and may be changed in place (RMSNorm, RoPE) or read and stored elsewhere
/// (quantization into the engine's cache). Hooks run in entry order, once per entry. A hook
/// that throws stops the call: the entries before it stay written, and a CompressorState is
/// left in an unspecified state (reset() it).
struct EntryInfo {
  std::int64_t index = 0;     ///< j: the entry's index (0-based).
  std::int64_t position = 0;  ///< `j * ratio`: the first token of block j, where the DeepSeek
                              ///< reference code rotates the entry with RoPE.
  std::int64_t first = 0;     ///< First token the window reaches: `max(0, (j - coff + 1) * S)`.
  std::int64_t last = 0;      ///< Last token of the window, `(j + 1) * S - 1`; the entry is
                              ///< emitted when this token arrives.
  std::int64_t sequence = 0;  ///< b: the sequence of a batched call
                              ///< (compress_append_paged); 0 otherwise.
};

/// The hook that does nothing (entries are stored as pooled).
struct NoHook {
  /// Does nothing.
  PHASEKV_HOST_DEVICE void operator()(const EntryInfo&, float*) const {}
};

namespace detail {

// Prefetch (into L2, for reading: the pooling kernel asks for the next entry's rows one entry
// ahead, more than L1 holds for HCA) of the line `bytes` past `p`; never faults, no pointer is
// formed out of bounds (p may be null). No-op without the GCC/Clang builtin.
PHASEKV_FORCEINLINE void prefetch_ahead(const void* p, std::int64_t bytes) {
#if defined(__GNUC__)
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(p) +
                                                   static_cast<std::uintptr_t>(bytes)),
                     0, 2);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace detail
}  // namespace dsv4
PHASEKV_NAMESPACE_END

#if !defined(PHASEKV_DOXYGEN)  // the pooling kernel, once per target pass
#include "phasekv/cpu/vec.hpp"
#define PHASEKV_TARGET_BODY "phasekv/dsv4/cpu/pool_pass.inl"
#include "phasekv/core/foreach_target.inc"
#endif

PHASEKV_NAMESPACE_BEGIN
namespace dsv4 {
namespace detail {

// Pools one entry with the instruction-set build `arch` (see dsv4/cpu/pool_pass.inl; a build
// this translation unit does not compile runs the base pass): kv_blocks[h] / score_blocks[h]
// point to row 0 of the block seen through half h (S rows `stride` elements apart) or are null
// when that block is absent (before token 0).
template <class T>
inline void pool_entry_on(cpu::ArchId arch, const CompressorParams& p, const T* const* kv_blocks,
                          const T* const* score_blocks, std::int64_t stride, float* out) {
#if PHASEKV_HAS_AVX512
  if (arch == cpu::ArchId::avx512)
    return phasekv::detail::tgt_avx512::dsv4pool::pool_entry<T>(p, kv_blocks, score_blocks, stride,
                                                                out);
#endif
#if PHASEKV_HAS_AVX2
  if (arch == cpu::ArchId::avx2)
    return phasekv::detail::tgt_avx2::dsv4pool::pool_entry<T>(p, kv_blocks, score_blocks, stride,
                                                              out);
#endif
  (void)arch;
  phasekv::detail::tgt_base::dsv4pool::pool_entry<T>(p, kv_blocks, score_blocks, stride, out);
}

// pool_entry_on the build of the CPU (cpu::active_arch(), so PHASEKV_ARCH forces one); the
// batch and the streaming paths both call it, so they agree bit for bit.
template <class T>
inline void pool_entry(const CompressorParams& p, const T* const* kv_blocks,
                       const T* const* score_blocks, std::int64_t stride, float* out) {
  static const cpu::ArchId arch = cpu::active_arch();
  pool_entry_on<T>(arch, p, kv_blocks, score_blocks, stride, out);
}

// A hook's own host check, when it has one (EntryPostprocess::check), and, when it has a
// `dim` (the rows it post-processes), that it is the compressor's: a wider hook would write past
// the entry. Throws phasekv::invalid_argument naming the field.
template <class Hook>
auto check_hook_fields(const Hook& hook, const char* where, int)
    -> decltype(hook.check(where), void()) {
  hook.check(where);
}
template <class Hook>
void check_hook_fields(const Hook&, const char*, long) {}
template <class Hook>
auto check_hook_dim(const Hook& hook, std::int64_t dim, const char* where, int)
    -> decltype(static_cast<std::int64_t>(hook.dim), void()) {
  phasekv::detail::check_arg(static_cast<std::int64_t>(hook.dim) == dim, where, "hook.dim",
                             static_cast<std::int64_t>(hook.dim), "must equal params.dim");
}
template <class Hook>
void check_hook_dim(const Hook&, std::int64_t, const char*, long) {}
template <class Hook>
void check_hook(const Hook& hook, std::int64_t dim, const char* where) {
  check_hook_fields(hook, where, 0);
  check_hook_dim(hook, dim, where, 0);
}

// What a hook learns about entry j of a compressor of ratio S and overlap coff (host and
// device: the CUDA compressor calls hooks too).
PHASEKV_HOST_DEVICE inline EntryInfo entry_info(std::int64_t ratio, std::int64_t coff,
                                                std::int64_t j) {
  EntryInfo e;
  e.index = j;
  e.position = j * ratio;
  e.first = (j - coff + 1) * ratio > 0 ? (j - coff + 1) * ratio : 0;
  e.last = (j + 1) * ratio - 1;
  return e;
}
inline EntryInfo entry_info(const CompressorParams& p, std::int64_t j) {
  return entry_info(p.ratio, p.coff, j);
}

// Elements of T one sequence's streaming state holds for kv and for score each: the last
// `coff` blocks, `coff * ratio` rows of `coff * dim`.
inline std::int64_t state_rows_elements(const CompressorParams& p) {
  return p.coff * p.ratio * p.row_width();
}

// The streaming step shared by CompressorState and compress_append_paged: appends tokens
// [n, n + count) of one sequence whose trailing rows live in st_kv / st_score (block b's rows at
// offset (b mod coff) * ratio * row_width). Entry k of the chunk is pooled into out_of(k), then
// done(info, entry) runs. Windows wholly inside the chunk are pooled straight from the input;
// only the rows the next call needs are copied into the state. Returns the entries emitted.
template <class T, class OutOf, class Done>
std::int64_t stream_append(const CompressorParams& p, T* st_kv, T* st_score, std::int64_t n,
                           const T* kv, const T* score, std::int64_t count, OutOf&& out_of,
                           Done&& done) {
  const std::int64_t S = p.ratio, rw = p.row_width();
  const std::int64_t p0 = n, p1 = n + count;
  const auto slot_offset = [&](std::int64_t block) { return (block % p.coff) * S * rw; };
  const auto copy_rows = [&](std::int64_t block, std::int64_t row, const T* k, const T* s,
                             std::int64_t rows) {
    const std::int64_t off = slot_offset(block) + row * rw;
    const std::size_t bytes = static_cast<std::size_t>(rows * rw) * sizeof(T);
    std::memcpy(st_kv + off, k, bytes);
    std::memcpy(st_score + off, s, bytes);
  };
  // A block is "in the input" when all its rows arrive in this chunk.
  auto in_input = [&](std::int64_t b) { return b * S >= p0 && (b + 1) * S <= p1; };
  std::int64_t written = 0;
  for (std::int64_t b = p0 / S; b * S < p1; ++b) {
    if (!in_input(b)) {  // rows of this chunk that belong to a block it does not hold whole
      const std::int64_t lo = std::max(b * S, p0), hi = std::min((b + 1) * S, p1);
      copy_rows(b, lo - b * S, kv + (lo - p0) * rw, score + (lo - p0) * rw, hi - lo);
    }
    if ((b + 1) * S > p1) break;  // block b is not complete yet
    const T* kvb[2] = {nullptr, nullptr};
    const T* sb[2] = {nullptr, nullptr};
    for (std::int64_t h = 0; h < p.coff; ++h) {
      const std::int64_t bb = b - p.coff + 1 + h;
      if (bb < 0) continue;
      if (in_input(bb)) {
        kvb[h] = kv + (bb * S - p0) * rw;
        sb[h] = score + (bb * S - p0) * rw;
      } else {
        kvb[h] = st_kv + slot_offset(bb);
        sb[h] = st_score + slot_offset(bb);
      }
    }
    float* e = out_of(written);
    pool_entry<T>(p, kvb, sb, rw, e);
    done(entry_info(p, b), e);
    ++written;
  }
  // The next window's earlier half: the last complete block, when it came whole in the input.
  if (p.coff == 2) {
    const std::int64_t last = p1 / S - 1;
    if (last >= 0 && in_input(last))
      copy_rows(last, 0, kv + (last * S - p0) * rw, score + (last * S - p0) * rw, S);
  }
  return written;
}
}  // namespace detail

/// Batch compression of a whole prefill: tokens `[0, n)` with `kv` and `score` each
/// `[n, coff * dim]` row-major (f32, bf16 or f16). Writes the `floor(n / ratio)` complete
/// entries to `out` (`[floor(n / ratio), dim]` floats), calling `hook(info, entry)` on each
/// right after it is pooled. The trailing `n mod ratio` tokens make no entry (feed them to a
/// CompressorState to continue).
///
/// Entries `[entry_begin, entry_end)` only are computed when given (a range of the entries,
/// e.g. one thread's share; `out` still holds row j at `out + j * dim`); by default all.
/// Throws phasekv::invalid_argument naming a bad argument before anything is written.
template <class T, class Hook = NoHook>
void compress(const CompressorParams& params, const T* kv, const T* score, std::int64_t n,
              float* out, Hook&& hook = Hook{}, std::int64_t entry_begin = 0,
              std::int64_t entry_end = -1) {
  const char* where = "phasekv::dsv4::compress";
  params.check(where);
  detail::check_hook(hook, params.dim, where);
  phasekv::detail::check_arg(n >= 0, where, "n", n, "must be >= 0");
  const std::int64_t J = params.entries(n);
  if (entry_end < 0) entry_end = J;
  phasekv::detail::check_arg(entry_begin >= 0 && entry_begin <= J, where, "entry_begin",
                             entry_begin, "must be in [0, floor(n / ratio)]");
  phasekv::detail::check_arg(entry_end >= entry_begin && entry_end <= J, where, "entry_end",
                             entry_end, "must be in [entry_begin, floor(n / ratio)]");
  if (entry_end == entry_begin) return;
  phasekv::detail::check_arg(kv != nullptr, where, "kv", "null", "must not be null");
  phasekv::detail::check_arg(score != nullptr, where, "score", "null", "must not be null");
  phasekv::detail::check_arg(out != nullptr, where, "out", "null", "must not be null");
  const std::int64_t S = params.ratio, rw = params.row_width();
  for (std::int64_t j = entry_begin; j < entry_end; ++j) {
    const T* kvb[2] = {nullptr, nullptr};
    const T* sb[2] = {nullptr, nullptr};
    for (std::int64_t h = 0; h < params.coff; ++h) {
      const std::int64_t b = j - params.coff + 1 + h;
      if (b < 0) continue;
      kvb[h] = kv + b * S * rw;
      sb[h] = score + b * S * rw;
    }
    float* e = out + j * params.dim;
    detail::pool_entry<T>(params, kvb, sb, rw, e);
    hook(detail::entry_info(params, j), e);
  }
}

/// Streaming compression: the state of one sequence in decode or chunked prefill. Holds the
/// trailing tokens' kv and score rows (the last `coff` blocks, at most `coff * ratio` rows of
/// each, stored as given) and the token count. Appending tokens one at a time or in chunks
/// of any size emits the same entries, bit for bit, as compress() over the whole sequence.
///
/// `params.ape` must stay valid while the state is used.
template <class T>
class CompressorState {
 public:
  /// A state with no tokens; throws phasekv::invalid_argument on bad params.
  explicit CompressorState(const CompressorParams& params) : p_(params) {
    p_.check("phasekv::dsv4::CompressorState");
    kv_.resize(static_cast<std::size_t>(detail::state_rows_elements(p_)));
    score_.resize(kv_.size());
  }

  /// The compressor's parameters.
  const CompressorParams& params() const { return p_; }
  /// Tokens appended so far (n).
  std::int64_t tokens() const { return n_; }
  /// Entries emitted so far: `floor(n / ratio)`.
  std::int64_t entries() const { return p_.entries(n_); }
  /// Entries that appending `count` more tokens will emit.
  std::int64_t entries_after(std::int64_t count) const {
    return p_.entries(n_ + count) - p_.entries(n_);
  }

  /// Appends tokens `[n, n + count)` (`kv`, `score`: `[count, coff * dim]` row-major) and
  /// writes each entry that completes to `out` (row k of `out`, `[entries_after(count), dim]`
  /// floats, is the k-th new entry), calling `hook(info, entry)` on it. Returns the number of
  /// entries written. Windows that lie wholly inside the chunk are pooled straight from the
  /// input; only the rows the next call needs are copied into the state.
  template <class Hook = NoHook>
  std::int64_t append(const T* kv, const T* score, std::int64_t count, float* out,
                      Hook&& hook = Hook{}) {
    const char* where = "phasekv::dsv4::CompressorState::append";
    detail::check_hook(hook, p_.dim, where);
    phasekv::detail::check_arg(count >= 0 && count <= (std::int64_t{1} << 40), where, "count",
                               count, "must be in [0, 2^40]");
    if (count == 0) return 0;
    phasekv::detail::check_arg(kv != nullptr, where, "kv", "null", "must not be null");
    phasekv::detail::check_arg(score != nullptr, where, "score", "null", "must not be null");
    const std::int64_t emitted = entries_after(count);
    phasekv::detail::check_arg(emitted == 0 || out != nullptr, where, "out", "null",
                               "must not be null when the chunk completes an entry");
    const std::int64_t written = detail::stream_append<T>(
        p_, kv_.data(), score_.data(), n_, kv, score, count,
        [&](std::int64_t k) { return out + k * p_.dim; },
        [&](const EntryInfo& info, float* e) { hook(info, e); });
    n_ += count;
    return written;
  }

  /// Forgets every token (n = 0).
  void reset() { n_ = 0; }

 private:
  CompressorParams p_;
  std::int64_t n_ = 0;
  std::vector<T> kv_, score_;
};

/// Elements of T one sequence's streaming state takes in caller memory
/// (compress_append_paged): its kv rows then its score rows, `2 * coff * ratio * coff * dim`.
inline std::int64_t compressor_state_elements(const CompressorParams& params) {
  return 2 * detail::state_rows_elements(params);
}

/// A batch of sequences appending tokens to their compressors, the entries going into pages.
///
/// Sequence b has seen `tokens[b]` = n_b tokens and appends c_b more:
/// c_b = `chunk_indptr[b + 1] - chunk_indptr[b]` (its rows of `kv` and `score` are
/// `[chunk_indptr[b], chunk_indptr[b + 1])`), or 1 when `chunk_indptr` is null (decode: row b).
/// Its streaming state (the trailing rows) is the caller's memory at
/// `state + b * compressor_state_elements(params)`; its content matters only once the sequence
/// has tokens (start a sequence with `tokens[b] = 0`, any state content). Entry j of sequence b
/// is stored in the entry pages (paged_latent.hpp's mapping: page `entry_table.page(b, j / P)`,
/// slot `j % P`, first `dim` elements of the row) as `E(x / entry_scale)` (round to nearest
/// even; FP8 saturates at 448), or quantized into a FlashMLA FP8 cache format (E =
/// model1_fp8_t or v32_fp8_t, `dim` 512 or 576; the pool's `d_k` is the bytes of a token and
/// `key_page_stride` those of a block; see dsv4/cache_format.hpp).
///
/// @tparam T input element type (float, bf16_t, f16_t).
/// @tparam E entry storage type (float, bf16_t, f16_t, fp8_e4m3_t, model1_fp8_t, v32_fp8_t).
template <class T, class E>
struct PagedCompressArgs {
  std::int64_t batch = 0;                      ///< Sequences B.
  const T* kv = nullptr;                       ///< `[rows, coff * dim]` kv rows of the chunks.
  const T* score = nullptr;                    ///< `[rows, coff * dim]` score rows.
  const std::int32_t* chunk_indptr = nullptr;  ///< `[batch + 1]` rows per sequence, or null.
  std::int64_t* tokens = nullptr;              ///< `[batch]` n_b; n_b + c_b after the call.
  T* state = nullptr;                          ///< `[batch, compressor_state_elements]`.
  PagePool<E> entry_pool;                      ///< Entry pages (one head, d_k >= dim).
  BlockTable entry_table;                      ///< Entry pages per sequence.
  float entry_scale = 1.0f;                    ///< Per-tensor scale of the stored entries.
};

/// Appends a chunk of tokens to each of B sequences' compressors (decode: one token each;
/// chunked or ragged prefill: any count each) and stores every entry that completes into that
/// sequence's entry pages, after `hook(info, entry)` (`info.sequence` = b) has run on it; then
/// `tokens[b] += c_b`. Sequences run in order, entries in order within a sequence.
///
/// The entries (before storage) are bit-equal to those of a CompressorState fed the same
/// tokens in any chunking, and to compress() over each whole sequence: the same streaming code
/// runs, on a state held in caller memory instead of the CompressorState's own. The entry
/// table of sequence b must list the pages of `floor((n_b + c_b) / ratio)` entries.
///
/// Everything (shapes, every table and page index) is checked before anything is written;
/// errors throw phasekv::invalid_argument (capacity_error for a table too short, shape_error for
/// the pool) naming the argument, the sequence and the index. A hook that throws stops the
/// call: sequences before it are complete, the current one is left unspecified (restart it with
/// `tokens[b] = 0`). Allocates `dim` floats of scratch per call (the entry before storage);
/// nothing else.
template <class T, class E, class Hook = NoHook>
void compress_append_paged(const CompressorParams& params, const PagedCompressArgs<T, E>& args,
                           Hook&& hook = Hook{}) {
  const char* where = "phasekv::dsv4::compress_append_paged";
  using phasekv::detail::check_arg;
  params.check(where);
  detail::check_hook(hook, params.dim, where);
  const std::int64_t B = args.batch;
  check_arg(B >= 0 && B <= (std::int64_t{1} << 31), where, "args.batch", B, "must be in [0, 2^31]");
  if (B == 0) return;
  check_arg(std::isfinite(args.entry_scale) && args.entry_scale > 0.0f, where, "args.entry_scale",
            args.entry_scale, "must be finite and > 0");
  const detail::AppendTotals totals = detail::check_append_counts(
      B, args.tokens, args.chunk_indptr, params.ratio, where, "args.tokens", "args.chunk_indptr");
  if (totals.rows == 0) return;
  check_arg(args.kv != nullptr, where, "args.kv", "null", "must not be null");
  check_arg(args.score != nullptr, where, "args.score", "null", "must not be null");
  check_arg(args.state != nullptr, where, "args.state", "null",
            "must point to [batch, compressor_state_elements(params)]");
  if (totals.entries > 0)
    detail::check_append_entry_pages(args.entry_pool, args.entry_table, B, args.tokens,
                                     args.chunk_indptr, params.ratio, params.dim, where,
                                     "args.entry_pool", "args.entry_table");
  const auto count_of = [&](std::int64_t b) -> std::int64_t {
    return args.chunk_indptr ? std::int64_t{args.chunk_indptr[b + 1]} - args.chunk_indptr[b] : 1;
  };
  const auto row_of = [&](std::int64_t b) -> std::int64_t {
    return args.chunk_indptr ? std::int64_t{args.chunk_indptr[b]} : b;
  };
  const std::int64_t d = params.dim, rw = params.row_width();
  const std::int64_t half = detail::state_rows_elements(params);
  std::vector<float> scratch(static_cast<std::size_t>(d));
  float* entry = scratch.data();
  const float scale = args.entry_scale;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t c = count_of(b);
    if (c == 0) continue;
    T* st = args.state + b * 2 * half;
    const PagePool<E>& pool = args.entry_pool;
    const std::int64_t P = pool.page_size;
    detail::stream_append<T>(
        params, st, st + half, args.tokens[b], args.kv + row_of(b) * rw,
        args.score + row_of(b) * rw, c, [&](std::int64_t) { return entry; },
        [&](EntryInfo info, float* e) {
          info.sequence = b;
          hook(static_cast<const EntryInfo&>(info), e);
          E* block = pool.key(args.entry_table.page(b, info.index / P), 0, 0);
          detail::store_row<E>(
              e, d, scale, CacheFormat<E>::row(block, P, info.index % P, pool.key_slot_stride()));
        });
    args.tokens[b] += c;
  }
}

}  // namespace dsv4
PHASEKV_NAMESPACE_END
