// One DeepSeek-V4-Flash-shaped attention layer with random weights, run as an engine runs it:
// the latent cache in FlashMLA's MODEL1 FP8 bytes (584 bytes a token), the model's
// post-processing done by phasekv's building blocks (dsv4/postprocess.hpp), the compression
// ratio 4 (CSA, with the lightning indexer) and 128 (HCA), fed token by token and in random
// chunks. It checks itself against a float64 computation of the whole layer written from the
// formulas of docs/deepseek_v4.md and docs/deepseek_v4_engines.md (it calls no phasekv kernel or
// building block) and exits nonzero when the relative error exceeds the bound it prints. It
// prints the KV bytes per token: MODEL1 against bf16 rows and against an uncompressed layer.
//
//   example_deepseek_v4_layer            V4-Flash shapes: 64 heads, d 512 (RoPE on the last
//                                        64), indexer 64 x 128, top-512, window 128, 3072
//                                        tokens (768 CSA entries, so the top-512 selects; a few
//                                        minutes on one core; the reference checks 24 of the
//                                        query positions)
//   example_deepseek_v4_layer --small    the same layer with 4 heads, 4 x 128 indexer heads,
//                                        top-8, window 16, 520 tokens (about a second; the
//                                        reference checks every query)
//
// Per token t the layer projects from the hidden state x(t) (random weights):
//   q(t, h)            query heads                        kv(t)  latent row
//   ckv(t), cs(t)      compressor kv and score (coff*d)   ape    per-slot score bias
//   iq(t, h), iw(t, h) indexer queries and head weights;  ik(t), is(t), iape for the indexer's
//                      own compressor (ratio 4 only)
// and post-processes them as DeepSeek-V4's inference code does, with phasekv's blocks:
//   q:       unweighted RMS norm per head, YaRN RoPE of the last 64 at t (QueryPostprocess)
//   kv:      weighted RMSNorm, RoPE at t, FP8 tiles of 64 on the first 448 (EntryPostprocess::
//            apply), then stored as MODEL1 (append_latent_paged)
//   entries: pooled, weighted RMSNorm, RoPE at j * ratio, FP8 tiles (EntryPostprocess as the
//            hook of compress_append_paged), stored as MODEL1
//   iq:      RoPE at t, Hadamard rotation, FP4 in blocks of 32 (QueryPostprocess, rotate)
//   ik:      pooled, weighted RMSNorm, RoPE at j * ratio, Hadamard, FP4 (EntryPostprocess,
//            rotate, as the hook of the indexer's CompressorState), stored as bf16 (exact)
//   output:  paged_sparse_attention over the MODEL1 pages, then the inverse RoPE at t.
// The last query is also run through flash_mla_with_kvcache, FlashMLA's call, on the same bytes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "phasekv/core/element.hpp"
#include "phasekv/dsv4/cache_format.hpp"
#include "phasekv/dsv4/compressor.hpp"
#include "phasekv/dsv4/flash_mla.hpp"
#include "phasekv/dsv4/indexer.hpp"
#include "phasekv/dsv4/latent_append.hpp"
#include "phasekv/dsv4/postprocess.hpp"
#include "phasekv/dsv4/sparse_attention.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/serving/paged.hpp"

namespace {

namespace dsv4 = phasekv::dsv4;
using phasekv::bf16_t;
using phasekv::model1_fp8_t;
using i64 = std::int64_t;
using std::size_t;

constexpr i64 kPage = 64;       // tokens per MODEL1 block
constexpr i64 kRowBytes = 584;  // MODEL1 bytes of a 512-wide row

struct Shape {
  i64 hidden, heads, d, rope, iheads, idim, topk, window, n, checks;
};

// The RoPE of a compressed V4 layer: compress_rope_theta with YaRN (queries, window rows and
// entries alike; the values of the test suite's V4-like configuration).
dsv4::RopeParams layer_rope(i64 dim) {
  return dsv4::RopeParams{dim, 160000.0f, 65536, 16.0f, 32.0f, 1.0f};
}

// ---- random layer ---------------------------------------------------------------------------

struct Weights {
  std::vector<float> wq, wkv, wck, wcs, ape, norm_kv, norm_c, sinks;  // attention
  std::vector<float> wiq, wiw, wik, wis, iape, norm_i;                // indexer
};

std::vector<float> randn(size_t count, std::mt19937& rng, float sd) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(count);
  for (auto& x : v) x = nd(rng);
  return v;
}

// y[out] = W[out, in] x[in]
void matvec(const std::vector<float>& w, const float* x, i64 in, i64 out, float* y) {
  for (i64 o = 0; o < out; ++o) {
    float s = 0.0f;
    for (i64 i = 0; i < in; ++i) s += w[static_cast<size_t>(o * in + i)] * x[i];
    y[o] = s;
  }
}

// Every per-token projection of the whole sequence, before any post-processing.
struct Tokens {
  std::vector<float> q, kv, ck, cs, iq, iw, ik, is;
};

