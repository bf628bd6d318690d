// Exit statuses, UsageError, numbers in messages and range-checked flags: their errors name the
// flag, the value as typed and the range --help shows. Internal to tools/, not part of the
// installed headers.
#pragma once

#include <CLI/CLI.hpp>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>

namespace phasekv_tools {

inline constexpr int kExitFailed = 1;  // the run failed
inline constexpr int kExitUsage = 2;   // the command line was refused

// A flag value or a combination of flags the tool refuses (exit status 2). The message names
// the flags and values; the tool name is prefixed where it is printed.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------------------------------------
// Numbers in messages.

// A double in the shortest form that reads back the same, exponent without '+' or leading
// zeros: 0.5, 1e-12, 10000, 1e6.
inline std::string format_real(double v) {
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf, out;
  const std::size_t e = s.find('e');
  if (e == std::string::npos) return s;
  out = s.substr(0, e + 1);
  std::size_t i = e + 1;
  if (s[i] == '+')
    ++i;
  else if (s[i] == '-')
    out += s[i++];
  while (i + 1 < s.size() && s[i] == '0') ++i;
  return out + s.substr(i);
}

// Bytes as "24.0 GiB", "512.0 MiB", "1.5 KiB", "100 B".
inline std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 6) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", bytes, units[u]);
  return buf;
}

// The text of a flag value as typed, quoted when it would otherwise be invisible.
inline std::string as_typed(const std::string& text) {
  return text.empty() ? std::string("''") : text;
}

// ---------------------------------------------------------------------------------------------
// Range-checked flags. Each checks the text as typed (so 99999999999999999999 is named, not
// clamped to INT64_MAX, and 010 is ten, not octal eight), rewrites it in canonical form for
// CLI11's conversion, and shows its range in --help as "INT in [lo, hi]"; an error reads
// "--flag: <text> is not an integer in [lo, hi]".

namespace detail {

// Parses an optionally signed decimal integer; false when the text is anything else or out
// of the range of T.
template <class T>
bool parse_decimal(const std::string& text, T& out) {
  static_assert(std::is_integral<T>::value, "integers only");
  std::size_t i = 0;
  bool negative = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
  if (i == text.size()) return false;
  // Accumulate the magnitude in uint64 with overflow checks.
  std::uint64_t mag = 0;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c < '0' || c > '9') return false;
    const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (mag > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return false;
    mag = mag * 10 + d;
  }
  if (std::is_signed<T>::value) {
    const std::uint64_t max_pos = static_cast<std::uint64_t>(std::numeric_limits<T>::max());
    if (!negative) {
      if (mag > max_pos) return false;
      out = static_cast<T>(mag);
    } else {
      if (mag > max_pos + 1) return false;
      out = mag == max_pos + 1 ? std::numeric_limits<T>::min()
                               : static_cast<T>(-static_cast<std::int64_t>(mag));
    }
  } else {
    if (negative && mag != 0) return false;
    if (mag > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) return false;
    out = static_cast<T>(mag);
  }
  return true;
}

// A finite double from the whole text (decimal or exponent notation; no nan/inf/hex).
inline bool parse_real(const std::string& text, double& out) {
  if (text.empty()) return false;
  for (char c : text)
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'))
      return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(v)) return false;
  if (errno == ERANGE && v != 0.0) return false;
  out = v;
  return true;
}

}  // namespace detail

// "[lo, hi]" as --help and the errors show it.
template <class T>
std::string range_text(T lo, T hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}
inline std::string range_text(double lo, double hi) {
  return "[" + format_real(lo) + ", " + format_real(hi) + "]";
}

// Restricts an integer option (std::int64_t or std::uint64_t, or a vector of them) to
// [lo, hi].
template <class T>
CLI::Option* int_range(CLI::Option* opt, T lo, T hi) {
  const std::string range = range_text(lo, hi);
  const char* kind = std::is_signed<T>::value ? "INT" : "UINT";
  opt->type_name(std::string(kind) + " in " + range);
  opt->transform(CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        T v{};
        if (!detail::parse_decimal(text, v) || v < lo || v > hi)
          return as_typed(text) + " is not an integer in " + range;
        text = std::to_string(v);
        return std::string();
      },
      std::string()));
  return opt;
}

// A FILE option: refuses an empty name (which would otherwise mean "not given").
inline CLI::Option* file_name(CLI::Option* opt) {
  opt->type_name("FILE");
  opt->check(CLI::Validator(
      [](std::string& text) -> std::string {
        return text.empty() ? std::string("'' is not a file name") : std::string();
      },
      std::string()));
  return opt;
}

// Restricts a floating-point option to the finite values in [lo, hi].
inline CLI::Option* real_range(CLI::Option* opt, double lo, double hi) {
  const std::string range = range_text(lo, hi);
  opt->type_name("FLOAT in " + range);
  opt->transform(CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        double v = 0.0;
        if (!detail::parse_real(text, v) || v < lo || v > hi)
          return as_typed(text) + " is not a number in " + range;
        char buf[40];
        std::snprintf(buf, sizeof buf, "%.17g", v);
        text = buf;
        return std::string();
      },
      std::string()));
  return opt;
}

// A byte count: a number with an optional K, M, G, T, P or E suffix (powers of 1024; "KiB" and
// "KB" also accepted), between 1 MiB and 1 EiB.
inline bool parse_size(const std::string& text, double& bytes) {
  std::size_t end = 0;
  while (end < text.size() && ((text[end] >= '0' && text[end] <= '9') || text[end] == '.')) ++end;
  double v = 0.0;
  if (!detail::parse_real(text.substr(0, end), v)) return false;
  std::string unit = text.substr(end);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() == 3 && unit[1] == 'I' && unit[2] == 'B') unit = unit.substr(0, 1);
  if (unit.size() == 2 && unit[1] == 'B') unit = unit.substr(0, 1);
  double scale = 1.0;
  if (unit == "K")
    scale = 1024.0;
  else if (unit == "M")
    scale = 1024.0 * 1024;
  else if (unit == "G")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "T")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "P")
    scale = 1024.0 * 1024 * 1024 * 1024 * 1024;
  else if (unit == "E")
    scale = 1024.0 * 1024 * 1024 * 1024 * 1024 * 1024;
  else if (!unit.empty() && unit != "B")
    return false;
  bytes = v * scale;
  return bytes >= 1024.0 * 1024 && bytes <= 1024.0 * 1024 * 1024 * 1024 * 1024 * 1024;
}

}  // namespace phasekv_tools
