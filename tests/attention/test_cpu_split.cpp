// Split-KV: 1..8 partitions merged exactly equal the unsplit result.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "decode_case.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/thread_driver.hpp"

namespace {

namespace cpu = phasekv::cpu;

template <class A>
class CpuSplit : public ::testing::Test {};
using Arches = ::testing::Types<cpu::arch::Scalar, cpu::NativeArch>;
TYPED_TEST_SUITE(CpuSplit, Arches);

double rel_diff(const std::vector<float>& a, const std::vector<float>& b, std::int64_t rows,
                std::int64_t d) {
  double worst = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    double err = 0.0, mag = 0.0;
    for (std::int64_t i = 0; i < d; ++i) {
      const std::size_t k = static_cast<std::size_t>(r * d + i);
      err = std::max(err, static_cast<double>(std::abs(a[k] - b[k])));
      mag = std::max(mag, static_cast<double>(std::abs(b[k])));
    }
    worst = std::max(worst, mag > 0 ? err / mag : err);
  }
  return worst;
}

TYPED_TEST(CpuSplit, PartitionsMergeToUnsplit) {
  using A = TypeParam;
  std::vector<float> sinks(24, 0.5f);
  for (const pkt::DecodeShape& s : {pkt::DecodeShape{1000, 2, 3, 64, 64, 8, 4, 2, 128},
                                    pkt::DecodeShape{97, 3, 8, 56, 72, 0, 0, 0, 0},
                                    pkt::DecodeShape{7, 1, 5, 128, 128, 2, 2, 0, 1}}) {
    phasekv::StandardVariant var;
    var.sinks = sinks.data();
    pkt::DecodeCase<phasekv::bf16_t> c(s, 31, 2.0f, var);
    cpu::decode<A>(c.args);
    const std::vector<float> whole = c.out, whole_lse = c.lse;
    for (int parts = 1; parts <= 8; ++parts) {
      std::vector<unsigned char> ws(cpu::decode_workspace_size(c.args, parts));
      // partitions in reverse order: each writes only its own slot
      for (int p = parts - 1; p >= 0; --p)
        cpu::decode_partition<A>(c.args, ws.data(), ws.size(), p, parts);
      c.poison();
      cpu::decode_merge(c.args, ws.data(), ws.size(), parts);
      EXPECT_LE(rel_diff(c.out, whole, c.args.q_heads, s.d_v), 1e-6)
          << s.name() << " parts " << parts;
      for (std::size_t h = 0; h < whole_lse.size(); ++h)
        EXPECT_NEAR(c.lse[h], whole_lse[h], 1e-6 * std::max(1.0f, std::abs(whole_lse[h])));
    }
  }
}

TYPED_TEST(CpuSplit, ThreadDriverMatchesUnsplit) {
  using A = TypeParam;
  pkt::DecodeCase<float> c({1000, 2, 4, 128, 128, 8, 4, 0, 128}, 41);
  cpu::decode<A>(c.args);
  const std::vector<float> whole = c.out;
  for (int threads : {1, 2, 3}) {
    cpu::ThreadPool pool(threads);
    c.poison();
    cpu::decode_parallel<A>(c.args, pool);
    EXPECT_LE(rel_diff(c.out, whole, c.args.q_heads, 128), 1e-6) << threads;
    const pkt::ErrorStats e = c.error();
    EXPECT_LE(e.max_rel, 1e-5);
  }
}

// Back-to-back jobs (workers still spinning), jobs after the spin expired (workers blocked),
// and a pool that never spins: every index runs exactly once per job, exceptions propagate and
// the pool stays usable.
TEST(CpuThreadPool, EveryIndexOncePerJobSpinningOrBlocking) {
  for (int spin_us : {0, 200}) {
    for (int threads : {1, 2, 4}) {
      cpu::ThreadPool pool(threads, spin_us);
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(threads));
      for (int job = 0; job < 300; ++job) {
        if (job == 150)
          std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let them block
        pool.run([&](int i, int count) {
          EXPECT_EQ(count, threads);
          hits[static_cast<std::size_t>(i)].fetch_add(1);
        });
      }
      for (int i = 0; i < threads; ++i)
        EXPECT_EQ(hits[static_cast<std::size_t>(i)].load(), 300) << i;
      EXPECT_THROW(pool.run([&](int i, int) {
        if (i == threads - 1) throw std::runtime_error("job failed");
      }),
                   std::runtime_error);
      int ran = 0;
      pool.run([&](int i, int) {
        if (i == 0) ran = 1;
      });
      EXPECT_EQ(ran, 1);
    }
  }
}

TEST(CpuPartition, RangesCoverExactlyInOrder) {
  for (std::int64_t total : {0, 1, 7, 31, 32, 33, 1000, 5003}) {
    for (int count = 1; count <= 9; ++count) {
      std::int64_t next = 0;
      for (int i = 0; i < count; ++i) {
        const cpu::WorkRange r = cpu::partition_range(total, i, count, 32);
        EXPECT_EQ(r.begin, next);
        EXPECT_GE(r.size(), 0);
        next = r.end;
      }
      EXPECT_EQ(next, total);
    }
  }
}

}  // namespace