Tokens project(const Shape& s, i64 coff, const Weights& w, const std::vector<float>& x) {
  Tokens t;
  const i64 H = s.hidden;
  const auto resize = [&](std::vector<float>& v, i64 width) {
    v.resize(static_cast<size_t>(s.n * width));
  };
  resize(t.q, s.heads * s.d);
  resize(t.kv, s.d);
  resize(t.ck, coff * s.d);
  resize(t.cs, coff * s.d);
  resize(t.iq, s.iheads * s.idim);
  resize(t.iw, s.iheads);
  resize(t.ik, coff * s.idim);
  resize(t.is, coff * s.idim);
  const float wscale = 1.0f / std::sqrt(static_cast<float>(s.iheads * s.idim));
  for (i64 p = 0; p < s.n; ++p) {
    const float* xp = x.data() + p * H;
    matvec(w.wq, xp, H, s.heads * s.d, t.q.data() + p * s.heads * s.d);
    matvec(w.wkv, xp, H, s.d, t.kv.data() + p * s.d);
    matvec(w.wck, xp, H, coff * s.d, t.ck.data() + p * coff * s.d);
    matvec(w.wcs, xp, H, coff * s.d, t.cs.data() + p * coff * s.d);
    matvec(w.wiq, xp, H, s.iheads * s.idim, t.iq.data() + p * s.iheads * s.idim);
    float* iw = t.iw.data() + p * s.iheads;
    matvec(w.wiw, xp, H, s.iheads, iw);
    for (i64 h = 0; h < s.iheads; ++h) iw[h] *= wscale;  // V4 folds H^-1/2 dim^-1/2 into w
    matvec(w.wik, xp, H, coff * s.idim, t.ik.data() + p * coff * s.idim);
    matvec(w.wis, xp, H, coff * s.idim, t.is.data() + p * coff * s.idim);
  }
  return t;
}

// ---- the engine side: phasekv's post-processing blocks and MODEL1 pages ----------------------

struct Post {
  dsv4::QueryPostprocess q, iq;            // attention queries, indexer queries
  dsv4::EntryPostprocess kv, entry, ikey;  // raw rows, entries, indexer keys
};

Post make_post(const Shape& s, const Weights& w) {
  Post p;
  p.q.dim = s.d;
  p.q.rope = layer_rope(s.rope);
  p.iq.dim = s.idim;
  p.iq.norm = false;
  p.iq.rotate = true;
  p.iq.rope = layer_rope(s.rope);
  p.kv.dim = p.entry.dim = s.d;
  p.kv.weight = w.norm_kv.data();
  p.entry.weight = w.norm_c.data();
  p.kv.rope = p.entry.rope = layer_rope(s.rope);
  p.ikey.dim = s.idim;
  p.ikey.weight = w.norm_i.data();
  p.ikey.rope = layer_rope(s.rope);
  p.ikey.rotate = true;
  for (const auto* e : {&p.kv, &p.entry, &p.ikey}) e->check("example");
  p.q.check("example");
  p.iq.check("example");
  return p;
}

// A pool of MODEL1 blocks of kPage tokens (FlashMLA's padded block size), its pages in order.
struct Model1Pages {
  std::vector<model1_fp8_t> bytes;
  std::vector<std::int32_t> table;
  phasekv::PagePool<model1_fp8_t> pool;
  explicit Model1Pages(i64 rows) {
    const i64 pages = std::max<i64>(1, (rows + kPage - 1) / kPage);
    bytes.resize(static_cast<size_t>(pages * dsv4::model1_block_bytes(kPage)));
    for (i64 i = 0; i < pages; ++i) table.push_back(static_cast<std::int32_t>(i));
    pool =
        phasekv::make_page_pool(bytes.data(), bytes.data(), pages, kPage, 1, kRowBytes, kRowBytes);
    pool.key_page_stride = dsv4::model1_block_bytes(kPage);
  }
  phasekv::BlockTable block_table() const {
    return phasekv::dense_block_table(table.data(), 1, static_cast<i64>(table.size()));
  }
};

struct Run {
  std::vector<float> out;         // [n, heads, d], after the inverse RoPE
  std::vector<float> q;           // [n, heads, d] post-processed queries
  std::vector<float> iq;          // [n, iheads, idim] post-processed indexer queries
  std::vector<std::int32_t> idx;  // [n, topk] (ratio 4)
  std::vector<bf16_t> ikeys;      // the indexer's keys
  std::vector<model1_fp8_t> raw_bytes, entry_bytes;
};

