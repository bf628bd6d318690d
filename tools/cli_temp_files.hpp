// Temporary files removed when the tool is interrupted (a signal handler unlinks them). Internal to
// tools/, not part of the installed headers.
#pragma once

#include <csignal>
#include <cstring>
#include <string>

#if defined(_WIN32)
#include <process.h>
#else
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#endif

namespace phasekv_tools {

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

}  // namespace phasekv_tools
