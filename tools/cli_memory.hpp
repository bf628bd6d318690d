// The memory a run may use: what this process may still allocate (cgroup, rlimit, /proc/meminfo),
// the --max-memory flag and the check of a run's estimate against it. Internal to tools/, not part
// of the installed headers.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
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

#include "cli_flags.hpp"

namespace phasekv_tools {

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

}  // namespace phasekv_tools