// The layer through phasekv, fed in chunks (chunk = 1: token by token), one sequence.
Run run_layer(const Shape& s, i64 ratio, const Weights& w, const Post& post, const Tokens& t,
              bool chunked, std::mt19937& rng) {
  const i64 coff = ratio == 4 ? 2 : 1;
  const bool indexer = ratio == 4;
  Run r;
  r.out.resize(static_cast<size_t>(s.n * s.heads * s.d));
  r.q = t.q;
  Model1Pages raw(s.n), ents(s.n / ratio);
  const dsv4::CompressorParams cp{ratio, coff, s.d, w.ape.data()};
  const dsv4::CompressorParams ip{ratio, coff, s.idim, w.iape.data()};
  std::vector<float> state(static_cast<size_t>(dsv4::compressor_state_elements(cp)));
  dsv4::CompressorState<float> istate(ip);
  std::vector<float> scratch(static_cast<size_t>(s.n * s.idim)), rows;
  const dsv4::IndexerParams xp{s.iheads, s.idim, s.topk, phasekv::Geometry(ratio, ratio)};
  dsv4::SparseAttentionParams ap;
  ap.heads = s.heads;
  ap.dim = ap.dim_v = s.d;
  ap.window = s.window;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  ap.sinks = w.sinks.data();
  std::uniform_int_distribution<i64> chunk_size(1, 37);
  i64 tokens = 0;  // what the sequence has seen; compress_append_paged advances it
  for (i64 p0 = 0; p0 < s.n;) {
    const i64 c = std::min(s.n - p0, chunked ? chunk_size(rng) : i64{1});
    const std::int32_t indptr[2] = {0, static_cast<std::int32_t>(c)};
    // 1. raw rows: the model's kv_norm, RoPE at t and FP8 tiles, then MODEL1 bytes
    rows.assign(t.kv.begin() + p0 * s.d, t.kv.begin() + (p0 + c) * s.d);
    for (i64 i = 0; i < c; ++i) post.kv.apply(p0 + i, rows.data() + i * s.d);
    dsv4::PagedLatentAppendArgs<float, model1_fp8_t> wa;
    wa.batch = 1;
    wa.rows = rows.data();
    wa.chunk_indptr = indptr;
    wa.tokens = &tokens;
    wa.pool = raw.pool;
    wa.table = raw.block_table();
    dsv4::append_latent_paged(s.d, wa);
    // 2. entries completing in the chunk: pooled, post-processed by the hook, MODEL1 bytes
    dsv4::PagedCompressArgs<float, model1_fp8_t> ca;
    ca.batch = 1;
    ca.kv = t.ck.data() + p0 * coff * s.d;
    ca.score = t.cs.data() + p0 * coff * s.d;
    ca.chunk_indptr = indptr;
    ca.tokens = &tokens;
    ca.state = state.data();
    ca.entry_pool = ents.pool;
    ca.entry_table = ents.block_table();
    dsv4::compress_append_paged(cp, ca, post.entry);
    // 3. the queries
    float* q = r.q.data() + p0 * s.heads * s.d;
    post.q.apply(q, c, s.heads, p0);
    if (indexer) {
      // 4. the indexer: its keys (rotated, FP4, exact in bf16) and queries, then top-k
      istate.append(t.ik.data() + p0 * coff * s.idim, t.is.data() + p0 * coff * s.idim, c,
                    scratch.data(), [&](const dsv4::EntryInfo& e, float* x) {
                      post.ikey(e, x);
                      for (i64 i = 0; i < s.idim; ++i)
                        r.ikeys.push_back(phasekv::float_to_bf16(x[i]));
                    });
      r.iq.insert(r.iq.end(), t.iq.begin() + p0 * s.iheads * s.idim,
                  t.iq.begin() + (p0 + c) * s.iheads * s.idim);
      float* iq = r.iq.data() + p0 * s.iheads * s.idim;
      post.iq.apply(iq, c, s.iheads, p0);
      r.idx.resize(static_cast<size_t>((p0 + c) * s.topk));
      dsv4::indexer_top_k<bf16_t>(xp, iq, t.iw.data() + p0 * s.iheads, r.ikeys.data(),
                                  istate.entries(), s.idim, p0, c, r.idx.data() + p0 * s.topk);
    }
    // 5. attention over the MODEL1 pages: the window and the selected (CSA) or all visible
    // (HCA: J(t + 1) per query) entries, the sink in the denominator
    std::vector<float> lse(static_cast<size_t>(c * s.heads));
    float* out = r.out.data() + p0 * s.heads * s.d;
    dsv4::PagedSparseArgs<model1_fp8_t> a;
    a.q = q;
    a.qo_indptr = indptr;
    a.batch = 1;
    a.lengths = &tokens;
    a.raw_pool = raw.pool;
    a.raw_table = raw.block_table();
    a.entry_pool = ents.pool;
    a.entry_table = ents.block_table();
    a.ratio = ratio;
    a.indices = indexer ? r.idx.data() + p0 * s.topk : nullptr;
    a.index_count = indexer ? s.topk : 0;
    a.out = out;
    a.lse = lse.data();
    dsv4::paged_sparse_attention(ap, a);
    // 6. the model's inverse RoPE of the output
    for (i64 i = 0; i < c; ++i)
      for (i64 h = 0; h < s.heads; ++h)
        dsv4::rope_apply(post.q.rope, p0 + i, out + (i * s.heads + h) * s.d + s.d - s.rope, true);
    p0 += c;
  }
  r.raw_bytes = raw.bytes;
  r.entry_bytes = ents.bytes;
  return r;
}

