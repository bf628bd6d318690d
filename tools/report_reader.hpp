// The line reader of phasekv-report: one JSON-lines record {"position": int, "correct": bool}
// or {"residue": int, "correct": bool} to a residue, or a LineError naming what is wrong.
// Shared by tools/report.cpp and the fuzz target tests/fuzz/fuzz_report_reader.cpp.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <streambuf>
#include <string>

#include "phasekv/phase/residue.hpp"

namespace phasekv_tools {
namespace report {

using nlohmann::json;

struct LineError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Longest line read; a longer one is an error (a file that is not JSON lines would otherwise
// be read whole into memory).
constexpr std::size_t kMaxLine = std::size_t{16} << 20;

inline bool blank(const std::string& s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r') return false;
  return true;
}

// Reads one line (without the '\n') into `line`, stopping after kMaxLine bytes (then
// `too_long` is set); false at the end of the input.
inline bool read_line(std::streambuf* sb, std::string& line, bool& too_long) {
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
inline std::string raw_float_text(const std::string& line, const std::string& key) {
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
inline std::int64_t get_int(const json& j, const std::string& line, const char* key,
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

// One accepted record: its residue, the position when the line gave one, and the outcome.
struct Record {
  std::int64_t residue = 0;
  bool has_position = false;
  std::int64_t position = 0;
  bool correct = false;
};

// Reads one non-blank line of a results file for modulus `modulus` (>= 1) and origin `origin`
// (>= 0); throws LineError naming the problem (integers out of int64 are named as written).
inline Record parse_line(const std::string& line, std::int64_t modulus, std::int64_t origin) {
  const std::string pos_range = "positions are integers in [--origin, 9223372036854775807] = [" +
                                std::to_string(origin) + ", 9223372036854775807]";
  const std::string res_range =
      "residues are integers in [0, --modulus) = [0, " + std::to_string(modulus) + ")";
  try {
    const json j = json::parse(line);
    if (!j.is_object()) throw LineError("expected a JSON object");
    if (!j.contains("correct")) throw LineError("missing \"correct\"");
    if (!j.at("correct").is_boolean())
      throw LineError("\"correct\" must be true or false, got " + j.at("correct").dump());
    Record rec;
    rec.correct = j.at("correct").get<bool>();
    const bool has_pos = j.contains("position"), has_res = j.contains("residue");
    if (!has_pos && !has_res) throw LineError("needs \"position\" or \"residue\"");
    if (has_pos) {
      const std::int64_t p = get_int(j, line, "position", pos_range);
      if (p < origin)
        throw LineError("\"position\" = " + std::to_string(p) + " is below --origin " +
                        std::to_string(origin));
      rec.has_position = true;
      rec.position = p;
      rec.residue = phasekv::residue(p, modulus, origin);
      if (has_res) {
        const std::int64_t given = get_int(j, line, "residue", res_range);
        if (given != rec.residue)
          throw LineError("\"residue\" = " + std::to_string(given) + " disagrees with position " +
                          std::to_string(p) + " mod " + std::to_string(modulus) + " = " +
                          std::to_string(rec.residue));
      }
    } else {
      rec.residue = get_int(j, line, "residue", res_range);
      if (rec.residue < 0 || rec.residue >= modulus)
        throw LineError("\"residue\" = " + std::to_string(rec.residue) + " is outside [0, " +
                        std::to_string(modulus) + ")");
    }
    return rec;
  } catch (const nlohmann::json::exception& e) {
    throw LineError(std::string("invalid JSON: ") + e.what());
  }
}

}  // namespace report
}  // namespace phasekv_tools
