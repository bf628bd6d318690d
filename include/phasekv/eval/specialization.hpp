/// @file
/// @brief Head knockout and the phase specialization map: for each head, the per-residue
/// accuracy drop when that head alone is knocked out (its compressed entries excluded from its
/// softmax, RetrievalConfig::knockout), with reports as text, CSV, JSON and an SVG heat map.
///
/// Two heads that serve the same phase (a collision) cover for each other, so neither
/// single-head knockout drops that phase. The map therefore also runs each head alone (every
/// other head knocked out) and with every head knocked out: a head *serves* residue r when
/// knocking it out drops r, or when it alone retrieves r better than no head does (disjoint
/// 95 % Wilson intervals in both cases). A residue served by two or more heads is a collision.
///
/// Every run of a map uses the same seed, so all runs see the same contexts and the same
/// targets: the drops are paired differences.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/eval/report.hpp"
#include "phasekv/eval/retrieval.hpp"
#include "phasekv/eval/stats.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace eval {

/// The phase specialization map of a compressor: the per-residue accuracy of the intact model
/// and of each single-head knockout.
struct SpecializationMap {
  std::int64_t heads = 0;        ///< Heads H (KV heads of the compressed cache).
  std::int64_t modulus = 0;      ///< Residue modulus M of the report.
  Summary baseline;              ///< No head knocked out.
  Summary none;                  ///< Every head knocked out (raw tokens only).
  std::vector<Summary> knocked;  ///< `knocked[h]`: head h alone knocked out.
  std::vector<Summary> alone;    ///< `alone[h]`: every head but h knocked out.

  /// `baseline - knocked[h]` accuracy of residue r (a fraction; NaN when a group is empty).
  double drop(std::int64_t h, std::int64_t r) const {
    return baseline.groups[static_cast<std::size_t>(r)].accuracy -
           knocked[static_cast<std::size_t>(h)].groups[static_cast<std::size_t>(r)].accuracy;
  }
  /// True when knocking out head h lowers residue r beyond chance: the Wilson interval of the
  /// knockout lies wholly below that of the baseline (disjoint 95 % intervals).
  bool needed(std::int64_t h, std::int64_t r) const {
    return below(knocked[static_cast<std::size_t>(h)], baseline, r);
  }
  /// True when head h alone retrieves residue r beyond what no head does: the Wilson interval
  /// of `none` lies wholly below that of `alone[h]`.
  bool suffices(std::int64_t h, std::int64_t r) const {
    return below(none, alone[static_cast<std::size_t>(h)], r);
  }
  /// True when head h serves residue r: needed() or suffices().
  bool serves(std::int64_t h, std::int64_t r) const { return needed(h, r) || suffices(h, r); }
  /// Heads that serve residue r (see serves()); two or more is a collision.
  std::vector<std::int64_t> servers(std::int64_t r) const {
    std::vector<std::int64_t> out;
    for (std::int64_t h = 0; h < heads; ++h)
      if (serves(h, r)) out.push_back(h);
    return out;
  }
  /// Residues that head h serves.
  std::vector<std::int64_t> served_by(std::int64_t h) const {
    std::vector<std::int64_t> out;
    for (std::int64_t r = 0; r < modulus; ++r)
      if (serves(h, r)) out.push_back(r);
    return out;
  }

 private:
  static bool below(const Summary& lo, const Summary& hi, std::int64_t r) {
    const GroupStats& a = lo.groups[static_cast<std::size_t>(r)];
    const GroupStats& b = hi.groups[static_cast<std::size_t>(r)];
    return a.n > 0 && b.n > 0 && a.ci_high < b.ci_low;
  }
};

/// Runs run_retrieval intact, with every head knocked out, and per head with that head alone
/// knocked out and with only that head kept (same seed, so the same contexts and targets:
/// 2 heads + 2 runs, 3 for one head) and returns the map. `cfg.knockout` must be empty;
/// `attend` and the policies are as for run_retrieval (a compressor, not NoCompression).
/// `progress(done, total)` counts runs. Throws phasekv::invalid_argument as
/// run_retrieval does, and for a non-empty `cfg.knockout`.
template <class KeyPolicy, class ValuePolicy, class Attend>
SpecializationMap specialization_map(
    const RetrievalConfig& cfg, const KeyPolicy& key_policy, const ValuePolicy& value_policy,
    Attend&& attend, double period_alpha = kDefaultPeriodAlpha,
    const std::function<void(std::int64_t, std::int64_t)>& progress = {}) {
  phasekv::detail::check_arg(cfg.knockout.empty(), "phasekv::eval::specialization_map",
                             "cfg.knockout.size()", static_cast<std::int64_t>(cfg.knockout.size()),
                             "must be 0 (the map knocks out each head in turn)");
  const std::int64_t H = cfg.heads, total = H == 1 ? 3 : 2 * H + 2;
  std::int64_t done = 0;
  const auto run_with = [&](std::vector<std::int64_t> knockout) {
    RetrievalConfig c = cfg;
    c.knockout = std::move(knockout);
    Summary s = summarize(run_retrieval(c, key_policy, value_policy, attend).tally, period_alpha);
    if (progress) progress(++done, total);
    return s;
  };
  SpecializationMap map;
  map.heads = H;
  map.baseline = run_with({});
  map.modulus = map.baseline.modulus;
  std::vector<std::int64_t> all;
  for (std::int64_t h = 0; h < H; ++h) all.push_back(h);
  map.none = run_with(all);
  for (std::int64_t h = 0; h < H; ++h) map.knocked.push_back(run_with({h}));
  for (std::int64_t h = 0; h < H; ++h) {
    if (H == 1) {
      map.alone.push_back(map.baseline);
      continue;
    }
    std::vector<std::int64_t> others;
    for (std::int64_t k = 0; k < H; ++k)
      if (k != h) others.push_back(k);
    map.alone.push_back(run_with(others));
  }
  return map;
}