// The last query once more, through FlashMLA's call on the same bytes: the window as `indices`
// (block * P + offset; the pages are in order, so the position), the entries as the extra
// cache. Returns the largest difference to the paged call's output, relative to its largest
// magnitude per head.
double flash_mla_check(const Shape& s, i64 ratio, const Weights& w, const Post& post,
                       const Run& r) {
  const i64 t = s.n - 1, J = s.n / ratio, w0 = std::max<i64>(0, t + 1 - s.window);
  const i64 blocks_raw = static_cast<i64>(r.raw_bytes.size()) / dsv4::model1_block_bytes(kPage);
  const i64 blocks_ent = static_cast<i64>(r.entry_bytes.size()) / dsv4::model1_block_bytes(kPage);
  std::vector<std::int32_t> win(static_cast<size_t>(s.window), -1), ext;
  for (i64 p = w0; p <= t; ++p) win[static_cast<size_t>(p - w0)] = static_cast<std::int32_t>(p);
  if (ratio == 4)
    ext.assign(r.idx.begin() + t * s.topk, r.idx.begin() + (t + 1) * s.topk);
  else
    for (i64 j = 0; j < J; ++j) ext.push_back(static_cast<std::int32_t>(j));
  const std::int32_t win_len = static_cast<std::int32_t>(t + 1 - w0);
  std::vector<float> out(static_cast<size_t>(s.heads * s.d)), lse(static_cast<size_t>(s.heads));
  dsv4::FlashMlaArgs<model1_fp8_t> f;
  f.q = r.q.data() + t * s.heads * s.d;
  f.batch = 1;
  f.s_q = 1;
  f.h_q = s.heads;
  f.head_dim = f.head_dim_v = s.d;
  f.k_cache = dsv4::flash_mla_kv_cache(r.raw_bytes.data(), blocks_raw, kPage, s.d);
  f.indices = win.data();
  f.topk = s.window;
  f.topk_length = &win_len;
  f.extra_k_cache = dsv4::flash_mla_kv_cache(r.entry_bytes.data(), blocks_ent, kPage, s.d);
  f.extra_indices_in_kvcache = ext.data();
  f.extra_topk = static_cast<i64>(ext.size());
  f.attn_sink = w.sinks.data();
  f.out = out.data();
  f.lse = lse.data();
  dsv4::flash_mla_with_kvcache(f);
  double worst = 0.0;
  for (i64 h = 0; h < s.heads; ++h) {
    float* o = out.data() + h * s.d;
    dsv4::rope_apply(post.q.rope, t, o + s.d - s.rope, true);
    const float* want = r.out.data() + (t * s.heads + h) * s.d;
    double err = 0.0, mag = 1e-30;
    for (i64 i = 0; i < s.d; ++i) {
      err = std::max(err, std::abs(double(o[i]) - want[i]));
      mag = std::max(mag, std::abs(double(want[i])));
    }
    worst = std::max(worst, err / mag);
  }
  return worst;
}

// ---- float64 reference from the formulas (no phasekv kernel, no phasekv building block) ------

// YaRN frequency of pair i (double; the model holds it in f32, so it is rounded to f32 and the
// angle t * f_i taken as the model's f32 product).
double ref_frequency(const dsv4::RopeParams& p, i64 i) {
  const double dim = static_cast<double>(p.dim), base = p.base;
  const double f = std::pow(base, -2.0 * static_cast<double>(i) / dim);
  const double pi = std::acos(-1.0);
  const auto c = [&](double r) {
    return dim * std::log(static_cast<double>(p.original_seq_len) / (r * 2 * pi)) /
           (2 * std::log(base));
  };
  const double lo = std::max(std::floor(c(p.beta_fast)), 0.0);
  double hi = std::min(std::ceil(c(p.beta_slow)), dim - 1);
  if (lo == hi) hi += 0.001;
  const double ramp = std::min(1.0, std::max(0.0, (static_cast<double>(i) - lo) / (hi - lo)));
  return f / p.factor * ramp + f * (1.0 - ramp);
}

void ref_rope(double* x, const dsv4::RopeParams& p, i64 pos, bool inverse) {
  for (i64 i = 0; i < p.dim / 2; ++i) {
    const double ang =
        static_cast<double>(static_cast<float>(pos) * static_cast<float>(ref_frequency(p, i)));
    const double c = std::cos(ang), sn = inverse ? -std::sin(ang) : std::sin(ang);
    const double a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * c - b * sn;
    x[2 * i + 1] = a * sn + b * c;
  }
}

void ref_rms(double* x, i64 d, const float* w) {
  double ss = 0.0;
  for (i64 i = 0; i < d; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + 1e-6);
  for (i64 i = 0; i < d; ++i) x[i] *= inv * (w ? static_cast<double>(w[i]) : 1.0);
}

// v rounded to `bits` significant bits (nearest even), values below 2^min_exp on the grid of
// 2^(min_exp - bits + 1) (the subnormals).
double round_bits(double v, int bits, int min_exp) {
  if (v == 0.0) return 0.0;
  const int e = std::max(std::ilogb(v), min_exp);
  return std::ldexp(std::nearbyint(std::ldexp(v, bits - 1 - e)), e - bits + 1);
}
double ref_bf16(double v) { return round_bits(v, 8, -126); }
double ref_e4m3(double v) { return round_bits(v, 4, -6); }  // |v| <= 448 here

// A stored MODEL1 row: FlashMLA's quantizer on the 448 NoPE channels (tiles of 64, scale the
// smallest power of two >= max(amax / 448, 1e-4)), the RoPE channels in bf16.
void ref_model1(double* x) {
  for (i64 t0 = 0; t0 < 448; t0 += 64) {
    double amax = 0.0;
    for (i64 i = t0; i < t0 + 64; ++i) amax = std::max(amax, std::abs(x[i]));
    const double sc =
        std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(std::max(amax / 448, 1e-4)))));
    for (i64 i = t0; i < t0 + 64; ++i) x[i] = ref_e4m3(x[i] / sc) * sc;
  }
  for (i64 i = 448; i < 512; ++i) x[i] = ref_bf16(x[i]);
}

