// Differential fuzz target: streaming compression (CompressedCache::append in chunks of sizes
// drawn from the input) against batch compression (compress_batch, split over a drawn number
// of thread partitions), bit for bit, for every built-in policy (UniformMean, MaxPool,
// OffsetSelect, GatedPool with scalar or vector gates, with or without gate weights, biases
// and payload maps), f32/bf16/f16, NHD and HND, with occasional NaN, Inf, huge and -inf gate
// values. The raw prefix and ring the cache keeps must also hand back the input's bytes.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "fuzz_input.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/max_pool.hpp"
#include "phasekv/compress/offset_select.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/core/element.hpp"

namespace {

using i64 = std::int64_t;
using pkv_fuzz::FuzzInput;

constexpr i64 kDims[] = {1, 2, 3, 5, 7, 8, 9, 16, 17, 31, 32, 33, 63, 64, 65, 96, 128};

i64 draw_dim(FuzzInput& in) {
  return kDims[in.range(0, static_cast<i64>(sizeof kDims / sizeof kDims[0]) - 1)];
}

// Random normal values, with a few special ones when `specials` is set.
std::vector<float> draw_values(std::size_t count, std::uint32_t seed, float sd, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(count);
  for (auto& x : v) x = dist(rng);
  if (specials && count > 0) {
    const float inf = std::numeric_limits<float>::infinity();
    const float pick[] = {std::nanf(""), inf, -inf, 3e38f, -3e38f, 1e-42f, -0.0f, 70000.0f};
    std::uniform_int_distribution<std::size_t> where(0, count - 1);
    std::uniform_int_distribution<int> which(0, 7);
    const int k = 1 + static_cast<int>(count % 3);
    for (int i = 0; i < k; ++i) v[where(rng)] = pick[which(rng)];
  }
  return v;
}

template <class T>
std::vector<T> to_storage(const std::vector<float>& f) {
  std::vector<T> v(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) v[i] = phasekv::from_float<T>(f[i]);
  return v;
}

bool same_bits(const void* a, const void* b, std::size_t n) { return std::memcmp(a, b, n) == 0; }

struct Shape {
  phasekv::Geometry g;
  i64 L = 0, heads = 1, dk = 1, dv = 1, n = 0;
  phasekv::Layout layout = phasekv::Layout::NHD;
};

// Streams `n` tokens through a cache in drawn chunks, compresses them in one batch, compares.
template <class T, class Policy>
void run(FuzzInput& in, const Shape& s, const Policy& kp, const Policy& vp,
         const std::vector<T>& raw_k, const std::vector<T>& raw_v) {
  const auto rk = phasekv::make_view<const T>(raw_k.data(), s.n, s.heads, s.dk, s.layout);
  const auto rv = phasekv::make_view<const T>(raw_v.data(), s.n, s.heads, s.dv, s.layout);
  const i64 J = s.g.complete_windows(s.n);
  const i64 Jb = J > 0 ? J : 1;
  // Batch, split over thread partitions.
  std::vector<T> bk(static_cast<std::size_t>(Jb * s.heads * s.dk)),
      bv(static_cast<std::size_t>(Jb * s.heads * s.dv));
  const auto bkv = phasekv::make_view<T>(bk.data(), J, s.heads, s.dk, s.layout);
  const auto bvv = phasekv::make_view<T>(bv.data(), J, s.heads, s.dv, s.layout);
  const int threads = static_cast<int>(in.range(1, 5));
  for (int t = 0; t < threads; ++t) {
    PKV_FUZZ_CHECK(phasekv::compress_batch<T>(kp, rk, bkv, t, threads) == J, "J keys");
    PKV_FUZZ_CHECK(phasekv::compress_batch<T>(vp, rv, bvv, t, threads) == J, "J values");
  }
  // Streaming in chunks.
  phasekv::CompressedCache<T, Policy> cache(kp, vp, s.heads, s.dk, s.dv, s.L, s.n + 1, s.layout);
  i64 done = 0;
  const i64 max_chunk = in.range(1, s.n > 0 ? s.n : 1);
  while (done < s.n) {
    i64 c = in.range(0, max_chunk);  // 0: an empty append, which must change nothing
    if (c > s.n - done) c = s.n - done;
    cache.append(rk.slice(done, c), rv.slice(done, c));
    done += c;
    if (c == 0 && in.remaining() == 0) {  // out of input: the rest in one chunk
      cache.append(rk.slice(done, s.n - done), rv.slice(done, s.n - done));
      done = s.n;
    }
    // After every chunk the entries so far equal the batch's first J(done).
    const i64 Jd = s.g.complete_windows(done);
    PKV_FUZZ_CHECK(cache.size() == done && cache.num_entries() == Jd, "size %lld entries %lld",
                   (long long)cache.size(), (long long)cache.num_entries());
    for (i64 j = 0; j < Jd; ++j)
      for (i64 h = 0; h < s.heads; ++h) {
        PKV_FUZZ_CHECK(same_bits(cache.entry_keys().ptr(j, h), bkv.ptr(j, h), s.dk * sizeof(T)),
                       "key entry %lld head %lld differs from batch (W%lld S%lld O%lld d_k %lld "
                       "after %lld tokens)",
                       (long long)j, (long long)h, (long long)s.g.window(), (long long)s.g.stride(),
                       (long long)s.g.origin(), (long long)s.dk, (long long)done);
        PKV_FUZZ_CHECK(
            same_bits(cache.entry_values().ptr(j, h), bvv.ptr(j, h), s.dv * sizeof(T)),
            "value entry %lld head %lld differs from batch (W%lld S%lld O%lld d_v %lld after "
            "%lld tokens)",
            (long long)j, (long long)h, (long long)s.g.window(), (long long)s.g.stride(),
            (long long)s.g.origin(), (long long)s.dv, (long long)done);
      }
    // What a query sees: prefix and raw tokens are the input's bytes, entries the batch's.
    const i64 local = in.range(0, s.L);
    const phasekv::VisibleKV<T> kv = cache.visible(local);
    const phasekv::Visibility vis = s.g.visible(done, local);
    i64 pos = 0, ent = 0, raw = vis.raw_begin;
    for (int seg = 0; seg < kv.count; ++seg) {
      const auto& sg = kv.segments[seg];
      for (i64 t = 0; t < sg.size(); ++t)
        for (i64 h = 0; h < s.heads; ++h) {
          const T *wk = nullptr, *wv = nullptr;
          if (sg.kind == phasekv::SegmentKind::prefix) {
            wk = rk.ptr(pos + t, h);
            wv = rv.ptr(pos + t, h);
          } else if (sg.kind == phasekv::SegmentKind::compressed) {
            wk = bkv.ptr(ent + t, h);
            wv = bvv.ptr(ent + t, h);
          } else {
            wk = rk.ptr(raw + t, h);
            wv = rv.ptr(raw + t, h);
          }
          PKV_FUZZ_CHECK(same_bits(sg.keys.ptr(t, h), wk, s.dk * sizeof(T)) &&
                             same_bits(sg.values.ptr(t, h), wv, s.dv * sizeof(T)),
                         "visible segment %d item %lld head %lld differs", seg, (long long)t,
                         (long long)h);
        }
      if (sg.kind == phasekv::SegmentKind::prefix)
        pos += sg.size();
      else if (sg.kind == phasekv::SegmentKind::compressed)
        ent += sg.size();
      else
        raw += sg.size();
    }
    PKV_FUZZ_CHECK(pos == vis.prefix_end && ent == vis.entries && raw == vis.raw_end,
                   "visible covers prefix %lld entries %lld raw to %lld", (long long)pos,
                   (long long)ent, (long long)raw);
  }
}

struct GateParams {
  std::vector<float> weight, bias, payload;
};

// A GatedPool of kind `kind` over `params` (filled here) for `dim` channels.
phasekv::GatedPool gated(FuzzInput& in, const Shape& s, i64 dim, int kind, bool specials,
                         GateParams& p) {
  const i64 W = s.g.window();
  const phasekv::GateKind gk = kind == 2 ? phasekv::GateKind::vector : phasekv::GateKind::scalar;
  const i64 G = gk == phasekv::GateKind::vector ? dim : 1;
  const float sd = static_cast<float>(in.range(0, 8));
  phasekv::ParamView zw, zb, pc;
  if (kind >= 1) {
    p.weight = draw_values(static_cast<std::size_t>(s.heads * W * G * dim), in.seed(), sd * 0.25f,
                           specials);
    p.bias = draw_values(static_cast<std::size_t>(s.heads * W * G), in.seed(), sd, specials);
    if (in.flag() && !p.bias.empty())  // hard gates: switch offsets off
      for (std::size_t i = 0; i < p.bias.size(); i += static_cast<std::size_t>(in.range(1, 3)))
        p.bias[i] = -std::numeric_limits<float>::infinity();
    if (in.flag()) zw = phasekv::param_view(p.weight.data(), {s.heads, W, G, dim});
    zb = phasekv::param_view(p.bias.data(), {s.heads, W, G});
  }
  if (kind == 2 && in.flag()) {
    p.payload = draw_values(static_cast<std::size_t>(s.heads * W * dim * dim), in.seed(),
                            1.0f / std::sqrt(static_cast<float>(dim)), specials);
    pc = phasekv::param_view(p.payload.data(), {s.heads, W, dim, dim});
  }
  return phasekv::GatedPool(s.g, s.heads, dim, dim, gk, zw, zb, pc);
}

template <class T>
void run_type(FuzzInput& in, const Shape& s) {
  const bool specials = in.range(0, 3) == 0;
  const auto fk =
      draw_values(static_cast<std::size_t>(s.n * s.heads * s.dk), in.seed(), 1.0f, specials);
  const auto fv =
      draw_values(static_cast<std::size_t>(s.n * s.heads * s.dv), in.seed(), 1.0f, specials);
  const std::vector<T> rk = to_storage<T>(fk), rv = to_storage<T>(fv);
  switch (in.range(0, 5)) {
    case 0:
      run<T>(in, s, phasekv::UniformMean(s.g, s.dk), phasekv::UniformMean(s.g, s.dv), rk, rv);
      break;
    case 1: run<T>(in, s, phasekv::MaxPool(s.g, s.dk), phasekv::MaxPool(s.g, s.dv), rk, rv); break;
    case 2: {
      const i64 W = s.g.window();
      run<T>(in, s, phasekv::OffsetSelect(s.g, s.dk, in.range(0, W - 1)),
             phasekv::OffsetSelect(s.g, s.dv, in.range(0, W - 1)), rk, rv);
      break;
    }
    default: {
      const int kind = static_cast<int>(in.range(0, 2));  // none, scalar, vector
      GateParams pk, pv;
      const phasekv::GatedPool kp = gated(in, s, s.dk, kind, specials, pk);
      const phasekv::GatedPool vp = gated(in, s, s.dv, kind, specials, pv);
      const i64 cycle = in.range(0, 3);
      run<T>(in, s, kp.cycled(cycle), vp.cycled(cycle), rk, rv);
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzInput in(data, size);
  Shape s;
  const i64 W = in.range(1, 16), S = in.range(1, 16), O = in.range(0, 9);
  s.g = phasekv::Geometry(W, S, O);
  s.L = in.range(0, 24);
  s.heads = in.range(1, 3);
  s.dk = draw_dim(in);
  s.dv = in.flag() ? s.dk : draw_dim(in);
  s.n = in.range(0, 120);
  s.layout = in.flag() ? phasekv::Layout::HND : phasekv::Layout::NHD;
  switch (in.range(0, 2)) {
    case 0: run_type<float>(in, s); break;
    case 1: run_type<phasekv::bf16_t>(in, s); break;
    default: run_type<phasekv::f16_t>(in, s); break;
  }
  return 0;
}
