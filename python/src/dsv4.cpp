// DeepSeek-V4 operations (phasekv/dsv4/): FlashMLA's sparse decode call, the sparse attention
// over contiguous or blocked latent rows, and the latent cache formats (writing by append,
// reading back as float32). Latent caches are float32 / float16 / bfloat16 rows, or the bytes
// (uint8) of FlashMLA's FP8 formats, told apart by their row width: 584 (MODEL1) or 656 (V3.2).
#include <nanobind/stl/optional.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

#include "common.hpp"
#include "phasekv/dsv4/cache_format.hpp"
#include "phasekv/dsv4/compressor.hpp"
#include "phasekv/dsv4/flash_mla.hpp"
#include "phasekv/dsv4/indexer.hpp"
#include "phasekv/dsv4/latent_append.hpp"
#include "phasekv/dsv4/sparse_attention.hpp"
#include "phasekv/phase/geometry.hpp"

namespace phasekv_py {

namespace {

namespace dsv4 = phasekv::dsv4;
using phasekv::model1_fp8_t;
using phasekv::v32_fp8_t;
using i64 = std::int64_t;

// Storage of a latent cache: a plain element type or a FlashMLA FP8 byte layout.
enum class Format { f32, bf16, f16, model1, v32 };

const char* format_name(Format f) {
  switch (f) {
    case Format::model1: return "MODEL1 FP8 (584 bytes a token)";
    case Format::v32: return "V3.2 FP8 (656 bytes a token)";
    default: return dtype_name(static_cast<Dtype>(static_cast<int>(f)));
  }
}

// Calls f(T{}) with T the storage type of `fmt`.
template <class F>
decltype(auto) dispatch_format(Format fmt, F&& f) {
  switch (fmt) {
    case Format::model1: return f(model1_fp8_t{});
    case Format::v32: return f(v32_fp8_t{});
    case Format::bf16: return f(phasekv::bf16_t{});
    case Format::f16: return f(phasekv::f16_t{});
    case Format::f32: break;
  }
  return f(float{});
}

template <class T>
constexpr bool quantized() {
  return dsv4::CacheFormat<T>::quantized;
}

// Rows of a latent tensor: `[rows, width]` (one run of rows) or blocks `[blocks, P, width]` /
// FlashMLA's `[blocks, P, 1, width]`. `width` is elements of the storage type, or the bytes of
// a token for the FP8 formats; strides are in the same units.
struct Latent {
  Array a;
  Format fmt = Format::f32;
  bool blocked = false;
  i64 blocks = 0, P = 0, width = 0;
  i64 block_stride = 0, token_stride = 0;