// Hadamard rotation: the Sylvester matrix / sqrt(n).
void ref_hadamard(double* x, i64 n) {
  std::vector<double> y(static_cast<size_t>(n), 0.0);
  for (i64 i = 0; i < n; ++i)
    for (i64 j = 0; j < n; ++j)
      y[static_cast<size_t>(i)] +=
          (__builtin_popcountll(static_cast<unsigned long long>(i & j)) & 1) ? -x[j] : x[j];
  for (i64 i = 0; i < n; ++i) x[i] = y[static_cast<size_t>(i)] / std::sqrt(static_cast<double>(n));
}

// FP4 E2M1 in blocks of 32: the power-of-two scale >= amax / 6, the nearest of 0, 0.5, 1, 1.5,
// 2, 3, 4, 6 (ties to the even code) times the scale (DeepSeek-V4's indexer).
void ref_fp4(double* x, i64 n) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (i64 b0 = 0; b0 < n; b0 += 32) {
    double amax = 0.0;
    for (i64 i = b0; i < b0 + 32; ++i) amax = std::max(amax, std::abs(x[i]));
    const double sc =
        std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(std::max(amax, 1e-30) / 6))));
    for (i64 i = b0; i < b0 + 32; ++i) {
      const double v = x[i] / sc;
      int best = 0;
      for (int k = 1; k < 8; ++k) {
        const double dk = std::abs(std::abs(v) - mag[k]), db = std::abs(std::abs(v) - mag[best]);
        if (dk < db || (dk == db && k % 2 == 0)) best = k;
      }
      x[i] = (v < 0 ? -mag[best] : mag[best]) * sc;
    }
  }
}

// The value the kernel stored, `got`, against the reference's rounding `ref` of its float64
// value `pre` (a row whose largest magnitude is `row_max`): equal, or `pre` lies at the
// midpoint of the two (within 1e-5 of row_max), where the f32 value the kernel rounded and the
// float64 one fall on either side of a rounding point; then the reference takes the kernel's
// value (counted in `flips`). Returns false for any other difference.
bool reconcile(double pre, double& ref, double got, double row_max, i64& flips) {
  if (got == ref) return true;
  if (!(std::abs(pre - 0.5 * (got + ref)) <= 1e-5 * row_max)) return false;
  ref = got;
  ++flips;
  return true;
}
bool reconcile_row(const double* pre, double* ref, const double* got, i64 n, i64& flips) {
  double row_max = 0.0;
  for (i64 i = 0; i < n; ++i) row_max = std::max(row_max, std::abs(pre[i]));
  for (i64 i = 0; i < n; ++i)
    if (!reconcile(pre[i], ref[i], got[i], row_max, flips)) {
      std::printf("FAIL: stored value %.9g where the reference rounds %.9g to %.9g\n", got[i],
                  pre[i], ref[i]);
      return false;
    }
  return true;
}

// A row of MODEL1 bytes decoded from the layout (FlashMLA's MODEL1_FP8Sparse): in the block of
// kPage tokens, token s has 448 E4M3 codes at s * 576 and 64 little-endian bf16 after them; its
// 7 UE8M0 tile scales (2^(e - 127)) are at kPage * 576 + s * 8.
void decode_model1(const std::vector<model1_fp8_t>& bytes, i64 row, double* x) {
  const auto* b = reinterpret_cast<const std::uint8_t*>(bytes.data()) +
                  (row / kPage) * dsv4::model1_block_bytes(kPage);
  const std::uint8_t* data = b + (row % kPage) * 576;
  const std::uint8_t* scales = b + kPage * 576 + (row % kPage) * 8;
  for (i64 i = 0; i < 448; ++i) {
    const int c = data[i], e = (c >> 3) & 15, m = c & 7;
    const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
    x[i] = ((c & 128) ? -v : v) * std::ldexp(1.0, scales[i / 64] - 127);
  }
  for (i64 i = 0; i < 64; ++i) {
    const std::uint32_t h = data[448 + 2 * i] | (std::uint32_t{data[449 + 2 * i]} << 8);
    float f;
    const std::uint32_t bits = h << 16;
    std::memcpy(&f, &bits, 4);
    x[448 + i] = f;
  }
}

// Pooled entries in double (softmax over the window per channel, overlapping halves).
std::vector<double> ref_pool(i64 ratio, i64 coff, i64 d, i64 n, const std::vector<float>& kv,
                             const std::vector<float>& sc, const std::vector<float>& ape) {
  const i64 J = n / ratio, rw = coff * d;
  std::vector<double> e(static_cast<size_t>(J * d));
  for (i64 j = 0; j < J; ++j)
    for (i64 c = 0; c < d; ++c) {
      double m = -INFINITY, den = 0.0, acc = 0.0;
      for (int pass = 0; pass < 2; ++pass)
        for (i64 h = 0; h < coff; ++h) {
          const i64 b = j - coff + 1 + h;
          for (i64 p = b * ratio; b >= 0 && p < (b + 1) * ratio; ++p) {
            const size_t k = static_cast<size_t>(p * rw + h * d + c);
            const double z = double(sc[k]) + ape[static_cast<size_t>((p % ratio) * rw + h * d + c)];
            if (pass == 0) {
              m = std::max(m, z);
            } else {
              den += std::exp(z - m);
              acc += std::exp(z - m) * double(kv[k]);
            }
          }
        }
      e[static_cast<size_t>(j * d + c)] = acc / den;
    }
  return e;
}

