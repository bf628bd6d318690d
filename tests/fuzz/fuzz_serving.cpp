// Differential fuzz target of the serving plan (issue 29, point 1, last item): a batch of
// sequences in shuffled pages (tests/serving/serving_case.hpp) is planned and run by
// DecodePlan / batch_decode_partition / batch_decode_merge with shapes, lengths, geometries,
// page sizes, layouts, table forms, rings, KV chunk sizes and thread counts drawn from the
// input. Checks, per sequence:
//   - the output and lse bits do not depend on the thread count (1 against 2 or 3 workers)
//     nor on the page size (the same data in pages of another size, another page order);
//   - a sequence whose visible set fits one chunk gives the bits of cpu::decode over the same
//     keys in contiguous buffers;
//   - every output is within the kernel tests' tolerance of the double reference (relative to
//     the largest |value| of the sequence; the lse relative to max(1, |lse|)), and an empty
//     visible set gives zeros and lse = -inf exactly.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "fuzz_input.hpp"
#include "serving/serving_case.hpp"

namespace {

using i64 = std::int64_t;

template <class T>
constexpr double tolerance() {
  return std::is_same<T, float>::value ? 1e-5 : 1e-2;
}

bool same_bits(const float* a, const float* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

template <class T>
void check_case(pkv_fuzz::FuzzInput& in, const pst::BatchShape& shape) {
  const std::uint32_t seed = in.seed();
  const int threads = static_cast<int>(in.range(2, 3));
  const i64 chunk = 64 * in.range(1, 3);
  pst::BatchCase<T> c(shape, seed);
  c.run(1, chunk);
  const std::vector<float> out1 = c.out, lse1 = c.lse;
  c.poison();
  c.run(threads, chunk);
  PKV_FUZZ_CHECK(same_bits(c.out.data(), out1.data(), out1.size()) &&
                     same_bits(c.lse.data(), lse1.data(), lse1.size()),
                 "%s: 1 and %d threads differ (chunk %lld)", shape.name().c_str(), threads,
                 static_cast<long long>(chunk));
  // the same data in pages of another size and order
  pst::BatchShape other = shape;
  other.page_size = shape.page_size == 1 ? 5 : 1 + (shape.page_size * 7) % 13;
  pst::BatchCase<T> c2(other, seed, {}, seed + 99);
  c2.run(threads, chunk);
  PKV_FUZZ_CHECK(same_bits(c2.out.data(), out1.data(), out1.size()) &&
                     same_bits(c2.lse.data(), lse1.data(), lse1.size()),
                 "%s: page sizes %lld and %lld differ", shape.name().c_str(),
                 static_cast<long long>(shape.page_size), static_cast<long long>(other.page_size));
  const double tol = tolerance<T>();
  for (i64 b = 0; b < c.B; ++b) {
    const float* o = out1.data() + b * c.hq * shape.d_v;
    const float* l = lse1.data() + b * c.hq;
    const phasekv::VisibleKV<T> vis = c.visible(b);
    if (vis.total() <= chunk) {  // one chunk: the bits of the single-sequence decode
      std::vector<float> so, sl;
      c.single(b, so, sl);
      PKV_FUZZ_CHECK(same_bits(o, so.data(), so.size()) && same_bits(l, sl.data(), sl.size()),
                     "%s: sequence %lld (n %lld) differs from cpu::decode", shape.name().c_str(),
                     static_cast<long long>(b), static_cast<long long>(shape.lengths[b]));
    }
    std::vector<double> ro, rl;
    c.reference(b, ro, rl);
    double vmax = 0.0;
    for (const T& x : c.raw_v[b]) vmax = std::max(vmax, std::abs(double(phasekv::to_float(x))));
    for (const T& x : c.ent_v[b]) vmax = std::max(vmax, std::abs(double(phasekv::to_float(x))));
    for (i64 h = 0; h < c.hq; ++h) {
      if (vis.total() == 0) {
        PKV_FUZZ_CHECK(std::isinf(l[h]) && l[h] < 0, "%s: empty sequence %lld lse %g",
                       shape.name().c_str(), static_cast<long long>(b), double(l[h]));
      } else {
        PKV_FUZZ_CHECK(std::abs(l[h] - rl[h]) <= tol * std::max(1.0, std::abs(rl[h])),
                       "%s: sequence %lld head %lld lse %.9g, reference %.9g", shape.name().c_str(),
                       static_cast<long long>(b), static_cast<long long>(h), double(l[h]), rl[h]);
      }
      for (i64 i = 0; i < shape.d_v; ++i) {
        const double got = o[h * shape.d_v + i], want = ro[h * shape.d_v + i];
        const bool ok = vis.total() == 0 ? got == 0.0 : std::abs(got - want) <= tol * vmax + 1e-7;
        PKV_FUZZ_CHECK(ok, "%s: sequence %lld head %lld channel %lld: %.9g, reference %.9g",
                       shape.name().c_str(), static_cast<long long>(b), static_cast<long long>(h),
                       static_cast<long long>(i), got, want);
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  pkv_fuzz::FuzzInput in(data, size);
  pst::BatchShape s;
  const i64 B = in.range(1, 5);
  s.lengths.resize(static_cast<std::size_t>(B));
  for (i64& n : s.lengths) n = in.flag() ? in.range(0, 20) : in.range(0, 300);
  s.kv_heads = in.range(1, 3);
  s.group = in.range(1, 5);
  const i64 dims[] = {1, 8, 16, 56, 64, 96, 128};
  s.d_k = dims[in.range(0, 6)];
  s.d_v = in.flag() ? s.d_k : dims[in.range(0, 6)];
  s.W = in.range(0, 12);  // 0: uncompressed
  s.S = in.range(1, 12);
  s.O = in.range(0, 5);
  s.L = in.range(0, 24);
  s.page_size = in.range(1, 70);
  s.layout = in.flag() ? phasekv::Layout::HND : phasekv::Layout::NHD;
  s.ring = s.W > 0 && in.flag();  // a ring needs a compressed rule (raw tail + L)
  s.one_pool = s.d_k == s.d_v && in.flag();
  s.dense_table = in.flag();
  // f32 and bf16 (interleaved pairs on AVX-512): the plan and the page walk do not depend on
  // the type beyond that, and each type's kernels cost minutes of sanitizer build time
  if (in.flag())
    check_case<phasekv::bf16_t>(in, s);
  else
    check_case<float>(in, s);
  return 0;
}
