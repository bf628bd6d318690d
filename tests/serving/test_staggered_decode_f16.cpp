// Paged batch decode with per-KV-head origins, f16 storage (see test_staggered_decode.cpp).
#include <gtest/gtest.h>

#include "staggered_decode_checks.hpp"

namespace {

TEST(StaggeredBatchDecode, SameBitsAsStaggeredDecodeF16) {
  sstd::same_bits_as_per_head_decode<phasekv::f16_t>();
}

TEST(StaggeredBatchDecode, ChunkedBitsIndependentOfPagesAndThreadsF16) {
  sstd::chunked_bits_independent_of_pages_and_threads<phasekv::f16_t>();
}

}  // namespace
