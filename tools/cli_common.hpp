// Shared pieces of every phasekv command-line tool: range-checked numeric flags whose errors
// name the flag, the value as typed and the range --help shows; the exit statuses; the memory
// a run may use; output files written to a temporary file and renamed on success. Internal to
// tools/, not part of the installed headers.
//
// Exit statuses: 0 success, 1 the run failed (bad input data, a file that cannot be read or
// written, out of memory), 2 the command line was refused before anything ran (a flag's value,
// a combination of flags, or a run that would not fit in memory).
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <csignal>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#if defined(_WIN32)
#include <process.h>
#else
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#endif

#include "phasekv/core/error.hpp"

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

// ---------------------------------------------------------------------------------------------
// Memory.

// Memory this process may still allocate, and where the figure comes from. `bytes` is
// infinite when nothing could be read.
struct AvailableMemory {
  double bytes = std::numeric_limits<double>::infinity();
  std::string source;
};

namespace detail {

#if defined(__linux__)
// A "Key:   123 kB" line of a /proc file, in bytes; negative when absent.
inline double proc_kb(const char* file, const char* key) {
  std::ifstream f(file);
  std::string line;
  const std::size_t n = std::strlen(key);
  while (std::getline(f, line))
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':')
      return 1024.0 * std::strtod(line.c_str() + n + 1, nullptr);
  return -1.0;
}

// The first number in a file (cgroup limits); negative when unreadable or "max".
inline double file_number(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return -1.0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  return end == s.c_str() ? -1.0 : v;
}

// This process's cgroup v2 directory ("" when not on cgroup v2).
inline std::string cgroup2_dir() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line))
    if (line.compare(0, 3, "0::") == 0) return "/sys/fs/cgroup" + line.substr(3);
  return std::string();
}
#endif

inline void lower_to(AvailableMemory& m, double bytes, const std::string& source) {
  if (bytes >= 0.0 && bytes < m.bytes) {
    m.bytes = bytes;
    m.source = source;
  }
}

}  // namespace detail

// The smallest of: MemAvailable (/proc/meminfo), the cgroup memory limit less its usage, and
// the address-space and data-segment limits (ulimit -v, ulimit -d) less what is mapped; the
// physical memory where none of these can be read.
inline AvailableMemory available_memory() {
  AvailableMemory m;
#if defined(__linux__)
  detail::lower_to(m, detail::proc_kb("/proc/meminfo", "MemAvailable"),
                   "MemAvailable in /proc/meminfo");
  // cgroup v2: this process's group and every group above it.
  const std::string root = "/sys/fs/cgroup";
  for (std::string dir = detail::cgroup2_dir(); dir.size() >= root.size();) {
    const double max = detail::file_number(dir + "/memory.max");
    const double cur = detail::file_number(dir + "/memory.current");
    if (max >= 0.0 && cur >= 0.0)
      detail::lower_to(m, max > cur ? max - cur : 0.0, "the cgroup limit " + dir + "/memory.max");
    if (dir.size() == root.size()) break;
    dir = dir.substr(0, dir.find_last_of('/'));
  }
  {
    const double max = detail::file_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    const double cur = detail::file_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    if (max >= 0.0 && cur >= 0.0 && max < 1e18)
      detail::lower_to(m, max > cur ? max - cur : 0.0, "the cgroup v1 memory limit");
  }
#endif
#if !defined(_WIN32)
  struct Limit {
    int resource;
    const char* status_key;
    const char* name;
  };
  const Limit limits[] = {
    {RLIMIT_AS, "VmSize", "the address-space limit (ulimit -v)"},
#if defined(RLIMIT_DATA)
    {RLIMIT_DATA, "VmData", "the data-segment limit (ulimit -d)"},
#endif
  };
  for (const Limit& l : limits) {
    rlimit rl{};
    if (getrlimit(l.resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) continue;
    double used = 0.0;
#if defined(__linux__)
    used = detail::proc_kb("/proc/self/status", l.status_key);
    if (used < 0.0) used = 0.0;
#endif
    const double cap = static_cast<double>(rl.rlim_cur);
    detail::lower_to(m, cap > used ? cap - used : 0.0, l.name);
  }
  if (!std::isfinite(m.bytes)) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0)
      detail::lower_to(m, static_cast<double>(pages) * static_cast<double>(page),
                       "the physical memory");
  }