// The model's stored rows in double: raw rows [n, d], entries [J, d], indexer keys [J, idim],
// each reconciled with what the run stored (see reconcile()).
struct Ref {
  std::vector<double> raw, ent, ikeys;
  i64 flips = 0, values = 0;
  bool ok = true;
};

Ref ref_rows(const Shape& s, i64 ratio, const Weights& w, const Tokens& tk, const Run& run) {
  const i64 coff = ratio == 4 ? 2 : 1, J = s.n / ratio;
  const dsv4::RopeParams rope = layer_rope(s.rope);
  Ref r;
  std::vector<double> pre, got(static_cast<size_t>(s.d));
  const auto stored_row = [&](double* x, const float* weight, i64 pos,
                              const std::vector<model1_fp8_t>& bytes, i64 row) {
    ref_rms(x, s.d, weight);
    ref_rope(x + s.d - s.rope, rope, pos, false);
    pre.assign(x, x + s.d);
    ref_model1(x);
    decode_model1(bytes, row, got.data());
    r.ok = r.ok && reconcile_row(pre.data(), x, got.data(), s.d, r.flips);
    r.values += s.d;
  };
  r.raw.assign(tk.kv.begin(), tk.kv.end());
  for (i64 p = 0; p < s.n; ++p)
    stored_row(r.raw.data() + p * s.d, w.norm_kv.data(), p, run.raw_bytes, p);
  r.ent = ref_pool(ratio, coff, s.d, s.n, tk.ck, tk.cs, w.ape);
  for (i64 j = 0; j < J; ++j)
    stored_row(r.ent.data() + j * s.d, w.norm_c.data(), j * ratio, run.entry_bytes, j);
  if (ratio == 4) {
    r.ikeys = ref_pool(ratio, coff, s.idim, s.n, tk.ik, tk.is, w.iape);
    for (i64 j = 0; j < J; ++j) {
      double* x = r.ikeys.data() + j * s.idim;
      ref_rms(x, s.idim, w.norm_i.data());
      ref_rope(x + s.idim - s.rope, rope, j * ratio, false);
      ref_hadamard(x, s.idim);
      pre.assign(x, x + s.idim);
      ref_fp4(x, s.idim);
      for (i64 i = 0; i < s.idim; ++i)
        got[static_cast<size_t>(i)] =
            phasekv::bf16_to_float(run.ikeys[static_cast<size_t>(j * s.idim + i)]);
      r.ok = r.ok && reconcile_row(pre.data(), x, got.data(), s.idim, r.flips);
      r.values += s.idim;
    }
  }
  return r;
}

struct Check {
  double max_err = 0.0;
  i64 queries = 0, near_ties = 0;
};

