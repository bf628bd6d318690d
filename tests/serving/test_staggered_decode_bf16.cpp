// Paged batch decode with per-KV-head origins, bf16 storage (see test_staggered_decode.cpp).
#include <gtest/gtest.h>

#include "staggered_decode_checks.hpp"

namespace {

TEST(StaggeredBatchDecode, SameBitsAsStaggeredDecodeBF16) {
  sstd::same_bits_as_per_head_decode<phasekv::bf16_t>();
}

TEST(StaggeredBatchDecode, ChunkedBitsIndependentOfPagesAndThreadsBF16) {
  sstd::chunked_bits_independent_of_pages_and_threads<phasekv::bf16_t>();
}

}  // namespace
