// phasekv-report: per-residue accuracy report of retrieval results produced by any engine.
// Reads JSON lines {"position": int, "correct": bool} or {"residue": int, "correct": bool}
// and prints the per-residue table with Wilson intervals and the summary; optional JSON, CSV,
// Markdown and SVG outputs. A bad line is an error naming the line; nothing is dropped.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>

#include "eval_common.hpp"
#include "phasekv/eval/stats.hpp"
#include "phasekv/phase/residue.hpp"

namespace {

struct LineError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool blank(const std::string& s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r') return false;
  return true;
}

std::int64_t get_int(const nlohmann::json& j, const char* key) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_integer())
    throw LineError(std::string("\"") + key + "\" must be an integer, got " + v.dump());
  return v.get<std::int64_t>();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"phasekv-report: per-residue retrieval accuracy with Wilson intervals, "
               "homogeneity test and period"};
  std::int64_t modulus = 0;
  std::int64_t origin = 0;
  std::string input;
  phasekv_tools::ReportOutputs out;
  app.add_option("--modulus,-m", modulus, "Group targets by residue modulo M")
      ->required()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--input,-i", input, "JSON-lines results file ('-' for stdin)")->required();
  app.add_option("--origin", origin, "Residue of a position p is (p - origin) mod M")
      ->check(CLI::NonNegativeNumber);
  phasekv_tools::add_report_flags(app, out);
  CLI11_PARSE(app, argc, argv);

  std::ifstream file;
  std::istream* in = &std::cin;
  if (input != "-") {
    file.open(input);
    if (!file) {
      std::fprintf(stderr, "phasekv-report: cannot open --input '%s'\n", input.c_str());
      return 1;
    }
    in = &file;
  }
  phasekv::eval::PhaseTally tally(modulus);
  std::string line;
  std::int64_t lineno = 0, records = 0;
  try {
    while (std::getline(*in, line)) {
      ++lineno;
      if (blank(line)) continue;
      try {
        const nlohmann::json j = nlohmann::json::parse(line);
        if (!j.is_object()) throw LineError("expected a JSON object");
        if (!j.contains("correct")) throw LineError("missing \"correct\"");
        if (!j.at("correct").is_boolean())
          throw LineError("\"correct\" must be true or false, got " + j.at("correct").dump());
        const bool correct = j.at("correct").get<bool>();
        const bool has_pos = j.contains("position"), has_res = j.contains("residue");
        if (!has_pos && !has_res) throw LineError("needs \"position\" or \"residue\"");
        std::int64_t r = 0;
        if (has_pos) {
          const std::int64_t p = get_int(j, "position");
          if (p < origin)
            throw LineError("\"position\" = " + std::to_string(p) + " is below --origin " +
                            std::to_string(origin));
          r = phasekv::residue(p, modulus, origin);
          if (has_res && get_int(j, "residue") != r)
            throw LineError("\"residue\" = " + std::to_string(get_int(j, "residue")) +
                            " disagrees with position " + std::to_string(p) + " mod " +
                            std::to_string(modulus) + " = " + std::to_string(r));
        } else {
          r = get_int(j, "residue");
          if (r < 0 || r >= modulus)
            throw LineError("\"residue\" = " + std::to_string(r) + " is outside [0, " +
                            std::to_string(modulus) + ")");
        }
        tally.add_residue(r, correct);
        ++records;
      } catch (const nlohmann::json::exception& e) {
        throw LineError(std::string("invalid JSON: ") + e.what());
      }
    }
  } catch (const LineError& e) {
    std::fprintf(stderr, "phasekv-report: %s:%lld: %s\n", input.c_str(),
                 static_cast<long long>(lineno), e.what());
    return 1;
  }
  if (records == 0) {
    std::fprintf(stderr, "phasekv-report: %s: no results\n", input.c_str());
    return 1;
  }
  try {
    const phasekv::eval::Summary s = phasekv::eval::summarize(tally, out.alpha);
    std::printf("%lld results from %s, modulus %lld\n\n", static_cast<long long>(records),
                input.c_str(), static_cast<long long>(modulus));
    phasekv_tools::emit_report(s, out, "Accuracy by residue mod " + std::to_string(modulus));
    if (s.empty_groups > 0)
      std::fprintf(stderr, "phasekv-report: warning: %lld residue(s) have no results\n",
                   static_cast<long long>(s.empty_groups));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "phasekv-report: %s\n", e.what());
    return 1;
  }
  return 0;
}
