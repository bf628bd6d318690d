// Differential fuzz target: phasekv-report's JSON-lines reader (tools/report_reader.hpp).
// Input: one byte for --modulus, one for --origin, then the file. Checks, per line:
// - read_line splits the file exactly as a plain split at '\n' does;
// - a line nlohmann accepts as JSON gives the same record or the same refusal after being
//   re-serialized (dump) and read again;
// - a flat record (an object of string keys without escapes and integer, true, false or null
//   values, no duplicate keys) gives what an independent scanner written from the documented
//   rules expects: the same record, or a refusal;
// - a refusal never prints a wrapped int64 (-9223372036854775808) the line does not contain.
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_input.hpp"
#include "report_reader.hpp"

namespace {

using i64 = std::int64_t;
namespace rr = phasekv_tools::report;

struct Outcome {
  bool ok = false;
  rr::Record rec;
  std::string error;
};

Outcome read(const std::string& line, i64 modulus, i64 origin) {
  Outcome o;
  try {
    o.rec = rr::parse_line(line, modulus, origin);
    o.ok = true;
  } catch (const rr::LineError& e) {
    o.error = e.what();
  }
  return o;
}

bool same(const Outcome& a, const Outcome& b) {
  if (a.ok != b.ok) return false;
  if (!a.ok) return true;
  return a.rec.residue == b.rec.residue && a.rec.correct == b.rec.correct &&
         a.rec.has_position == b.rec.has_position &&
         (!a.rec.has_position || a.rec.position == b.rec.position);
}

// The independent scanner of flat records.
struct Value {
  enum Kind { boolean, null, integer } kind = null;
  bool b = false;
  bool fits = false;  // integer within int64
  i64 i = 0;
};

struct Scanner {
  const std::string& s;
  std::size_t p = 0;
  void ws() {
    while (p < s.size() && (s[p] == ' ' || s[p] == '\t' || s[p] == '\r' || s[p] == '\n')) ++p;
  }
  bool lit(const char* w) {
    const std::string t(w);
    if (s.compare(p, t.size(), t) != 0) return false;
    p += t.size();
    return true;
  }
  bool key(std::string& k) {
    if (p >= s.size() || s[p] != '"') return false;
    ++p;
    while (p < s.size() && s[p] != '"') {
      const unsigned char c = static_cast<unsigned char>(s[p]);
      if (c == '\\' || c < 0x20 || c >= 0x7f) return false;  // escapes, controls, UTF-8
      k.push_back(s[p++]);
    }
    if (p >= s.size()) return false;
    ++p;
    return true;
  }
  bool value(Value& v) {
    if (lit("true")) {
      v.kind = Value::boolean;
      v.b = true;
      return true;
    }
    if (lit("false")) {
      v.kind = Value::boolean;
      v.b = false;
      return true;
    }
    if (lit("null")) {
      v.kind = Value::null;
      return true;
    }
    const bool neg = p < s.size() && s[p] == '-';
    if (neg) ++p;
    const std::size_t d0 = p;
    while (p < s.size() && s[p] >= '0' && s[p] <= '9') ++p;
    const std::size_t nd = p - d0;
    if (nd == 0 || (nd > 1 && s[d0] == '0')) return false;
    if (p < s.size() && (s[p] == '.' || s[p] == 'e' || s[p] == 'E')) return false;
    v.kind = Value::integer;
    // Magnitude as unsigned with overflow detection; int64 allows 2^63 only when negative.
    unsigned long long mag = 0;
    bool over = false;
    for (std::size_t i = d0; i < p; ++i) {
      const unsigned d = static_cast<unsigned>(s[i] - '0');
      if (mag > (~0ULL - d) / 10)
        over = true;
      else
        mag = mag * 10 + d;
    }
    const unsigned long long lim = neg ? (1ULL << 63) : (1ULL << 63) - 1;
    v.fits = !over && mag <= lim;
    if (v.fits) v.i = neg ? static_cast<i64>(0ULL - mag) : static_cast<i64>(mag);
    return true;
  }
  // Parses a flat object; false when the line is not one (then nothing is expected).
  bool object(std::vector<std::pair<std::string, Value>>& members) {
    ws();
    if (!lit("{")) return false;
    ws();
    if (lit("}")) {
      ws();
      return p == s.size();
    }
    for (;;) {
      ws();
      std::string k;
      if (!key(k)) return false;
      for (const auto& m : members)
        if (m.first == k) return false;  // duplicate keys: not flat
      ws();
      if (!lit(":")) return false;
      ws();
      Value v;
      if (!value(v)) return false;
      members.emplace_back(k, v);
      ws();
      if (lit(",")) continue;
      if (!lit("}")) return false;
      ws();
      return p == s.size();
    }
  }
};

// What the documented rules say about a flat record.
Outcome expected(const std::vector<std::pair<std::string, Value>>& members, i64 modulus,
                 i64 origin) {
  const Value *correct = nullptr, *position = nullptr, *residue = nullptr;
  for (const auto& m : members) {
    if (m.first == "correct") correct = &m.second;
    if (m.first == "position") position = &m.second;
    if (m.first == "residue") residue = &m.second;
  }
  Outcome o;
  if (!correct || correct->kind != Value::boolean) return o;
  if (!position && !residue) return o;
  auto int_ok = [](const Value* v) { return v->kind == Value::integer && v->fits; };
  if (position) {
    if (!int_ok(position) || position->i < origin) return o;
    i64 r = (position->i - origin) % modulus;
    if (r < 0) r += modulus;
    if (residue && (!int_ok(residue) || residue->i != r)) return o;
    o.rec.has_position = true;
    o.rec.position = position->i;
    o.rec.residue = r;
  } else {
    if (!int_ok(residue) || residue->i < 0 || residue->i >= modulus) return o;
    o.rec.residue = residue->i;
  }
  o.rec.correct = correct->b;
  o.ok = true;
  return o;
}

void check_line(const std::string& line, i64 modulus, i64 origin) {
  const Outcome got = read(line, modulus, origin);
  if (!got.ok) {
    PKV_FUZZ_CHECK(!got.error.empty(), "a refusal without a message");
    PKV_FUZZ_CHECK(got.error.find("-9223372036854775808") == std::string::npos ||
                       line.find("-9223372036854775808") != std::string::npos,
                   "wrapped value in '%s'", got.error.c_str());
  } else {
    PKV_FUZZ_CHECK(got.rec.residue >= 0 && got.rec.residue < modulus, "residue %lld",
                   (long long)got.rec.residue);
  }
  // Re-serialized by nlohmann: the same outcome.
  nlohmann::json j;
  bool parsed = true;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception&) {
    parsed = false;
  }
  PKV_FUZZ_CHECK(parsed || !got.ok, "accepted a line nlohmann refuses: %s", line.c_str());
  if (parsed) {
    const std::string again = j.dump();
    const Outcome re = read(again, modulus, origin);
    PKV_FUZZ_CHECK(same(got, re), "'%s' -> %s, re-serialized '%s' -> %s", line.c_str(),
                   got.ok ? "accepted" : got.error.c_str(), again.c_str(),
                   re.ok ? "accepted" : re.error.c_str());
  }
  // The independent scanner.
  std::vector<std::pair<std::string, Value>> members;
  Scanner sc{line};
  if (sc.object(members)) {
    const Outcome want = expected(members, modulus, origin);
    PKV_FUZZ_CHECK(same(got, want),
                   "'%s' (modulus %lld, origin %lld): reader %s (residue %lld), "
                   "scanner %s (residue %lld)",
                   line.c_str(), (long long)modulus, (long long)origin,
                   got.ok ? "accepts" : got.error.c_str(), (long long)got.rec.residue,
                   want.ok ? "accepts" : "refuses", (long long)want.rec.residue);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  pkv_fuzz::FuzzInput in(data, size);
  const i64 mb = in.range(0, 255), ob = in.range(0, 255);
  const i64 modulus = mb == 255 ? (i64{1} << 20) : 1 + mb % 64;
  const i64 origin = ob == 255 ? (i64{1} << 40) : ob % 17;
  const std::string file = in.rest();
  // read_line against a plain split.
  std::vector<std::string> split;
  {
    std::size_t b = 0;
    while (b < file.size()) {
      const std::size_t e = file.find('\n', b);
      split.push_back(file.substr(b, e == std::string::npos ? std::string::npos : e - b));
      b = e == std::string::npos ? file.size() : e + 1;
    }
  }
  std::stringbuf sb(file);
  std::string line;
  bool too_long = false;
  std::size_t k = 0;
  while (rr::read_line(&sb, line, too_long)) {
    PKV_FUZZ_CHECK(!too_long && k < split.size() && line == split[k], "line %zu differs", k);
    ++k;
    if (!rr::blank(line)) check_line(line, modulus, origin);
  }
  PKV_FUZZ_CHECK(k == split.size(), "read_line read %zu lines, split %zu", k, split.size());
  return 0;
}