#endif
  return m;
}

// One term of a memory estimate: what it is for (naming the flags it grows with) and bytes.
struct MemoryItem {
  std::string what;
  double bytes;
};

// The estimate of the run that is in progress, for the out-of-memory message at main.
inline std::string& current_estimate() {
  static std::string s;
  return s;
}

// Refuses the run (UsageError) when the estimate exceeds `max_memory` (--max-memory; 0: the
// memory available). The message lists the terms, largest first.
inline void check_memory(std::vector<MemoryItem> items, double max_memory) {
  double total = 0.0;
  for (const MemoryItem& i : items) total += i.bytes;
  AvailableMemory avail;
  if (max_memory > 0.0) {
    avail.bytes = max_memory;
    avail.source = "--max-memory";
  } else {
    avail = available_memory();
  }
  current_estimate() = "the run was estimated to need " + format_bytes(total) +
                       (std::isfinite(avail.bytes) ? ", with " + format_bytes(avail.bytes) +
                                                         " available (" + avail.source + ")"
                                                   : std::string());
  if (total <= avail.bytes) return;
  std::sort(items.begin(), items.end(),
            [](const MemoryItem& a, const MemoryItem& b) { return a.bytes > b.bytes; });
  std::string parts;
  for (std::size_t i = 0; i < items.size() && i < 3; ++i) {
    if (items[i].bytes < total / 100) break;
    parts += (i ? "; " : "") + items[i].what + ": " + format_bytes(items[i].bytes);
  }
  throw UsageError("this run needs about " + format_bytes(total) + " of memory (" + parts +
                   "), more than the " + format_bytes(avail.bytes) + " available (" + avail.source +
                   "); lower those flags" +
                   (max_memory > 0.0 ? std::string(" or raise --max-memory")
                                     : std::string(", or set --max-memory to override")));
}

// Adds --max-memory SIZE to `app`; `bytes` stays 0 unless given.
inline CLI::Option* add_max_memory_flag(CLI::App& app, double& bytes) {
  CLI::Option* opt = app.add_option(
      "--max-memory", bytes,
      "Refuse a run estimated to need more memory than SIZE (e.g. 512M, 8G); default: the "
      "memory available (MemAvailable, the cgroup limit, ulimit -v / -d)");
  opt->type_name("SIZE in [1M, 1E]");
  opt->transform(CLI::Validator(
      [](std::string& text) -> std::string {
        double b = 0.0;
        if (!parse_size(text, b))
          return as_typed(text) +
                 " is not a size in [1M, 1E] (a number of bytes, or with "
                 "suffix K, M, G, T, P or E)";
        char buf[40];
        std::snprintf(buf, sizeof buf, "%.17g", b);
        text = buf;
        return std::string();
      },
      std::string()));
  return opt;
}

// ---------------------------------------------------------------------------------------------
// Temporary files removed when the tool is interrupted (SIGINT, SIGTERM, SIGHUP, SIGQUIT): the
// handler unlinks them and re-raises the signal.

namespace detail {

struct TempRegistry {
  static constexpr int kSlots = 16;
  char names[kSlots][4096];
  volatile std::sig_atomic_t used[kSlots];
};

inline TempRegistry& temp_registry() {
  static TempRegistry r{};
  return r;
}

#if !defined(_WIN32)
extern "C" inline void phasekv_tools_remove_temps(int sig) {
  TempRegistry& r = temp_registry();
  for (int i = 0; i < TempRegistry::kSlots; ++i)
    if (r.used[i]) unlink(r.names[i]);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}
#endif

// Registers `name` for removal on a signal; returns its slot (-1 when none is free).
inline int register_temp(const std::string& name) {
  TempRegistry& r = temp_registry();
#if !defined(_WIN32)
  static const bool installed = [] {
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) std::signal(sig, phasekv_tools_remove_temps);
    return true;
  }();
  (void)installed;
#endif
  if (name.size() >= sizeof r.names[0]) return -1;
  for (int i = 0; i < TempRegistry::kSlots; ++i)
    if (!r.used[i]) {
      std::memcpy(r.names[i], name.c_str(), name.size() + 1);
      r.used[i] = 1;
      return i;
    }
  return -1;
}

