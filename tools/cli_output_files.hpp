// Output files written to a temporary file next to the destination and renamed on success. Internal
// to tools/, not part of the installed headers.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
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

#include "cli_flags.hpp"
#include "cli_temp_files.hpp"

namespace phasekv_tools {

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

}  // namespace phasekv_tools
