// Command-line parsing and main: exceptions become messages and exit statuses. Internal to tools/,
// not part of the installed headers.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "phasekv/core/error.hpp"
#include "cli_flags.hpp"
#include "cli_memory.hpp"

namespace phasekv_tools {

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