inline void unregister_temp(int slot) {
  if (slot >= 0) temp_registry().used[slot] = 0;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Output files: each is created as a temporary file next to its destination before the run
// (so an unwritable path is refused before any work), written, and renamed over the
// destination only when every output was written; a failed run leaves no file behind.
// Destinations under /dev/ or /proc/ (/dev/null, /dev/stdout, /dev/fd/3) and those that exist
// and are not regular files (a FIFO) are written directly.

class OutputFiles {
 public:
  OutputFiles() = default;
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;
  ~OutputFiles() { discard(); }

  // Registers `path` given to `flag`; throws UsageError when it cannot be written. Returns
  // the stream to write (std::cout for /dev/stdout).
  std::ostream& add(const std::string& flag, const std::string& path) {
    namespace fs = std::filesystem;
    if (path.empty()) throw UsageError(flag + " needs a file name");
    std::error_code ec;
    const auto same_file = [&ec](const std::string& a, const std::string& b) {
      return a == b || fs::weakly_canonical(fs::absolute(a, ec), ec) ==
                           fs::weakly_canonical(fs::absolute(b, ec), ec);
    };
    for (const File& f : files_)
      if (same_file(f.dest, path))
        throw UsageError(flag + " '" + path + "' is also given to " + f.flag);
    File f;
    f.flag = flag;
    f.dest = path;
    if (path == "/dev/stdout" || path == "/dev/fd/1" || path == "/proc/self/fd/1") {
      // Reopening it would start at offset 0 of a file stdout is redirected to.
      f.direct = true;
      f.out = &std::cout;
      files_.push_back(std::move(f));
      return std::cout;
    }
    const fs::file_status st = fs::status(path, ec);
    if (fs::is_directory(st)) throw UsageError(flag + " '" + path + "' is a directory");
    const bool special = path.compare(0, 5, "/dev/") == 0 || path.compare(0, 6, "/proc/") == 0;
    if (special || (fs::exists(st) && !fs::is_regular_file(st))) {
      // A device, FIFO or socket, or /dev/stdout and the like (which may lead to the file the
      // shell redirected stdout to): written in place, never renamed over.
      f.direct = true;
      f.target = path;
    } else {
      f.target = path;
      if (fs::is_symlink(fs::symlink_status(path, ec))) {
        const fs::path real = fs::weakly_canonical(path, ec);
        if (!ec) f.target = real.string();
      }
#if !defined(_WIN32)
      if (fs::exists(st) && access(f.target.c_str(), W_OK) != 0)
        throw UsageError("cannot write " + flag + " '" + path + "': " + std::strerror(errno));
#endif
      f.temp = make_temp(flag, path, f.target);
      f.slot = detail::register_temp(f.temp);
    }
    f.stream = std::make_unique<std::ofstream>(f.direct ? f.target : f.temp,
                                               std::ios::binary | std::ios::trunc);
    if (!*f.stream) {
      const int err = errno;
      if (!f.temp.empty()) std::remove(f.temp.c_str());
      detail::unregister_temp(f.slot);
      throw UsageError("cannot write " + flag + " '" + path + "'" +
                       (err ? std::string(": ") + std::strerror(err) : std::string()));
    }
    f.out = f.stream.get();
    files_.push_back(std::move(f));
    return *files_.back().out;
  }

  // Free bytes on the file system of `path`'s temporary file (infinite when unknown).
  double free_space(const std::string& path) const {
#if !defined(_WIN32)
    for (const File& f : files_)
      if (f.dest == path && !f.direct) {
        struct statvfs sv {};
        if (statvfs(f.temp.c_str(), &sv) == 0)
          return static_cast<double>(sv.f_bavail) * static_cast<double>(sv.f_frsize);
      }
#else
    (void)path;
#endif
    return std::numeric_limits<double>::infinity();
  }

  // Flushes and closes every file, then renames each temporary file over its destination.
  // Throws std::runtime_error naming the flag and the path when a write failed (every
  // temporary file is removed then).
  void commit() {
    for (File& f : files_) {
      errno = 0;
      f.out->flush();
      if (f.stream) f.stream->close();
      if (f.out->fail()) {
        const int err = errno;
        const std::string msg = "cannot write " + f.flag + " '" + f.dest + "'" +
                                (err ? std::string(": ") + std::strerror(err) : std::string());
        discard();
        throw std::runtime_error(msg);
      }
    }
    for (File& f : files_) {
      if (f.direct) continue;
      std::error_code ec;
      std::filesystem::rename(f.temp, f.target, ec);
      if (ec) {
        const std::string msg = "cannot write " + f.flag + " '" + f.dest + "': " + ec.message();
        discard();
        throw std::runtime_error(msg);
      }
      detail::unregister_temp(f.slot);
      f.temp.clear();
    }
    files_.clear();
  }

  // Removes every temporary file not yet renamed.
  void discard() noexcept {
    for (File& f : files_) {
      if (f.stream) f.stream->close();
      if (!f.temp.empty()) std::remove(f.temp.c_str());
      detail::unregister_temp(f.slot);
      f.temp.clear();
    }
    files_.clear();
  }

 private:
  struct File {
    std::string flag, dest, target, temp;
    int slot = -1;  // in the signal-time removal registry
    bool direct = false;
    std::unique_ptr<std::ofstream> stream;  // null for std::cout
    std::ostream* out = nullptr;
  };

  static std::string make_temp(const std::string& flag, const std::string& path,
                               const std::string& target) {
#if !defined(_WIN32)
    std::string tmpl = target + ".tmp.XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    const int fd = mkstemp(buf.data());
    if (fd < 0)
      throw UsageError("cannot write " + flag + " '" + path + "': " + std::strerror(errno));
    // mkstemp creates the file 0600; give it the mode a new file would get.
    const mode_t mask = umask(0);
    umask(mask);
    (void)fchmod(fd, 0666 & ~mask);
    close(fd);
    return std::string(buf.data());
#else
    static int counter = 0;
    (void)flag;
    (void)path;
    return target + ".tmp." + std::to_string(_getpid()) + "." + std::to_string(counter++);
#endif
  }

  std::vector<File> files_;
};

// ---------------------------------------------------------------------------------------------
// Parsing and main.

// Parses the command line. Returns -1 to go on, or the exit status when the tool must stop
// (0 after --help; kExitUsage after an error, printed as "tool: message").
inline int parse_args(CLI::App& app, int argc, char** argv, const char* tool) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::fprintf(stderr, "%s: %s\nRun with --help for more information.\n", tool, e.what());
    return kExitUsage;
  }
  return -1;
}

// Runs `body` (returning the exit status) and turns every exception into a message on stderr
// that starts with the tool's name: a UsageError or a phasekv::invalid_argument gives
// kExitUsage; running out of memory names the estimate; anything else gives kExitFailed.
template <class Body>
int run_main(const char* tool, Body&& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n", tool, e.what());
    return kExitUsage;
  } catch (const phasekv::invalid_argument& e) {
    std::fprintf(stderr, "%s: %s\n", tool, e.what());
    return kExitUsage;
  } catch (const std::bad_alloc&) {
    const std::string& est = current_estimate();
    std::fprintf(stderr, "%s: out of memory%s%s%s\n", tool, est.empty() ? "" : " (", est.c_str(),
                 est.empty() ? "" : ")");
    return kExitFailed;
  } catch (const std::length_error&) {
    const std::string& est = current_estimate();
    std::fprintf(stderr, "%s: out of memory (a buffer would exceed its largest size%s%s)\n", tool,
                 est.empty() ? "" : "; ", est.c_str());
    return kExitFailed;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", tool, e.what());
    return kExitFailed;
  }
}

}  // namespace phasekv_tools