  i64 rows() const { return blocked ? blocks * P : P; }
  // Channels of a row: the format's (512 MODEL1, 576 V3.2) or the width.
  i64 dim() const {
    if (fmt == Format::model1) return dsv4::CacheFormat<model1_fp8_t>::dim;
    if (fmt == Format::v32) return dsv4::CacheFormat<v32_fp8_t>::dim;
    return width;
  }
  template <class T>
  T* data() const {
    return static_cast<T*>(a.data());
  }
};

// Imports a latent tensor; `must_block`: blocks only (3 or 4 dimensions), else rows allowed.
Latent import_latent(const char* fn, const char* name, nb::handle obj, bool writable,
                     bool must_block) {
  Latent r;
  r.a = import_array(fn, name, obj, writable);
  const Array& a = r.a;
  const i64 nd = a.ndim();
  if (nd == 4) {
    if (a.shape(2) != 1)
      value_error(fn, name,
                  "has shape " + a.shape_text() +
                      "; a 4-dimensional cache is [blocks, page_block_size, 1, width]");
  } else if (nd != 3 && (must_block || nd != 2)) {
    value_error(fn, name,
                "has shape " + a.shape_text() + "; expected " +
                    (must_block ? "[blocks, page_block_size, 1, width] or [blocks, "
                                  "page_block_size, width]"
                                : "[rows, width], [blocks, page_block_size, width] or [blocks, "
                                  "page_block_size, 1, width]"));
  }
  r.blocked = nd >= 3;
  r.width = a.shape(nd - 1);
  if (is_u8(a)) {
    if (r.width == dsv4::CacheFormat<model1_fp8_t>::token_bytes)
      r.fmt = Format::model1;
    else if (r.width == dsv4::CacheFormat<v32_fp8_t>::token_bytes)
      r.fmt = Format::v32;
    else
      value_error(fn, name,
                  "holds bytes (uint8) with rows of " + std::to_string(r.width) +
                      " bytes; the FP8 cache formats have 584 (MODEL1) or 656 (V3.2)");
    if (r.fmt == Format::model1 && !r.blocked)
      value_error(fn, name,
                  "is a MODEL1 FP8 cache of shape " + a.shape_text() +
                      "; MODEL1 is laid out per block: pass [blocks, page_block_size, (1,) 584]");
  } else {
    r.fmt = static_cast<Format>(static_cast<int>(storage_dtype(a)));
  }
  if (a.a.size() == 0) value_error(fn, name, "is empty; a latent tensor needs rows");
  if (r.width > 1 && a.stride(nd - 1) != 1)
    value_error(
        fn, name,
        "must have unit stride along its last dimension; got " + std::to_string(a.stride(nd - 1)));
  for (i64 i = 0; i < nd; ++i)
    if (a.stride(i) < 0) value_error(fn, name, "must have non-negative strides");
  if (r.blocked) {
    r.blocks = a.shape(0);
    r.P = a.shape(1);
    r.block_stride = a.stride(0);
    r.token_stride = a.stride(1);
    if (r.fmt == Format::model1 &&
        r.block_stride < r.P * dsv4::CacheFormat<model1_fp8_t>::token_bytes)
      value_error(fn, name,
                  "is a MODEL1 FP8 cache whose blocks are " + std::to_string(r.block_stride) +
                      " bytes apart; a block of " + std::to_string(r.P) + " tokens needs " +
                      std::to_string(r.P * 584) + " (FlashMLA pads it to " +
                      std::to_string(dsv4::model1_block_bytes(r.P)) + ")");
    if (r.P > 1 && r.fmt != Format::model1 && r.token_stride < r.width)
      value_error(fn, name, "has overlapping tokens (token stride below the row width)");
    if (r.blocks > 1 && r.fmt != Format::model1 && r.block_stride < r.P * r.token_stride)
      value_error(fn, name, "has overlapping blocks (block stride below P * token stride)");
  } else {
    r.P = a.shape(0);
    r.token_stride = r.P > 1 ? a.stride(0) : r.width;
    if (r.P > 1 && r.token_stride < r.width)
      value_error(fn, name, "has overlapping rows (row stride below the row width)");
  }
  if (r.fmt == Format::v32 && (r.token_stride % 4 != 0 || (r.blocked && r.block_stride % 4 != 0)))
    value_error(fn, name, "is a V3.2 FP8 cache whose strides are not multiples of 4 bytes");
  if (r.fmt == Format::model1 && r.block_stride % 2 != 0)
    value_error(fn, name, "is a MODEL1 FP8 cache whose block stride is odd");
  const bool bytes = r.fmt == Format::model1 || r.fmt == Format::v32;
  require_aligned(a, bytes ? 1 : r.fmt == Format::f32 ? 4 : 2);
  return r;
}

// Raises TypeError unless `b` holds the storage of `a` (one kernel reads both).
void require_same_format(const char* fn, const Latent& a, const Latent& b) {
  if (a.fmt != b.fmt)
    type_error(fn, b.a.name,
               std::string("holds ") + format_name(b.fmt) + "; " + a.a.name + " holds " +
                   format_name(a.fmt) + " (both must be the same)");
}

template <class T>
dsv4::LatentRows<T> latent_rows(const Latent& l, i64 first, float scale) {
  dsv4::LatentRows<T> r;
  r.data = l.data<const T>();
  r.first = first;
  r.count = l.rows();
  r.stride = l.token_stride;
  r.scale = scale;
  if (l.blocked) {
    r.page_size = l.P;
    r.page_stride = l.block_stride;
  }
  return r;
}

template <class T>
dsv4::FlashMlaKvCache<T> flash_mla_cache(const Latent& l) {
  dsv4::FlashMlaKvCache<T> c;
  c.data = l.data<const T>();
  c.num_blocks = l.blocks;
  c.page_block_size = l.P;
  c.block_stride = l.block_stride;
  c.token_stride = l.token_stride;
  return c;
}

// The page pool of a blocked latent cache (one head; `d_k` the bytes of a token for MODEL1,
// else the token stride).
template <class E>
phasekv::PagePool<E> latent_pool(const Latent& c) {
  const i64 dk = c.fmt == Format::model1 ? c.width : c.token_stride;
  phasekv::PagePool<E> p = phasekv::make_page_pool<E>(c.data<E>(), c.data<E>(), c.blocks, c.P, 1,
                                                      dk, dk, phasekv::Layout::NHD);
  p.key_page_stride = p.value_page_stride = c.block_stride;
  return p;
}

// Raises ValueError unless a cache holds rows of `head_dim` channels (`arg` names where that
// width comes from).
void require_row_width(const char* fn, const Latent& l, i64 head_dim, const char* arg) {
  if (l.fmt == Format::model1 || l.fmt == Format::v32) {
    if (l.dim() != head_dim)
      value_error(fn, l.a.name,
                  std::string("is a ") + format_name(l.fmt) + " cache of " +
                      std::to_string(l.dim()) + " channels; " + arg + " has " +
                      std::to_string(head_dim));
  } else if (l.width < head_dim) {
    value_error(fn, l.a.name,
                "has rows of " + std::to_string(l.width) + " channels; " + arg + " needs " +
                    std::to_string(head_dim));
  }
}

// An optional int32 [extent] array (per-sequence lengths).
const std::int32_t* optional_i32(const char* fn, const char* name, nb::handle obj, i64 extent) {
  const std::optional<Array> a = optional_array(fn, name, obj);
  return a ? dense_i32(*a, {extent}) : nullptr;
}

const float* optional_f32(const char* fn, const char* name, nb::handle obj, i64 extent) {
  const std::optional<Array> a = optional_array(fn, name, obj);
  return a ? dense_f32(*a, {extent}) : nullptr;
}

nb::object flash_mla_with_kvcache(nb::handle q_obj, nb::handle k_cache_obj, nb::handle block_table,
                                  nb::handle cache_seqlens, i64 head_dim_v,
                                  nb::handle /*tile_scheduler_metadata*/, nb::handle /*num_splits*/,
                                  std::optional<float> softmax_scale, bool causal,
                                  std::optional<bool> is_fp8_kvcache, nb::handle indices_obj,
                                  nb::handle attn_sink, nb::handle extra_k_cache_obj,
                                  nb::handle extra_indices_obj, nb::handle topk_length,
                                  nb::handle extra_topk_length, nb::handle out_obj,
                                  nb::handle lse_obj) {
  const char* fn = "phasekv.dsv4.flash_mla_with_kvcache";
  if (!block_table.is_none() || !cache_seqlens.is_none())
    value_error(fn, block_table.is_none() ? "cache_seqlens" : "block_table",
                "must be None: only the sparse call (indices given) is implemented");
  if (causal) value_error(fn, "causal", "must be False in the sparse call (as in FlashMLA)");
  if (indices_obj.is_none()) type_error(fn, "indices", "is None; the sparse call needs indices");
  const Array qa = input_f32(fn, "q", q_obj, {-1, -1, -1, -1});
  const i64 B = qa.shape(0), s_q = qa.shape(1), h_q = qa.shape(2), d = qa.shape(3);
  const auto* q = static_cast<const float*>(qa.data());
  const Latent kc = import_latent(fn, "k_cache", k_cache_obj, false, true);
  require_row_width(fn, kc, d, "q's last dimension (head_dim)");
  const bool fp8 = kc.fmt == Format::model1 || kc.fmt == Format::v32;
  if (is_fp8_kvcache && *is_fp8_kvcache != fp8)
    value_error(fn, "is_fp8_kvcache",
                std::string("is ") + (*is_fp8_kvcache ? "True" : "False") + " but k_cache holds " +
                    format_name(kc.fmt));
  if (head_dim_v < 1 || head_dim_v > d)
    value_error(fn, "head_dim_v", "= " + std::to_string(head_dim_v) + " must be in [1, head_dim]");
  const Array ia = input_i32(fn, "indices", indices_obj, {B, s_q, -1});
  const i64 topk = ia.shape(2);
  const auto* indices = static_cast<const std::int32_t*>(ia.data());
  std::optional<Latent> ec;
  const std::int32_t* extra_indices = nullptr;
  i64 extra_topk = 0;
  if (!extra_k_cache_obj.is_none()) {
    ec = import_latent(fn, "extra_k_cache", extra_k_cache_obj, false, true);
    require_same_format(fn, kc, *ec);
    require_row_width(fn, *ec, d, "q's last dimension (head_dim)");
    if (extra_indices_obj.is_none())
      type_error(fn, "extra_indices_in_kvcache", "is None but extra_k_cache is given");
    const Array ea = input_i32(fn, "extra_indices_in_kvcache", extra_indices_obj, {B, s_q, -1});
    extra_topk = ea.shape(2);
    extra_indices = static_cast<const std::int32_t*>(ea.data());
  } else if (!extra_indices_obj.is_none() || !extra_topk_length.is_none()) {
    value_error(fn, extra_indices_obj.is_none() ? "extra_topk_length" : "extra_indices_in_kvcache",
                "is given without extra_k_cache");
  }
  const std::int32_t* lengths = optional_i32(fn, "topk_length", topk_length, B);
  const std::int32_t* extra_lengths = optional_i32(fn, "extra_topk_length", extra_topk_length, B);
  const float* sink = optional_f32(fn, "attn_sink", attn_sink, h_q);
  if (softmax_scale && !(*softmax_scale > 0.0f))
    value_error(fn, "softmax_scale", "must be > 0 (None: head_dim^-1/2)");
  auto out = output_f32(fn, "out", out_obj, {B, s_q, h_q, head_dim_v});
  auto lse = output_f32(fn, "lse", lse_obj, {B, h_q, s_q});
  dispatch_format(kc.fmt, [&](auto tag) {
    using T = decltype(tag);
    dsv4::FlashMlaArgs<T> a;
    a.q = q;
    a.batch = B;
    a.s_q = s_q;
    a.h_q = h_q;
    a.head_dim = d;
    a.k_cache = flash_mla_cache<T>(kc);
    a.head_dim_v = head_dim_v;
    a.softmax_scale = softmax_scale ? *softmax_scale : 0.0f;
    a.indices = indices;
    a.topk = topk;
    a.attn_sink = sink;
    if (ec) {
      a.extra_k_cache = flash_mla_cache<T>(*ec);
      a.extra_indices_in_kvcache = extra_indices;
      a.extra_topk = extra_topk;
      a.extra_topk_length = extra_lengths;
    }
    a.topk_length = lengths;
    a.out = out.second;
    a.lse = lse.second;
    nb::gil_scoped_release release;
    dsv4::flash_mla_with_kvcache<T>(a);
  });
  return nb::make_tuple(out.first, lse.first);
}

// The query, softmax parameters and outputs of the two sparse attention calls: q float32
// `[rows, heads, dim]`, out `[rows, heads, dim_v]`, lse `[rows, heads]`.
struct SparseCall {
  Array qa;
  i64 rows = 0, heads = 0, dim = 0;
  dsv4::SparseAttentionParams p;
  std::pair<nb::object, float*> out, lse;
  const float* q() const { return static_cast<const float*>(qa.data()); }
  nb::object result() const { return nb::make_tuple(out.first, lse.first); }
};

SparseCall sparse_call(const char* fn, nb::handle q_obj, i64 window, std::optional<i64> dim_v,
                       std::optional<float> scale, nb::handle sinks, nb::handle out_obj,
                       nb::handle lse_obj) {
  SparseCall c;
  c.qa = input_f32(fn, "q", q_obj, {-1, -1, -1});
  c.rows = c.qa.shape(0);
  c.heads = c.qa.shape(1);
  c.dim = c.qa.shape(2);
  c.p.heads = c.heads;
  c.p.dim = c.dim;
  c.p.dim_v = dim_v ? *dim_v : c.dim;
  c.p.window = window;
  c.p.scale = scale ? *scale : 1.0f / std::sqrt(static_cast<float>(c.dim));
  c.p.sinks = optional_f32(fn, "sinks", sinks, c.heads);
  if (c.p.dim_v < 1 || c.p.dim_v > c.dim)
    value_error(fn, "dim_v", "= " + std::to_string(c.p.dim_v) + " must be in [1, dim]");
  c.out = output_f32(fn, "out", out_obj, {c.rows, c.heads, c.p.dim_v});
  c.lse = output_f32(fn, "lse", lse_obj, {c.rows, c.heads});
  return c;
}

nb::object sparse_attention(nb::handle q_obj, nb::handle raw_obj, nb::handle entries_obj,
                            nb::handle indices_obj, i64 first_position, i64 window, i64 raw_first,
                            i64 entries_first, std::optional<i64> index_count, i64 ratio,
                            std::optional<i64> dim_v, std::optional<float> scale, nb::handle sinks,
                            float raw_scale, float entry_scale, nb::handle out_obj,
                            nb::handle lse_obj) {
  const char* fn = "phasekv.dsv4.sparse_attention";
  const SparseCall c = sparse_call(fn, q_obj, window, dim_v, scale, sinks, out_obj, lse_obj);
  const i64 T = c.rows, d = c.dim;
  const Latent raw = import_latent(fn, "raw", raw_obj, false, false);
  require_row_width(fn, raw, d, "q's last dimension (dim)");
  std::optional<Latent> ent;
  if (!entries_obj.is_none()) {
    ent = import_latent(fn, "entries", entries_obj, false, false);
    require_same_format(fn, raw, *ent);
    require_row_width(fn, *ent, d, "q's last dimension (dim)");
  }
  const std::int32_t* indices = nullptr;
  i64 count = 0;
  if (!indices_obj.is_none()) {
    if (!ent) value_error(fn, "indices", "is given without entries");
    const Array ia = input_i32(fn, "indices", indices_obj, {T, -1});
    count = ia.shape(1);
    indices = static_cast<const std::int32_t*>(ia.data());
    if (index_count && *index_count != count)
      value_error(fn, "index_count", "must be None or indices.shape[1] with indices");
  } else if (ent) {
    count = index_count ? *index_count : ent->rows();
  } else if (index_count && *index_count != 0) {
    value_error(fn, "index_count", "must be None or 0 without entries");
  }
  dispatch_format(raw.fmt, [&](auto tag) {
    using E = decltype(tag);
    const dsv4::LatentRows<E> rr = latent_rows<E>(raw, raw_first, raw_scale);
    const dsv4::LatentRows<E> er =
        ent ? latent_rows<E>(*ent, entries_first, entry_scale) : dsv4::LatentRows<E>{};
    nb::gil_scoped_release release;
    dsv4::sparse_attention<E>(c.p, c.q(), rr, er, indices, count, first_position, T, c.out.second,
                              c.lse.second, ratio);
  });
  return c.result();
}

void append_latent(nb::handle rows_obj, nb::handle cache_obj, nb::handle table_obj,
                   nb::handle tokens_obj, nb::handle indptr_obj, i64 ring, float scale) {
  const char* fn = "phasekv.dsv4.append_latent";
  Array ra = import_array(fn, "rows", rows_obj, false);
  const Dtype rt = storage_dtype(ra);
  if (ra.ndim() != 2) require_shape(ra, {-1, -1});
  require_contiguous(ra);
  require_aligned(ra, rt == Dtype::f32 ? 4 : 2);
  const i64 nrows = ra.shape(0), dim = ra.shape(1);
  const Latent c = import_latent(fn, "cache", cache_obj, true, true);
  require_row_width(fn, c, dim, "rows' last dimension");
  const phasekv::BlockTable table = block_table(fn, kBlockTable, table_obj, -1);
  const i64 B = table.batch;
  Array na = import_array(fn, "tokens", tokens_obj, false);
  const std::int64_t* tokens = dense_i64(na, {B});
  const std::int32_t* indptr = optional_i32(fn, "chunk_indptr", indptr_obj, B + 1);
  const i64 want_rows = indptr ? i64{indptr[B]} - indptr[0] : B;
  if (nrows != want_rows)
    value_error(fn, "rows",
                "has " + std::to_string(nrows) + " rows; " +
                    (indptr ? "chunk_indptr[-1] - chunk_indptr[0] = " : "batch (one row each) = ") +
                    std::to_string(want_rows));
  dispatch_format(c.fmt, [&](auto etag) {
    using E = decltype(etag);
    dispatch_dtype(rt, [&](auto ttag) {
      using T = decltype(ttag);
      dsv4::PagedLatentAppendArgs<T, E> a;
      a.batch = B;
      a.rows = static_cast<const T*>(ra.data());
      a.chunk_indptr = indptr;
      a.tokens = tokens;
      a.pool = latent_pool<E>(c);
      a.table = table;
      a.ring = ring;
      a.scale = scale;
      nb::gil_scoped_release release;
      dsv4::append_latent_paged<T, E>(dim, a);
    });
  });
}

nb::object read_latent(nb::handle cache_obj, std::optional<i64> dim_opt, float scale,
                       nb::handle out_obj) {
  const char* fn = "phasekv.dsv4.read_latent";
  const Latent c = import_latent(fn, "cache", cache_obj, false, false);
  const i64 dim = dim_opt ? *dim_opt : c.dim();
  if (dim < 1) value_error(fn, "dim", "must be >= 1");
  require_row_width(fn, c, dim, "dim");
  const i64 rows = c.rows();
  auto out = c.blocked ? output_f32(fn, "out", out_obj, {c.blocks, c.P, dim})
                       : output_f32(fn, "out", out_obj, {rows, dim});
  dispatch_format(c.fmt, [&](auto tag) {
    using E = decltype(tag);
    const dsv4::LatentRows<E> r = latent_rows<E>(c, 0, scale);
    float* o = out.second;
    nb::gil_scoped_release release;
    for (i64 j = 0; j < rows; ++j)
      for (i64 i = 0; i < dim; ++i)
        o[j * dim + i] = dsv4::detail::load_channel<E>(r.row(j), i) * scale;
  });
  return out.first;
}

// ---- compressor ------------------------------------------------------------------------------

// kv and score rows `[n, coff * dim]` of one storage dtype (C-contiguous), and the params.
struct CompressInputs {
  Array kv, score;
  Dtype dtype = Dtype::f32;
  dsv4::CompressorParams params;
};

dsv4::CompressorParams compressor_params(const char* fn, nb::handle ape_obj, i64 ratio, i64 coff,
                                         i64 row_width) {
  if (ratio < 1) value_error(fn, "ratio", "= " + std::to_string(ratio) + " must be >= 1");
  if (coff != 1 && coff != 2) value_error(fn, "coff", "must be 1 (HCA) or 2 (CSA)");
  if (row_width % coff != 0)
    value_error(fn, "kv", "rows must be coff * dim wide; got " + std::to_string(row_width));
  dsv4::CompressorParams p;
  p.ratio = ratio;
  p.coff = coff;
  p.dim = row_width / coff;
  Array ape = import_array(fn, "ape", ape_obj, false);
  p.ape = dense_f32(ape, {ratio, row_width});
  return p;
}

CompressInputs compress_inputs(const char* fn, nb::handle kv_obj, nb::handle score_obj,
                               nb::handle ape_obj, i64 ratio, i64 coff) {
  CompressInputs r;
  r.kv = import_array(fn, "kv", kv_obj, false);
  r.score = import_array(fn, "score", score_obj, false);
  r.dtype = storage_dtype(r.kv);
  require_dtype(r.score, r.dtype);
  if (r.kv.ndim() != 2) require_shape(r.kv, {-1, -1});
  require_shape(r.score, {r.kv.shape(0), r.kv.shape(1)});
  for (const Array* a : {&r.kv, &r.score}) {
    require_contiguous(*a);
    require_aligned(*a, r.dtype == Dtype::f32 ? 4 : 2);
  }
  r.params = compressor_params(fn, ape_obj, ratio, coff, r.kv.shape(1));
  return r;
}

nb::object compress(nb::handle kv_obj, nb::handle score_obj, nb::handle ape_obj, i64 ratio,
                    i64 coff, nb::handle out_obj) {
  const char* fn = "phasekv.dsv4.compress";
  const CompressInputs in = compress_inputs(fn, kv_obj, score_obj, ape_obj, ratio, coff);
  const i64 n = in.kv.shape(0);
  auto out = output_f32(fn, "out", out_obj, {in.params.entries(n), in.params.dim});
  dispatch_dtype(in.dtype, [&](auto tag) {
    using T = decltype(tag);
    nb::gil_scoped_release release;
    dsv4::compress<T>(in.params, static_cast<const T*>(in.kv.data()),
                      static_cast<const T*>(in.score.data()), n, out.second);
  });
  return out.first;
}

// The streaming compressor of one sequence (dsv4::CompressorState), over the caller's ape.
class PyCompressor {
 public:
  PyCompressor(nb::object ape, i64 ratio, i64 coff, i64 dim, nb::handle dtype)
      : ape_(std::move(ape)), state_(make(ape_, ratio, coff, dim, dtype)) {}
  const dsv4::CompressorParams& params() const {
    return std::visit([](const auto& s) -> const dsv4::CompressorParams& { return s.params(); },
                      state_);
  }
  i64 tokens() const {
    return std::visit([](const auto& s) { return s.tokens(); }, state_);
  }
  void reset() {
    std::visit([](auto& s) { s.reset(); }, state_);
  }
  nb::object append(nb::handle kv_obj, nb::handle score_obj, nb::handle out_obj) {
    const char* fn = "phasekv.dsv4.Compressor.append";
    const dsv4::CompressorParams& p = params();
    const CompressInputs in = compress_inputs(fn, kv_obj, score_obj, ape_, p.ratio, p.coff);
    const i64 count = in.kv.shape(0);
    std::visit(
        [&](auto& s) {
          using T = typename std::decay_t<decltype(s)>::value_type;
          require_dtype(in.kv, dtype_of<T>());
        },
        state_);
    if (in.params.dim != p.dim)
      value_error(fn, "kv", "rows must be coff * dim = " + std::to_string(p.row_width()) + " wide");
    const i64 emitted = p.entries(tokens() + count) - p.entries(tokens());
    auto out = output_f32(fn, "out", out_obj, {emitted, p.dim});
    {
      nb::gil_scoped_release release;         // the GIL first, then the lock (given back
      std::lock_guard<std::mutex> lock(mu_);  // before the GIL is retaken: no lock-order deadlock)
      std::visit(
          [&](auto& s) {
            using T = typename std::decay_t<decltype(s)>::value_type;
            if (s.entries_after(count) != emitted)  // another thread appended since out was sized
              throw std::invalid_argument(std::string(fn) +
                                          ": another thread appended to this Compressor meanwhile; "
                                          "serialize the appends of one sequence");
            s.append(static_cast<const T*>(in.kv.data()), static_cast<const T*>(in.score.data()),
                     count, out.second);
          },
          state_);
    }
    return out.first;
  }

