// phasekv-report: per-residue accuracy report of retrieval results produced by any engine.
// Reads JSON lines {"position": int, "correct": bool} or {"residue": int, "correct": bool}
// and prints the per-residue table with Wilson intervals and the summary; optional JSON, CSV,
// Markdown and SVG outputs. A bad line is an error naming the line; nothing is dropped.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

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
#include "phasekv/phase/residue.hpp"

namespace {

using nlohmann::json;

struct LineError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Longest line read; a longer one is an error (a file that is not JSON lines would otherwise
// be read whole into memory).
constexpr std::size_t kMaxLine = std::size_t{16} << 20;

bool blank(const std::string& s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r') return false;
  return true;
}

// Reads one line (without the '\n') into `line`, stopping after kMaxLine bytes (then
// `too_long` is set); false at the end of the input.
bool read_line(std::streambuf* sb, std::string& line, bool& too_long) {
  using traits = std::char_traits<char>;
  line.clear();
  too_long = false;
  traits::int_type c = sb->sbumpc();
  if (traits::eq_int_type(c, traits::eof())) return false;
  for (; !traits::eq_int_type(c, traits::eof()) && traits::to_char_type(c) != '\n';
       c = sb->sbumpc()) {
    if (line.size() >= kMaxLine) {
      too_long = true;
      break;
    }
    line.push_back(traits::to_char_type(c));
  }
  return true;
}

// The text, as written in `line`, of the number of the top-level member `key`, when nlohmann
// stored it as floating point (a fraction, an exponent, or an integer beyond 64 bits).
std::string raw_float_text(const std::string& line, const std::string& key) {
  struct Sax : nlohmann::json_sax<json> {
    std::string want, current, found;
    int depth = 0;
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t& s) override {
      if (depth == 1 && current == want) found = s;
      return true;
    }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override {
      ++depth;
      return true;
    }
    bool key(string_t& k) override {
      if (depth == 1) current = k;
      return true;
    }
    bool end_object() override {
      --depth;
      return true;
    }
    bool start_array(std::size_t) override {
      ++depth;
      return true;
    }
    bool end_array() override {
      --depth;
      return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
      return false;
    }
  } sax;
  sax.want = key;
  json::sax_parse(line, &sax);
  return sax.found;
}

// The integer member `key`; a LineError naming the value as written when it is not an
// integer or not an int64 (then `range` says what is allowed).
std::int64_t get_int(const json& j, const std::string& line, const char* key,
                     const std::string& range) {
  const json& v = j.at(key);
  const std::string name = std::string("\"") + key + "\"";
  if (v.is_number_unsigned()) {
    const std::uint64_t u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      throw LineError(name + " = " + std::to_string(u) + " is out of range (" + range + ")");
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_number_float()) {
    const std::string text = raw_float_text(line, key);
    if (!text.empty() && text.find_first_of(".eE") == std::string::npos)
      throw LineError(name + " = " + text + " is out of range (" + range + ")");
    throw LineError(name + " must be an integer, got " + (text.empty() ? v.dump() : text));
  }
  throw LineError(name + " must be an integer, got " + v.dump());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"phasekv-report: per-residue retrieval accuracy with Wilson intervals, "
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
      app.add_option("--input,-i", input, "JSON-lines results file ('-' for stdin)")
          ->required());
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
        throw phasekv_tools::UsageError("cannot open --input '" + input + "': " +
                                        std::strerror(errno));
      in = &file;
    }
    phasekv_tools::OutputFiles files;
    const phasekv_tools::ReportFiles report_files = phasekv_tools::open_report_files(files, out);
    phasekv::eval::PhaseTally tally(modulus);
    const std::string pos_range =
        "positions are integers in [--origin, 9223372036854775807] = [" +
        std::to_string(origin) + ", 9223372036854775807]";
    const std::string res_range =
        "residues are integers in [0, --modulus) = [0, " + std::to_string(modulus) + ")";
    std::string line;
    std::int64_t lineno = 0, records = 0;
    bool too_long = false;
    try {
      while (read_line(in->rdbuf(), line, too_long)) {
        ++lineno;
        if (too_long)
          throw LineError("the line is longer than 16 MiB (is this a JSON-lines results file?)");
        if (blank(line)) continue;
        try {
          const json j = json::parse(line);
          if (!j.is_object()) throw LineError("expected a JSON object");
          if (!j.contains("correct")) throw LineError("missing \"correct\"");
          if (!j.at("correct").is_boolean())
            throw LineError("\"correct\" must be true or false, got " + j.at("correct").dump());
          const bool correct = j.at("correct").get<bool>();
          const bool has_pos = j.contains("position"), has_res = j.contains("residue");
          if (!has_pos && !has_res) throw LineError("needs \"position\" or \"residue\"");
          std::int64_t r = 0;
          if (has_pos) {
            const std::int64_t p = get_int(j, line, "position", pos_range);
            if (p < origin)
              throw LineError("\"position\" = " + std::to_string(p) + " is below --origin " +
                              std::to_string(origin));
            r = phasekv::residue(p, modulus, origin);
            if (has_res) {
              const std::int64_t given = get_int(j, line, "residue", res_range);
              if (given != r)
                throw LineError("\"residue\" = " + std::to_string(given) +
                                " disagrees with position " + std::to_string(p) + " mod " +
                                std::to_string(modulus) + " = " + std::to_string(r));
            }
          } else {
            r = get_int(j, line, "residue", res_range);
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
    const std::string header = std::to_string(records) + " results from " + input +
                               ", modulus " + std::to_string(modulus) + "\n\n";
    phasekv_tools::emit_report(s, out, report_files, files,
                               "Accuracy by residue mod " + std::to_string(modulus), header);
    if (s.empty_groups > 0)
      std::fprintf(stderr, "phasekv-report: warning: %lld residue(s) have no results\n",
                   static_cast<long long>(s.empty_groups));
    return 0;
  });
}