// The layer's output at position t in double: the indexer's scores and top-k (ratio 4), the
// softmax over the selected entries, the window and the sink, the inverse RoPE.
void ref_query(const Shape& s, i64 ratio, const Weights& w, const Tokens& tk, Ref& ref, i64 t,
               const Run& run, Check& chk) {
  const dsv4::RopeParams rope = layer_rope(s.rope);
  const i64 J = (t + 1) / ratio;
  std::vector<i64> sel;
  if (ratio == 4) {
    std::vector<double> score(static_cast<size_t>(J), 0.0), iq(static_cast<size_t>(s.idim));
    for (i64 h = 0; h < s.iheads; ++h) {
      const float* src = tk.iq.data() + (t * s.iheads + h) * s.idim;
      iq.assign(src, src + s.idim);
      ref_rope(iq.data() + s.idim - s.rope, rope, t, false);
      ref_hadamard(iq.data(), s.idim);
      const std::vector<double> pre = iq;
      ref_fp4(iq.data(), s.idim);
      const float* kq = run.iq.data() + (t * s.iheads + h) * s.idim;
      const std::vector<double> got(kq, kq + s.idim);
      if (!reconcile_row(pre.data(), iq.data(), got.data(), s.idim, ref.flips)) {
        chk.max_err = INFINITY;
        return;
      }
      ref.values += s.idim;
      for (i64 j = 0; j < J; ++j) {
        double dot = 0.0;
        for (i64 i = 0; i < s.idim; ++i)
          dot += iq[static_cast<size_t>(i)] * ref.ikeys[static_cast<size_t>(j * s.idim + i)];
        score[static_cast<size_t>(j)] +=
            double(tk.iw[static_cast<size_t>(t * s.iheads + h)]) * std::max(0.0, dot);
      }
    }
    std::vector<i64> order(static_cast<size_t>(J));
    for (i64 j = 0; j < J; ++j) order[static_cast<size_t>(j)] = j;
    std::stable_sort(order.begin(), order.end(), [&](i64 a, i64 b) {
      return score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)];
    });
    const i64 k = std::min(J, s.topk);
    sel.assign(order.begin(), order.begin() + k);
    // A near tie at the top-k boundary (f32 sums may order it either way): the kernel's choice
    // is accepted when every entry it chose scores within 1e-5 of the largest score of the
    // reference's k-th.
    if (k < J) {
      double mag = 1e-30;
      for (double x : score) mag = std::max(mag, std::abs(x));
      const double kth = score[static_cast<size_t>(order[static_cast<size_t>(k - 1)])];
      const double next = score[static_cast<size_t>(order[static_cast<size_t>(k)])];
      if (kth - next < 1e-5 * mag) {
        ++chk.near_ties;
        sel.clear();
        for (i64 q = 0; q < k; ++q) {
          const i64 j = run.idx[static_cast<size_t>(t * s.topk + q)];
          if (j < 0 || j >= J || score[static_cast<size_t>(j)] < kth - 1e-5 * mag) {
            std::printf("FAIL: query %lld selected entry %lld far below the k-th score\n",
                        static_cast<long long>(t), static_cast<long long>(j));
            chk.max_err = INFINITY;
            return;
          }
          sel.push_back(j);
        }
      }
    }
  } else {
    for (i64 j = 0; j < J; ++j) sel.push_back(j);
  }
  std::vector<const double*> rows;
  for (i64 j : sel) rows.push_back(ref.ent.data() + j * s.d);
  for (i64 p = std::max<i64>(0, t + 1 - s.window); p <= t; ++p)
    rows.push_back(ref.raw.data() + p * s.d);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<double> q(static_cast<size_t>(s.d)), o(static_cast<size_t>(s.d)), logit(rows.size());
  for (i64 h = 0; h < s.heads; ++h) {
    const float* src = tk.q.data() + (t * s.heads + h) * s.d;
    q.assign(src, src + s.d);
    ref_rms(q.data(), s.d, nullptr);
    ref_rope(q.data() + s.d - s.rope, rope, t, false);
    const double sink = w.sinks[static_cast<size_t>(h)];
    double m = sink;
    for (size_t r = 0; r < rows.size(); ++r) {
      double dot = 0.0;
      for (i64 i = 0; i < s.d; ++i) dot += q[static_cast<size_t>(i)] * rows[r][i];
      logit[r] = scale * dot;
      m = std::max(m, logit[r]);
    }
    double den = std::exp(sink - m);
    std::fill(o.begin(), o.end(), 0.0);
    for (size_t r = 0; r < rows.size(); ++r) {
      const double p = std::exp(logit[r] - m);
      den += p;
      for (i64 i = 0; i < s.d; ++i) o[static_cast<size_t>(i)] += p * rows[r][i];
    }
    for (double& v : o) v /= den;
    ref_rope(o.data() + s.d - s.rope, rope, t, true);
    double err = 0.0, mag = 1e-3;
    for (i64 i = 0; i < s.d; ++i) {
      const double got = run.out[static_cast<size_t>((t * s.heads + h) * s.d + i)];
      err =
          std::max(err, std::isfinite(got) ? std::abs(got - o[static_cast<size_t>(i)]) : INFINITY);
      mag = std::max(mag, std::abs(o[static_cast<size_t>(i)]));
    }
    chk.max_err = std::max(chk.max_err, err / mag);
  }
  ++chk.queries;
}

}  // namespace