 private:
  template <class T>
  struct State : dsv4::CompressorState<T> {
    using value_type = T;
    using dsv4::CompressorState<T>::CompressorState;
  };
  using Var = std::variant<State<float>, State<phasekv::bf16_t>, State<phasekv::f16_t>>;
  static Var make(nb::handle ape, i64 ratio, i64 coff, i64 dim, nb::handle dtype) {
    const char* fn = "phasekv.dsv4.Compressor";
    const Dtype d = parse_dtype(fn, "dtype", dtype);
    if (dim < 1) value_error(fn, "dim", "must be >= 1");
    const dsv4::CompressorParams p = compressor_params(fn, ape, ratio, coff, coff * dim);
    switch (d) {
      case Dtype::bf16: return Var(std::in_place_type<State<phasekv::bf16_t>>, p);
      case Dtype::f16: return Var(std::in_place_type<State<phasekv::f16_t>>, p);
      case Dtype::f32: break;
    }
    return Var(std::in_place_type<State<float>>, p);
  }
  nb::object ape_;
  Var state_;
  std::mutex mu_;
};

void compress_append(nb::handle kv_obj, nb::handle score_obj, nb::handle ape_obj,
                     nb::handle state_obj, nb::handle cache_obj, nb::handle table_obj,
                     nb::handle tokens_obj, nb::handle indptr_obj, i64 ratio, i64 coff,
                     float entry_scale) {
  const char* fn = "phasekv.dsv4.compress_append";
  const CompressInputs in = compress_inputs(fn, kv_obj, score_obj, ape_obj, ratio, coff);
  const phasekv::BlockTable table = block_table(fn, kBlockTable, table_obj, -1);
  const i64 B = table.batch;
  Array na = import_array(fn, "tokens", tokens_obj, true);
  auto* tokens = const_cast<std::int64_t*>(dense_i64(na, {B}));
  const std::int32_t* indptr = optional_i32(fn, "chunk_indptr", indptr_obj, B + 1);
  const i64 want_rows = indptr ? i64{indptr[B]} - indptr[0] : B;
  if (in.kv.shape(0) != want_rows)
    value_error(fn, "kv",
                "has " + std::to_string(in.kv.shape(0)) + " rows; " +
                    (indptr ? "chunk_indptr[-1] - chunk_indptr[0] = " : "batch (one row each) = ") +
                    std::to_string(want_rows));
  Array st = import_array(fn, "state", state_obj, true);
  require_dtype(st, in.dtype);
  require_shape(st, {B, dsv4::compressor_state_elements(in.params)});
  require_contiguous(st);
  require_aligned(st, in.dtype == Dtype::f32 ? 4 : 2);
  const Latent c = import_latent(fn, "cache", cache_obj, true, true);
  require_row_width(fn, c, in.params.dim, "the entry width (kv's row width / coff)");
  dispatch_format(c.fmt, [&](auto etag) {
    using E = decltype(etag);
    dispatch_dtype(in.dtype, [&](auto ttag) {
      using T = decltype(ttag);
      dsv4::PagedCompressArgs<T, E> a;
      a.batch = B;
      a.kv = static_cast<const T*>(in.kv.data());
      a.score = static_cast<const T*>(in.score.data());
      a.chunk_indptr = indptr;
      a.tokens = tokens;
      a.state = static_cast<T*>(st.data());
      a.entry_pool = latent_pool<E>(c);
      a.entry_table = table;
      a.entry_scale = entry_scale;
      nb::gil_scoped_release release;
      dsv4::compress_append_paged<T, E>(in.params, a);
    });
  });
}

// ---- indexer ---------------------------------------------------------------------------------

nb::object indexer_top_k(nb::handle q_obj, nb::handle w_obj, nb::handle keys_obj,
                         i64 first_position, i64 top_k, i64 ratio, nb::handle geometry,
                         nb::handle indices_obj, nb::handle scores_obj) {
  const char* fn = "phasekv.dsv4.indexer_top_k";
  const Array qa = input_f32(fn, "q", q_obj, {-1, -1, -1});
  const i64 T = qa.shape(0), H = qa.shape(1), d = qa.shape(2);
  const auto* q = static_cast<const float*>(qa.data());
  Array wa = import_array(fn, "w", w_obj, false);
  const float* w = dense_f32(wa, {T, H});
  const Latent keys = import_latent(fn, "keys", keys_obj, false, false);
  if (keys.blocked || keys.fmt == Format::model1 || keys.fmt == Format::v32)
    value_error(fn, "keys", "must be [num_keys, dim] float32, bfloat16 or float16 rows");
  require_row_width(fn, keys, d, "q's last dimension (dim)");
  if (top_k < 1) value_error(fn, "top_k", "must be >= 1");
  dsv4::IndexerParams p;
  p.heads = H;
  p.dim = d;
  p.top_k = top_k;
  if (!geometry.is_none()) {
    if (!nb::isinstance<phasekv::Geometry>(geometry))
      type_error(fn, "geometry", "must be a phasekv.Geometry or None");
    p.geometry = nb::cast<phasekv::Geometry>(geometry);
  } else {
    if (ratio < 1) value_error(fn, "ratio", "must be >= 1");
    p.geometry = phasekv::Geometry(ratio, ratio);
  }
  auto idx = output_i32(fn, "indices", indices_obj, {T, top_k});
  auto sc = output_f32(fn, "scores", scores_obj, {T, top_k});
  dispatch_format(keys.fmt, [&](auto tag) {
    using E = decltype(tag);
    if constexpr (!quantized<E>()) {
      nb::gil_scoped_release release;
      dsv4::indexer_top_k<E>(p, q, w, keys.data<const E>(), keys.rows(), keys.token_stride,
                             first_position, T, idx.second, sc.second);
    }
  });
  return nb::make_tuple(idx.first, sc.first);
}

// ---- paged sparse attention ------------------------------------------------------------------

nb::object paged_sparse_attention(nb::handle q_obj, nb::handle raw_obj, nb::handle raw_table_obj,
                                  nb::handle lengths_obj, nb::handle entry_obj,
                                  nb::handle entry_table_obj, i64 ratio, nb::handle indices_obj,
                                  nb::handle qo_indptr_obj, i64 window, i64 raw_ring,
                                  std::optional<i64> dim_v, std::optional<float> scale,
                                  nb::handle sinks, float raw_scale, float entry_scale,
                                  nb::handle out_obj, nb::handle lse_obj, int threads) {
  const char* fn = "phasekv.dsv4.paged_sparse_attention";
  check_threads(fn, threads);
  const SparseCall c = sparse_call(fn, q_obj, window, dim_v, scale, sinks, out_obj, lse_obj);
  const i64 R = c.rows, d = c.dim;
  const Latent raw = import_latent(fn, "raw_cache", raw_obj, false, true);
  require_row_width(fn, raw, d, "q's last dimension (dim)");
  const phasekv::BlockTable raw_table = block_table(fn, kRawTable, raw_table_obj, -1);
  const i64 B = raw_table.batch;
  Array la = import_array(fn, "lengths", lengths_obj, false);
  const std::int64_t* lengths = dense_i64(la, {B});
  const std::int32_t* qo_indptr = optional_i32(fn, "qo_indptr", qo_indptr_obj, B + 1);
  const i64 want_rows = qo_indptr ? i64{qo_indptr[B]} : B;
  if (R != want_rows)
    value_error(fn, "q",
                "has " + std::to_string(R) + " query rows; " +
                    (qo_indptr ? "qo_indptr[-1] = " : "batch (decode) = ") +
                    std::to_string(want_rows));
  std::optional<Latent> ent;
  phasekv::BlockTable entry_table;
  if (!entry_obj.is_none()) {
    ent = import_latent(fn, "entry_cache", entry_obj, false, true);
    require_same_format(fn, raw, *ent);
    require_row_width(fn, *ent, d, "q's last dimension (dim)");
    if (entry_table_obj.is_none()) type_error(fn, "entry_table", "is None with entry_cache");
    entry_table = block_table(fn, kEntryTable, entry_table_obj, B);
    if (ratio < 1) value_error(fn, "ratio", "must be >= 1 with entry_cache");
  } else if (ratio != 0 || !indices_obj.is_none()) {
    value_error(fn, ratio != 0 ? "ratio" : "indices", "needs entry_cache (and entry_table)");
  }
  const std::int32_t* indices = nullptr;
  i64 k = 0;
  if (!indices_obj.is_none()) {
    const Array ia = input_i32(fn, "indices", indices_obj, {R, -1});
    k = ia.shape(1);
    indices = static_cast<const std::int32_t*>(ia.data());
  }
  dispatch_format(raw.fmt, [&](auto tag) {
    using E = decltype(tag);
    dsv4::PagedSparseArgs<E> a;
    a.q = c.q();
    a.qo_indptr = qo_indptr;
    a.batch = B;
    a.lengths = lengths;
    a.raw_pool = latent_pool<E>(raw);
    a.raw_table = raw_table;
    a.raw_scale = raw_scale;
    a.raw_ring = raw_ring;
    if (ent) {
      a.entry_pool = latent_pool<E>(*ent);
      a.entry_table = entry_table;
    }
    a.entry_scale = entry_scale;
    a.ratio = ratio;
    a.indices = indices;
    a.index_count = k;
    a.out = c.out.second;
    a.lse = c.lse.second;
    nb::gil_scoped_release release;
    dsv4::paged_sparse_attention<E>(c.p, a, 0, 0);  // checks the whole batch, computes nothing
    run_threads(threads, [&](int i, int n) {
      dsv4::paged_sparse_attention<E>(c.p, a, B * i / n, B * (i + 1) / n);
    });
  });
  return c.result();
}

}  // namespace

void bind_dsv4(nb::module_& m) {
  m.def("_dsv4_flash_mla_with_kvcache", &flash_mla_with_kvcache, nb::arg("q"), nb::arg("k_cache"),
        nb::arg("block_table").none() = nb::none(), nb::arg("cache_seqlens").none() = nb::none(),
        nb::arg("head_dim_v") = 512, nb::arg("tile_scheduler_metadata").none() = nb::none(),
        nb::arg("num_splits").none() = nb::none(), nb::arg("softmax_scale").none() = nb::none(),
        nb::arg("causal") = false, nb::arg("is_fp8_kvcache").none() = nb::none(),
        nb::arg("indices").none() = nb::none(), nb::arg("attn_sink").none() = nb::none(),
        nb::arg("extra_k_cache").none() = nb::none(),
        nb::arg("extra_indices_in_kvcache").none() = nb::none(),
        nb::arg("topk_length").none() = nb::none(),
        nb::arg("extra_topk_length").none() = nb::none(), nb::kw_only(),
        nb::arg("out").none() = nb::none(), nb::arg("lse").none() = nb::none(),
        "FlashMLA's sparse decode, flash_mla_with_kvcache(..., indices=...), on the CPU; see "
        "phasekv.dsv4.flash_mla_with_kvcache.");
  m.def("_dsv4_sparse_attention", &sparse_attention, nb::arg("q"), nb::arg("raw"),
        nb::arg("entries").none() = nb::none(), nb::arg("indices").none() = nb::none(),
        nb::kw_only(), nb::arg("first_position"), nb::arg("window") = 128, nb::arg("raw_first") = 0,
        nb::arg("entries_first") = 0, nb::arg("index_count").none() = nb::none(),
        nb::arg("ratio") = 0, nb::arg("dim_v").none() = nb::none(),
        nb::arg("scale").none() = nb::none(), nb::arg("sinks").none() = nb::none(),
        nb::arg("raw_scale") = 1.0f, nb::arg("entry_scale") = 1.0f,
        nb::arg("out").none() = nb::none(), nb::arg("lse").none() = nb::none(),
        "DeepSeek-V4 sparse attention; see phasekv.dsv4.sparse_attention.");
  m.def("_dsv4_append_latent", &append_latent, nb::arg("rows"), nb::arg("cache"),
        nb::arg("block_table"), nb::arg("tokens"), nb::arg("chunk_indptr").none() = nb::none(),
        nb::kw_only(), nb::arg("ring") = 0, nb::arg("scale") = 1.0f,
        "Writes latent rows into a paged cache; see phasekv.dsv4.append_latent.");
  m.def("_dsv4_read_latent", &read_latent, nb::arg("cache"), nb::kw_only(),
        nb::arg("dim").none() = nb::none(), nb::arg("scale") = 1.0f,
        nb::arg("out").none() = nb::none(),
        "A latent cache's rows as float32; see phasekv.dsv4.read_latent.");
  m.def("_dsv4_compress", &compress, nb::arg("kv"), nb::arg("score"), nb::arg("ape"), nb::kw_only(),
        nb::arg("ratio"), nb::arg("coff") = 2, nb::arg("out").none() = nb::none(),
        "DeepSeek-V4 batch compression; see phasekv.dsv4.compress.");
  m.def(
      "_dsv4_compressor_state_elements",
      [](i64 ratio, i64 coff, i64 dim) {
        dsv4::CompressorParams p;
        p.ratio = ratio;
        p.coff = coff;
        p.dim = dim;
        return dsv4::compressor_state_elements(p);
      },
      nb::arg("ratio"), nb::arg("coff"), nb::arg("dim"),
      "Elements of one sequence's state for compress_append: 2 * coff * ratio * coff * dim.");
  nb::class_<PyCompressor>(m, "_Dsv4Compressor",
                           "DeepSeek-V4 streaming compressor; see phasekv.dsv4.Compressor.")
      .def(nb::init<nb::object, i64, i64, i64, nb::handle>(), nb::arg("ape"), nb::kw_only(),
           nb::arg("ratio"), nb::arg("coff"), nb::arg("dim"), nb::arg("dtype"))
      .def("append", &PyCompressor::append, nb::arg("kv"), nb::arg("score"),
           nb::arg("out").none() = nb::none(),
           "Appends tokens (kv, score [count, coff * dim]); returns the entries that complete "
           "[k, dim] float32 (written into out when given).")
      .def("reset", &PyCompressor::reset, "Forgets every token.")
      .def_prop_ro("tokens", &PyCompressor::tokens, "Tokens appended so far (n).")
      .def_prop_ro(
          "entries", [](const PyCompressor& c) { return c.params().entries(c.tokens()); },
          "Entries emitted so far: floor(n / ratio).")
      .def_prop_ro(
          "ratio", [](const PyCompressor& c) { return c.params().ratio; }, "S.")
      .def_prop_ro(
          "coff", [](const PyCompressor& c) { return c.params().coff; }, "1 (HCA) or 2 (CSA).")
      .def_prop_ro(
          "dim", [](const PyCompressor& c) { return c.params().dim; }, "Entry width d.");
  m.def("_dsv4_compress_append", &compress_append, nb::arg("kv"), nb::arg("score"), nb::arg("ape"),
        nb::arg("state"), nb::arg("cache"), nb::arg("block_table"), nb::arg("tokens"),
        nb::arg("chunk_indptr").none() = nb::none(), nb::kw_only(), nb::arg("ratio"),
        nb::arg("coff") = 2, nb::arg("entry_scale") = 1.0f,
        "DeepSeek-V4 batched streaming compression into pages; see "
        "phasekv.dsv4.compress_append.");
  m.def("_dsv4_indexer_top_k", &indexer_top_k, nb::arg("q"), nb::arg("w"), nb::arg("keys"),
        nb::kw_only(), nb::arg("first_position"), nb::arg("top_k"), nb::arg("ratio") = 4,
        nb::arg("geometry").none() = nb::none(), nb::arg("indices").none() = nb::none(),
        nb::arg("scores").none() = nb::none(),
        "The DeepSeek-V4 lightning indexer; see phasekv.dsv4.indexer_top_k.");
  m.def("_dsv4_paged_sparse_attention", &paged_sparse_attention, nb::arg("q"), nb::arg("raw_cache"),
        nb::arg("raw_table"), nb::arg("lengths"), nb::kw_only(),
        nb::arg("entry_cache").none() = nb::none(), nb::arg("entry_table").none() = nb::none(),
        nb::arg("ratio") = 0, nb::arg("indices").none() = nb::none(),
        nb::arg("qo_indptr").none() = nb::none(), nb::arg("window") = 128, nb::arg("raw_ring") = 0,
        nb::arg("dim_v").none() = nb::none(), nb::arg("scale").none() = nb::none(),
        nb::arg("sinks").none() = nb::none(), nb::arg("raw_scale") = 1.0f,
        nb::arg("entry_scale") = 1.0f, nb::arg("out").none() = nb::none(),
        nb::arg("lse").none() = nb::none(), nb::arg("threads") = 1,
        "DeepSeek-V4 sparse attention over paged caches; see "
        "phasekv.dsv4.paged_sparse_attention.");
}

}  // namespace phasekv_py