namespace detail {

// Signed percentage points with one decimal ("+52.5", "-1.3", "n/a").
inline std::string pp(double x) { return percent_text(x, true); }

inline std::string join(const std::vector<std::int64_t>& v) {
  std::string s;
  for (std::int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

}  // namespace detail

/// The findings in words: per head the residues it serves, then the residues served by two or
/// more heads (collisions) and those that no head serves, one per line.
inline std::string specialization_findings(const SpecializationMap& m) {
  std::ostringstream os;
  for (std::int64_t h = 0; h < m.heads; ++h) {
    const std::vector<std::int64_t> r = m.served_by(h);
    os << "head " << h << " serves residue(s): " << (r.empty() ? "none" : detail::join(r)) << '\n';
  }
  std::string collisions, unserved;
  for (std::int64_t r = 0; r < m.modulus; ++r) {
    const std::vector<std::int64_t> s = m.servers(r);
    if (s.size() >= 2)
      collisions += (collisions.empty() ? "" : "; ") + std::string("r=") + std::to_string(r) +
                    " by heads " + detail::join(s);
    if (s.empty()) unserved += (unserved.empty() ? "" : ", ") + std::to_string(r);
  }
  os << "collisions: " << (collisions.empty() ? "none" : collisions) << '\n';
  os << "residues no head serves: " << (unserved.empty() ? "none" : unserved) << '\n';
  return os.str();
}

/// Markdown table: the intact accuracy and the accuracy with every head knocked out; one row
/// per head with the accuracy drop (percentage points) of each residue when that head alone is
/// knocked out (`*` where it is needed()); one row per head with the accuracy of that head
/// alone (`+` where it suffices()); then the findings (specialization_findings()).
inline std::string to_markdown(const SpecializationMap& m) {
  std::ostringstream os;
  os << "| head \\ residue |";
  for (std::int64_t r = 0; r < m.modulus; ++r) os << ' ' << r << " |";
  os << "\n|:--|";
  for (std::int64_t r = 0; r < m.modulus; ++r) os << "--:|";
  os << "\n| intact accuracy % |";
  for (const GroupStats& g : m.baseline.groups) os << ' ' << detail::pct(g.accuracy) << " |";
  os << "\n| every head out % |";
  for (const GroupStats& g : m.none.groups) os << ' ' << detail::pct(g.accuracy) << " |";
  os << '\n';
  for (std::int64_t h = 0; h < m.heads; ++h) {
    os << "| drop, head " << h << " out |";
    for (std::int64_t r = 0; r < m.modulus; ++r)
      os << ' ' << detail::pp(m.drop(h, r)) << (m.needed(h, r) ? "*" : "") << " |";
    os << '\n';
  }
  for (std::int64_t h = 0; h < m.heads; ++h) {
    os << "| head " << h << " alone % |";
    for (std::int64_t r = 0; r < m.modulus; ++r)
      os << ' '
         << detail::pct(
                m.alone[static_cast<std::size_t>(h)].groups[static_cast<std::size_t>(r)].accuracy)
         << (m.suffices(h, r) ? "+" : "") << " |";
    os << '\n';
  }
  os << "\n(drops in percentage points; * = the knockout's 95 % Wilson interval lies below the "
        "intact one; + = the head alone lies above every head out)\n\n"
     << specialization_findings(m);
  return os.str();
}

/// CSV with header `head,residue,n,intact,intact_ci_low,intact_ci_high,knocked,knocked_ci_low,
/// knocked_ci_high,drop,alone,alone_ci_low,alone_ci_high,none,needed,suffices,serves`
/// (fractions; the last three 0/1), one row per head and residue.
inline std::string to_csv(const SpecializationMap& m) {
  std::ostringstream os;
  os << "head,residue,n,intact,intact_ci_low,intact_ci_high,knocked,knocked_ci_low,"
        "knocked_ci_high,drop,alone,alone_ci_low,alone_ci_high,none,needed,suffices,serves\n";
  for (std::int64_t h = 0; h < m.heads; ++h)
    for (std::int64_t r = 0; r < m.modulus; ++r) {
      const GroupStats& b = m.baseline.groups[static_cast<std::size_t>(r)];
      const GroupStats& k =
          m.knocked[static_cast<std::size_t>(h)].groups[static_cast<std::size_t>(r)];
      const GroupStats& a =
          m.alone[static_cast<std::size_t>(h)].groups[static_cast<std::size_t>(r)];
      os << h << ',' << r << ',' << b.n << ',' << detail::num(b.accuracy, "") << ','
         << detail::num(b.ci_low, "") << ',' << detail::num(b.ci_high, "") << ','
         << detail::num(k.accuracy, "") << ',' << detail::num(k.ci_low, "") << ','
         << detail::num(k.ci_high, "") << ',' << detail::num(m.drop(h, r), "") << ','
         << detail::num(a.accuracy, "") << ',' << detail::num(a.ci_low, "") << ','
         << detail::num(a.ci_high, "") << ','
         << detail::num(m.none.groups[static_cast<std::size_t>(r)].accuracy, "") << ','
         << (m.needed(h, r) ? 1 : 0) << ',' << (m.suffices(h, r) ? 1 : 0) << ','
         << (m.serves(h, r) ? 1 : 0) << '\n';
    }
  return os.str();
}

/// JSON object `{"heads", "modulus", "intact": <Summary as to_json>, "none": <Summary>,
/// "knockouts": [{"head", "summary": <Summary>, "alone": <Summary>, "drop": [per residue],
/// "serves": [residues]}], "collisions":
/// [{"residue", "heads": [...]}], "unserved": [residues]}` (NaN as null).
inline std::string to_json(const SpecializationMap& m) {
  const auto obj = [](const Summary& s) {
    std::string t = to_json(s);
    while (!t.empty() && t.back() == '\n') t.pop_back();
    return t;
  };
  const auto arr = [](const std::vector<std::int64_t>& v) { return "[" + detail::join(v) + "]"; };
  std::ostringstream os;
  os << "{\"heads\": " << m.heads << ", \"modulus\": " << m.modulus
     << ", \"intact\": " << obj(m.baseline) << ", \"none\": " << obj(m.none)
     << ", \"knockouts\": [";
  for (std::int64_t h = 0; h < m.heads; ++h) {
    os << (h ? ", " : "") << "{\"head\": " << h
       << ", \"summary\": " << obj(m.knocked[static_cast<std::size_t>(h)])
       << ", \"alone\": " << obj(m.alone[static_cast<std::size_t>(h)]) << ", \"drop\": [";
    for (std::int64_t r = 0; r < m.modulus; ++r)
      os << (r ? ", " : "") << detail::num(m.drop(h, r), "null");
    os << "], \"serves\": " << arr(m.served_by(h)) << "}";
  }
  os << "], \"collisions\": [";
  bool first = true;
  std::vector<std::int64_t> unserved;
  for (std::int64_t r = 0; r < m.modulus; ++r) {
    const std::vector<std::int64_t> s = m.servers(r);
    if (s.empty()) unserved.push_back(r);
    if (s.size() < 2) continue;
    os << (first ? "" : ", ") << "{\"residue\": " << r << ", \"heads\": " << arr(s) << "}";
    first = false;
  }
  os << "], \"unserved\": " << arr(unserved) << "}\n";
  return os.str();
}

/// SVG heat map (plain text): heads as rows, residues as columns, each cell coloured by the
/// accuracy drop when that head alone is knocked out (white 0, red +100 pp, blue -100 pp),
/// labelled with the drop in percentage points and outlined where the head serves the residue
/// (solid: needed(), dashed: suffices() only, as in a collision);
/// a row above the map shows the intact accuracy; `title` (XML-escaped) above, a colour legend
/// and the findings below.
inline std::string to_svg(const SpecializationMap& m,
                          const std::string& title = "Phase specialization map") {
  const double cell_w = m.modulus <= 16 ? 56.0 : (m.modulus <= 64 ? 16.0 : 8.0);
  const double cell_h = m.heads <= 16 ? 30.0 : 12.0;
  const bool labels = m.modulus <= 16 && m.heads <= 16;
  const double left = 110, top = 90, right = 30;
  const double pw = cell_w * static_cast<double>(m.modulus);
  const double ph = cell_h * static_cast<double>(m.heads);
  const std::string findings = specialization_findings(m);
  std::int64_t finding_lines = 0;
  for (char c : findings) finding_lines += c == '\n';
  const double w = std::max(520.0, left + pw + right);
  const double h = top + ph + 70 + 16.0 * static_cast<double>(finding_lines);
  // Colour of a drop: white at 0, red towards +1, blue towards -1; grey for NaN.
  const auto colour = [](double d) {
    if (std::isnan(d)) return std::string("#cccccc");
    const double a = std::min(1.0, std::fabs(d));
    const int fade = static_cast<int>(std::lround(255.0 * (1.0 - a)));
    char buf[16];
    if (d >= 0)
      std::snprintf(buf, sizeof buf, "#%02x%02x%02x", 255, fade, fade);
    else
      std::snprintf(buf, sizeof buf, "#%02x%02x%02x", fade, fade, 255);
    return std::string(buf);
  };
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h
     << "\" viewBox=\"0 0 " << w << " " << h << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  os << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  os << "<text x=\"" << w / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"13\">"
     << detail::xml_escape(title) << "</text>\n";
  os << "<text x=\"" << left + pw / 2 << "\" y=\"44\" text-anchor=\"middle\">residue (position mod "
     << m.modulus
     << "); cell: accuracy drop (pp) when the row's head alone is knocked out</text>\n";
  // Intact accuracy above the columns.
  os << "<text x=\"" << left - 8 << "\" y=\"" << top - 12
     << "\" text-anchor=\"end\">intact %</text>\n";
  const std::int64_t label_step = m.modulus <= 32 ? 1 : (m.modulus + 31) / 32;
  for (std::int64_t r = 0; r < m.modulus; ++r) {
    const double x = left + (static_cast<double>(r) + 0.5) * cell_w;
    if (r % label_step == 0) {
      os << "<text x=\"" << x << "\" y=\"" << top + ph + 16 << "\" text-anchor=\"middle\">" << r
         << "</text>\n";
      if (labels)
        os << "<text x=\"" << x << "\" y=\"" << top - 12 << "\" text-anchor=\"middle\">"
           << detail::pct(m.baseline.groups[static_cast<std::size_t>(r)].accuracy) << "</text>\n";
    }
  }
  for (std::int64_t hd = 0; hd < m.heads; ++hd) {
    const double y = top + static_cast<double>(hd) * cell_h;
    os << "<text x=\"" << left - 8 << "\" y=\"" << y + cell_h / 2 + 4
       << "\" text-anchor=\"end\">head " << hd << "</text>\n";
    for (std::int64_t r = 0; r < m.modulus; ++r) {
      const double x = left + static_cast<double>(r) * cell_w;
      const double d = m.drop(hd, r);
      const bool s = m.serves(hd, r), dashed = s && !m.needed(hd, r);
      os << "<rect class=\"cell\" x=\"" << x << "\" y=\"" << y << "\" width=\"" << cell_w
         << "\" height=\"" << cell_h << "\" fill=\"" << colour(d) << "\" stroke=\""
         << (s ? "black" : "#e0e0e0") << "\" stroke-width=\"" << (s ? 2 : 1) << "\""
         << (dashed ? " stroke-dasharray=\"4,3\"" : "") << "><title>head " << hd << ", r=" << r
         << ": drop " << detail::pp(d) << " pp, alone "
         << detail::pct(
                m.alone[static_cast<std::size_t>(hd)].groups[static_cast<std::size_t>(r)].accuracy)
         << " %" << (s ? " (serves)" : "") << "</title></rect>\n";
      if (labels)
        os << "<text x=\"" << x + cell_w / 2 << "\" y=\"" << y + cell_h / 2 + 4
           << "\" text-anchor=\"middle\">" << detail::pp(d) << "</text>\n";
    }
  }
  // Legend: -100 .. +100 pp.
  const double ly = top + ph + 30;
  os << "<text x=\"" << left - 8 << "\" y=\"" << ly + 10 << "\" text-anchor=\"end\">drop</text>\n";
  for (int k = -4; k <= 4; ++k) {
    const double x = left + (k + 4) * 34.0;
    os << "<rect x=\"" << x << "\" y=\"" << ly << "\" width=\"34\" height=\"12\" fill=\""
       << colour(k / 4.0) << "\" stroke=\"#e0e0e0\"/>\n";
    if (k % 2 == 0)
      os << "<text x=\"" << x + 17 << "\" y=\"" << ly + 26 << "\" text-anchor=\"middle\">" << k * 25
         << "</text>\n";
  }
  double fy = ly + 44;
  std::istringstream lines(findings);
  for (std::string line; std::getline(lines, line); fy += 16)
    os << "<text x=\"10\" y=\"" << fy << "\">" << detail::xml_escape(line) << "</text>\n";
  os << "</svg>\n";
  return os.str();
}

}  // namespace eval
PHASEKV_NAMESPACE_END
