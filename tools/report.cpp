// phasekv-report: per-residue accuracy report of retrieval results produced by any engine.
// Reads JSON lines {"position": int, "correct": bool} or {"residue": int, "correct": bool}
// and prints the per-residue table with Wilson intervals and the summary; optional JSON, CSV,
// Markdown and SVG outputs. A bad line is an error naming the line; nothing is dropped.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <stdexcept>
#include <string>
#include <system_error>

#include "eval_common.hpp"
#include "phasekv/eval/stats.hpp"
#include "report_reader.hpp"

using phasekv_tools::report::LineError;

int main(int argc, char** argv) {
  CLI::App app{
      "phasekv-report: per-residue retrieval accuracy with Wilson intervals, "
      "homogeneity test and period"};
  std::int64_t modulus = 0;
  std::int64_t origin = 0;
  std::string input;
  double max_memory = 0.0;
  phasekv_tools::ReportOutputs out;
  std::ios::sync_with_stdio(false);  // std::cin is read byte by byte; stdout is only printf
  phasekv_tools::int_range<std::int64_t>(
      app.add_option("--modulus,-m", modulus, "Group targets by residue modulo M")->required(), 1,
      std::int64_t{1} << 20);
  phasekv_tools::file_name(
      app.add_option("--input,-i", input, "JSON-lines results file ('-' for stdin)")->required());
  phasekv_tools::int_range<std::int64_t>(
      app.add_option("--origin", origin, "Residue of a position p is (p - origin) mod M"), 0,
      phasekv::kMaxGeometryExtent);
  phasekv_tools::add_report_flags(app, out);
  phasekv_tools::add_max_memory_flag(app, max_memory);
  if (const int rc = phasekv_tools::parse_args(app, argc, argv, "phasekv-report"); rc >= 0)
    return rc;

  return phasekv_tools::run_main("phasekv-report", [&]() -> int {
    phasekv_tools::check_memory({phasekv_tools::report_memory(modulus),
                                 {"the program and one input line", 32.0 * 1024 * 1024}},
                                max_memory);
    std::ifstream file;
    std::istream* in = &std::cin;
    const std::string name = input == "-" ? std::string("stdin") : input;
    if (input != "-") {
      std::error_code ec;
      if (std::filesystem::is_directory(input, ec))
        throw phasekv_tools::UsageError("--input '" + input +
                                        "' is a directory, not a JSON-lines results file");
      file.open(input, std::ios::binary);
      if (!file)
        throw phasekv_tools::UsageError("cannot open --input '" + input +
                                        "': " + std::strerror(errno));
      in = &file;
    }
    phasekv_tools::OutputFiles files;
    const phasekv_tools::ReportFiles report_files = phasekv_tools::open_report_files(files, out);
    phasekv::eval::PhaseTally tally(modulus);
    std::string line;
    std::int64_t lineno = 0, records = 0;
    bool too_long = false;
    try {
      while (phasekv_tools::report::read_line(in->rdbuf(), line, too_long)) {
        ++lineno;
        if (too_long)
          throw LineError("the line is longer than 16 MiB (is this a JSON-lines results file?)");
        if (phasekv_tools::report::blank(line)) continue;
        const phasekv_tools::report::Record rec =
            phasekv_tools::report::parse_line(line, modulus, origin);
        tally.add_residue(rec.residue, rec.correct);
        ++records;
      }
    } catch (const LineError& e) {
      std::fprintf(stderr, "phasekv-report: %s:%lld: %s\n", name.c_str(),
                   static_cast<long long>(lineno), e.what());
      return phasekv_tools::kExitFailed;
    }
    if (file.bad() || (input == "-" && std::cin.bad()))
      throw std::runtime_error("cannot read --input '" + input + "'");
    if (records == 0) {
      std::fprintf(stderr,
                   "phasekv-report: --input '%s' has no results (it is empty or holds only blank "
                   "lines)\n",
                   input.c_str());
      return phasekv_tools::kExitFailed;
    }
    const phasekv::eval::Summary s = phasekv::eval::summarize(tally, out.alpha);
    const std::string header = std::to_string(records) + " results from " + input + ", modulus " +
                               std::to_string(modulus) + "\n\n";
    phasekv_tools::emit_report(s, out, report_files, files,
                               "Accuracy by residue mod " + std::to_string(modulus), header);
    if (s.empty_groups > 0)
      std::fprintf(stderr, "phasekv-report: warning: %lld residue(s) have no results\n",
                   static_cast<long long>(s.empty_groups));
    return 0;
  });
}
