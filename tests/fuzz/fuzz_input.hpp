// Byte reader shared by the fuzz targets: draws integers, flags and seeds from the fuzzer's
// input, little-endian, and zeros once the input is used up (so every input is valid and
// short inputs mean small cases). A failed check prints what differed and aborts, which
// libFuzzer reports as a crash (and the replay driver as a failed test).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace pkv_fuzz {

class FuzzInput {
 public:
  FuzzInput(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  // `bytes` (<= 8) bytes as an unsigned integer.
  std::uint64_t raw(int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(byte()) << (8 * i);
    return v;
  }
  // An integer in [lo, hi] (inclusive), from as few bytes as the range needs.
  std::int64_t range(std::int64_t lo, std::int64_t hi) {
    const std::uint64_t span = static_cast<std::uint64_t>(hi) - static_cast<std::uint64_t>(lo);
    if (span == 0) return lo;
    int bytes = 0;
    for (std::uint64_t s = span; s != 0; s >>= 8) ++bytes;
    const std::uint64_t v = raw(bytes);
    const std::uint64_t r = span == ~std::uint64_t{0} ? v : v % (span + 1);
    return static_cast<std::int64_t>(static_cast<std::uint64_t>(lo) + r);
  }
  bool flag() { return (byte() & 1) != 0; }
  std::uint32_t seed() { return static_cast<std::uint32_t>(raw(4)); }
  std::size_t remaining() const { return size_ - pos_; }
  // The unread bytes as a string (consumes them).
  std::string rest() {
    std::string s(reinterpret_cast<const char*>(data_ + pos_), size_ - pos_);
    pos_ = size_;
    return s;
  }

 private:
  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

}  // namespace pkv_fuzz

// Aborts with the condition and a printf-style description when `cond` is false.
#define PKV_FUZZ_CHECK(cond, ...)                                                            \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "fuzz check failed at %s:%d: %s\n  ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                     \
      std::fprintf(stderr, "\n");                                                            \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
