// Shows what a decode query sees under DeepSeek-V4's two compressed attention geometries
// (CSA: W=8, S=4; HCA: W=S=128), both with a 128-token raw local window, and how many items
// it attends to compared with an uncompressed cache. While n < L every raw token is visible
// as well as the entries, so the compressed count can exceed n for short sequences.
#include <cstdio>

#include "phasekv/phasekv.hpp"

int main() {
  const phasekv::Geometry csa(8, 4), hca(128, 128);
  const long long local = 128;
  std::printf("%10s  %12s  %12s  %12s\n", "n", "full", "CSA W8/S4", "HCA W128");
  for (long long n : {1LL, 100LL, 4096LL, 65536LL, 524288LL}) {
    const auto a = csa.visible(n, local);
    const auto b = hca.visible(n, local);
    std::printf("%10lld  %12lld  %12lld  %12lld\n", n, n, static_cast<long long>(a.total()),
                static_cast<long long>(b.total()));
    if (a.raw_count() > n || b.raw_count() > n) return 1;  // never more raw tokens than exist
  }
  std::printf("common phase period of CSA and HCA: %lld\n",
              static_cast<long long>(phasekv::common_period({csa, hca})));
  return 0;
}