int main(int argc, char** argv) {
  bool small = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--small") {
      small = true;
    } else {
      std::fprintf(stderr, "usage: %s [--small]\nunknown argument '%s'\n", argv[0], argv[i]);
      return 2;
    }
  }
  // hidden is kept small in both: the projections are not what this example is about; d is
  // 512 in both (MODEL1's row)
  const Shape s = small ? Shape{32, 4, 512, 64, 4, 128, 8, 16, 520, 520}
                        : Shape{64, 64, 512, 64, 64, 128, 512, 128, 3072, 24};
  // The bound: the kernels add f32 rounding (about 1e-6 relative) to the float64 computation.
  // Every quantized value (the MODEL1 bytes, the indexer's FP4 keys and queries) equals the
  // reference's rounding, or, where the float64 value sits at a rounding point (within 1e-5 of
  // its row's largest magnitude), the neighbour the f32 value rounded to (then the reference
  // takes it, and the count is printed); anything else fails.
  const double tol = 1e-4;
  std::printf(
      "DeepSeek-V4 attention layer (%s): heads %lld, d %lld (RoPE %lld, YaRN), indexer %lld x "
      "%lld top-%lld, window %lld, %lld tokens; rows stored as FlashMLA MODEL1 FP8\n",
      small ? "scaled down" : "V4-Flash shapes", static_cast<long long>(s.heads),
      static_cast<long long>(s.d), static_cast<long long>(s.rope), static_cast<long long>(s.iheads),
      static_cast<long long>(s.idim), static_cast<long long>(s.topk),
      static_cast<long long>(s.window), static_cast<long long>(s.n));
  bool ok = true;
  for (i64 ratio : {i64{4}, i64{128}}) {
    const i64 coff = ratio == 4 ? 2 : 1;
    std::mt19937 rng(static_cast<std::uint32_t>(17 + ratio));
    Weights w;
    const float wsd = 1.0f / std::sqrt(static_cast<float>(s.hidden));
    const auto sz = [](i64 a, i64 b) { return static_cast<size_t>(a * b); };
    w.wq = randn(sz(s.heads * s.d, s.hidden), rng, wsd);
    w.wkv = randn(sz(s.d, s.hidden), rng, wsd);
    w.wck = randn(sz(coff * s.d, s.hidden), rng, wsd);
    w.wcs = randn(sz(coff * s.d, s.hidden), rng, wsd);
    w.ape = randn(sz(ratio, coff * s.d), rng, 0.5f);
    w.norm_kv = randn(sz(1, s.d), rng, 0.2f);
    w.norm_c = randn(sz(1, s.d), rng, 0.2f);
    w.norm_i = randn(sz(1, s.idim), rng, 0.2f);
    for (auto* g : {&w.norm_kv, &w.norm_c, &w.norm_i})
      for (auto& x : *g) x += 1.0f;
    w.sinks = randn(sz(1, s.heads), rng, 1.0f);
    w.wiq = randn(sz(s.iheads * s.idim, s.hidden), rng, wsd);
    w.wiw = randn(sz(s.iheads, s.hidden), rng, wsd);
    w.wik = randn(sz(coff * s.idim, s.hidden), rng, wsd);
    w.wis = randn(sz(coff * s.idim, s.hidden), rng, wsd);
    w.iape = randn(sz(ratio, coff * s.idim), rng, 0.5f);
    const auto x = randn(sz(s.n, s.hidden), rng, 1.0f);
    const Tokens tk = project(s, coff, w, x);
    const Post post = make_post(s, w);

    std::printf("\nratio %3lld (%s), %lld entries:\n", static_cast<long long>(ratio),
                ratio == 4 ? "CSA, indexer" : "HCA", static_cast<long long>(s.n / ratio));
    const auto t0 = std::chrono::steady_clock::now();
    const Run one = run_layer(s, ratio, w, post, tk, false, rng);
    const auto t1 = std::chrono::steady_clock::now();
    const Run chunks = run_layer(s, ratio, w, post, tk, true, rng);
    const auto t2 = std::chrono::steady_clock::now();
    const bool same =
        one.out == chunks.out && one.idx == chunks.idx &&
        std::memcmp(one.raw_bytes.data(), chunks.raw_bytes.data(), one.raw_bytes.size()) == 0 &&
        std::memcmp(one.entry_bytes.data(), chunks.entry_bytes.data(), one.entry_bytes.size()) == 0;
    Ref ref = ref_rows(s, ratio, w, tk, one);
    Check chk;
    const i64 step = std::max<i64>(1, s.n / s.checks);
    for (i64 t = s.n - 1; ref.ok && t >= 0 && std::isfinite(chk.max_err); t -= step)
      ref_query(s, ratio, w, tk, ref, t, one, chk);
    const double fm = flash_mla_check(s, ratio, w, post, one);
    std::printf(
        "  token by token %.2f s, in chunks %.2f s; chunks == token by token (outputs, indices, "
        "cache bytes): %s\n"
        "  float64 reference, %lld queries: max relative error %.2e (bound %.0e); %lld of %lld "
        "quantized values sat at a rounding point and rounded to the other neighbour\n"
        "  flash_mla_with_kvcache on the same MODEL1 bytes, last query: max relative difference "
        "%.2e (bound 1e-5)\n",
        std::chrono::duration<double>(t1 - t0).count(),
        std::chrono::duration<double>(t2 - t1).count(), same ? "yes (same bits)" : "NO",
        static_cast<long long>(chk.queries), chk.max_err, tol, static_cast<long long>(ref.flips),
        static_cast<long long>(ref.values), fm);
    if (chk.near_ties)
      std::printf(
          "  %lld queries had a near tie at the top-k boundary (kernel's set accepted after "
          "checking it against the reference scores)\n",
          static_cast<long long>(chk.near_ties));
    ok = ok && same && ref.ok && chk.max_err <= tol && fm <= 1e-5;
    // KV bytes per token of context: the entries (and the indexer's bf16 keys) per token,
    // against an uncompressed layer (a 512-wide bf16 latent row for every token, K = V); the
    // window and the compressor state are a constant per sequence.
    const double ikey = ratio == 4 ? 2.0 * static_cast<double>(s.idim) : 0.0;
    const double m1 = (584.0 + ikey) / static_cast<double>(ratio);
    const double b16 = (2.0 * static_cast<double>(s.d) + ikey) / static_cast<double>(ratio);
    const double full = 2.0 * static_cast<double>(s.d);
    std::printf(
        "  KV bytes per token: MODEL1 %.1f (a row 584 B%s), bf16 rows %.1f (a row %lld B), an "
        "uncompressed bf16 layer %.0f: %.1fx less than bf16 rows, %.1fx less than uncompressed; "
        "plus %lld bytes per sequence for the window in MODEL1\n",
        m1, ratio == 4 ? " + 256 B of indexer key" : "", b16, static_cast<long long>(2 * s.d), full,
        b16 / m1, full / m1, static_cast<long long>(s.window * 584));
  }
  std::printf("\n%s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
