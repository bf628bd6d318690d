/// @file
/// @brief Per-residue reports of a Summary: Markdown table, CSV, JSON, an SVG plot of accuracy
/// vs residue with the Wilson intervals, and a compact terminal bar chart. Plain text written
/// by the header; no dependency.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "phasekv/core/config.hpp"
#include "phasekv/eval/stats.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace eval {

namespace detail {

// A fraction as a percentage with one decimal ("52.6"; "+52.6" with `sign`), or "n/a".
inline std::string percent_text(double x, bool sign) {
  if (std::isnan(x)) return "n/a";
  char buf[32];
  if (sign)
    std::snprintf(buf, sizeof buf, "%+.1f", 100.0 * x);
  else
    std::snprintf(buf, sizeof buf, "%.1f", 100.0 * x);
  return buf;
}

// Fixed-point text of a fraction as a percentage with one decimal ("52.6"), or "n/a".
inline std::string pct(double x) { return percent_text(x, false); }

// Shortest round-trip text of a double for CSV/JSON; "null" (JSON) or "" (CSV) for NaN.
inline std::string num(double x, const char* nan_text) {
  if (std::isnan(x) || std::isinf(x)) return nan_text;
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  // Prefer a shorter form when it round-trips.
  for (int prec = 6; prec < 17; ++prec) {
    char s[40];
    std::snprintf(s, sizeof s, "%.*g", prec, x);
    if (std::strtod(s, nullptr) == x) return s;
  }
  return buf;
}

inline std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

inline std::string p_text(double p) {
  char buf[32];
  if (p < 1e-4)
    std::snprintf(buf, sizeof buf, "%.2e", p);
  else
    std::snprintf(buf, sizeof buf, "%.4f", p);
  return buf;
}

}  // namespace detail

/// One line with the summary: mean, worst and best (with residues), gap, homogeneity p-value
/// and period, e.g. `mean 52.6 % | worst 29.7 % (r=3) | best 69.9 % (r=0) | gap 40.2 pp |
/// homogeneity p = 1.2e-30 | period 4`.
inline std::string summary_line(const Summary& s) {
  std::ostringstream os;
  os << "mean " << detail::pct(s.mean) << " % | worst " << detail::pct(s.worst)
     << " % (r=" << s.worst_residue << ") | best " << detail::pct(s.best)
     << " % (r=" << s.best_residue << ") | gap "
     << (std::isnan(s.gap_pp) ? std::string("n/a") : detail::pct(s.gap_pp / 100.0))
     << " pp | homogeneity p = " << detail::p_text(s.homogeneity_p) << " | period " << s.period;
  if (s.empty_groups > 0) os << " | " << s.empty_groups << " residue(s) without data";
  return os.str();
}

/// Markdown table (residue, n, correct, accuracy %, Wilson 95 % interval %) followed by the
/// summary line.
inline std::string to_markdown(const Summary& s) {
  std::ostringstream os;
  os << "| residue | n | correct | accuracy % | 95 % CI |\n";
  os << "|--------:|--:|--------:|-----------:|:--------|\n";
  for (const GroupStats& g : s.groups)
    os << "| " << g.residue << " | " << g.n << " | " << g.correct << " | "
       << detail::pct(g.accuracy) << " | [" << detail::pct(g.ci_low) << ", "
       << detail::pct(g.ci_high) << "] |\n";
  os << "\n" << summary_line(s) << " (modulus " << s.modulus << ")\n";
  return os.str();
}

/// CSV with header `residue,n,correct,accuracy,ci_low,ci_high` (fractions; accuracy empty for
/// a residue without data).
inline std::string to_csv(const Summary& s) {
  std::ostringstream os;
  os << "residue,n,correct,accuracy,ci_low,ci_high\n";
  for (const GroupStats& g : s.groups)
    os << g.residue << ',' << g.n << ',' << g.correct << ',' << detail::num(g.accuracy, "") << ','
       << detail::num(g.ci_low, "") << ',' << detail::num(g.ci_high, "") << '\n';
  return os.str();
}

/// JSON object with the fixed schema `{"modulus", "groups": [{"residue","n","correct",
/// "accuracy","ci_low","ci_high"}], "mean","worst","worst_residue","best","best_residue",
/// "gap_pp","homogeneity_p","period"}` (accuracies as fractions; NaN written as null).
inline std::string to_json(const Summary& s) {
  std::ostringstream os;
  os << "{\"modulus\": " << s.modulus << ", \"groups\": [";
  for (std::size_t i = 0; i < s.groups.size(); ++i) {
    const GroupStats& g = s.groups[i];
    os << (i ? ", " : "") << "{\"residue\": " << g.residue << ", \"n\": " << g.n
       << ", \"correct\": " << g.correct << ", \"accuracy\": " << detail::num(g.accuracy, "null")
       << ", \"ci_low\": " << detail::num(g.ci_low, "null")
       << ", \"ci_high\": " << detail::num(g.ci_high, "null") << "}";
  }
  os << "], \"mean\": " << detail::num(s.mean, "null")
     << ", \"worst\": " << detail::num(s.worst, "null")
     << ", \"worst_residue\": " << s.worst_residue << ", \"best\": " << detail::num(s.best, "null")
     << ", \"best_residue\": " << s.best_residue
     << ", \"gap_pp\": " << detail::num(s.gap_pp, "null")
     << ", \"homogeneity_p\": " << detail::num(s.homogeneity_p, "null")
     << ", \"period\": " << s.period << "}\n";
  return os.str();
}

/// Compact terminal bar chart: one line per residue with a bar of `width` characters
/// proportional to the accuracy, the accuracy and its interval; the worst residue is marked.
inline std::string to_bars(const Summary& s, int width = 40) {
  std::ostringstream os;
  for (const GroupStats& g : s.groups) {
    const double a = std::isnan(g.accuracy) ? 0.0 : g.accuracy;
    const int full = static_cast<int>(std::lround(a * width));
    char head[32];
    std::snprintf(head, sizeof head, "r=%3lld |", static_cast<long long>(g.residue));
    os << head << std::string(static_cast<std::size_t>(full), '#')
       << std::string(static_cast<std::size_t>(width - full), ' ') << "| "
       << detail::pct(g.accuracy) << " % [" << detail::pct(g.ci_low) << ", "
       << detail::pct(g.ci_high) << "]" << (g.residue == s.worst_residue ? "  <- worst" : "")
       << '\n';
  }
  return os.str();
}

/// SVG plot (plain text) of accuracy vs residue: one point per residue with its Wilson 95 %
/// interval as an error bar, the unweighted mean as a dashed line, axes in percent, and
/// `title` (XML-escaped) above the plot with the summary line below it.
inline std::string to_svg(const Summary& s, const std::string& title = "Accuracy by residue") {
  const double w = 860, h = 420, left = 60, right = 20, top = 50, bottom = 70;
  const double pw = w - left - right, ph = h - top - bottom;
  const double m = static_cast<double>(s.modulus);
  auto xr = [&](double r) { return left + (r + 0.5) * pw / m; };
  auto ya = [&](double a) { return top + (1.0 - a) * ph; };
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h
     << "\" viewBox=\"0 0 " << w << " " << h << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  os << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  os << "<text x=\"" << w / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"13\">"
     << detail::xml_escape(title) << "</text>\n";
  for (int k = 0; k <= 10; ++k) {
    const double y = ya(k / 10.0);
    os << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << left + pw << "\" y2=\"" << y
       << "\" stroke=\"#e0e0e0\"/>\n";
    os << "<text x=\"" << left - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << k * 10
       << "</text>\n";
  }
  os << "<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\"" << top + ph
     << "\" stroke=\"black\"/>\n";
  os << "<line x1=\"" << left << "\" y1=\"" << top + ph << "\" x2=\"" << left + pw << "\" y2=\""
     << top + ph << "\" stroke=\"black\"/>\n";
  os << "<text x=\"16\" y=\"" << top + ph / 2 << "\" transform=\"rotate(-90 16 " << top + ph / 2
     << ")\" text-anchor=\"middle\">accuracy (%)</text>\n";
  os << "<text x=\"" << left + pw / 2 << "\" y=\"" << top + ph + 34
     << "\" text-anchor=\"middle\">residue (position mod " << s.modulus << ")</text>\n";
  const std::int64_t label_step = s.modulus <= 32 ? 1 : (s.modulus + 31) / 32;
  for (const GroupStats& g : s.groups) {
    const double x = xr(static_cast<double>(g.residue));
    if (g.residue % label_step == 0)
      os << "<text x=\"" << x << "\" y=\"" << top + ph + 16 << "\" text-anchor=\"middle\">"
         << g.residue << "</text>\n";
    if (std::isnan(g.accuracy)) continue;
    os << "<line class=\"ci\" x1=\"" << x << "\" y1=\"" << ya(g.ci_low) << "\" x2=\"" << x
       << "\" y2=\"" << ya(g.ci_high) << "\" stroke=\"#1f77b4\" stroke-width=\"1.5\"/>\n";
    os << "<line x1=\"" << x - 4 << "\" y1=\"" << ya(g.ci_low) << "\" x2=\"" << x + 4 << "\" y2=\""
       << ya(g.ci_low) << "\" stroke=\"#1f77b4\"/>\n";
    os << "<line x1=\"" << x - 4 << "\" y1=\"" << ya(g.ci_high) << "\" x2=\"" << x + 4 << "\" y2=\""
       << ya(g.ci_high) << "\" stroke=\"#1f77b4\"/>\n";
    os << "<circle class=\"point\" cx=\"" << x << "\" cy=\"" << ya(g.accuracy)
       << "\" r=\"4\" fill=\"" << (g.residue == s.worst_residue ? "#d62728" : "#1f77b4")
       << "\"><title>r=" << g.residue << ": " << detail::pct(g.accuracy) << " % ["
       << detail::pct(g.ci_low) << ", " << detail::pct(g.ci_high) << "], n=" << g.n
       << "</title></circle>\n";
  }
  if (!std::isnan(s.mean))
    os << "<line x1=\"" << left << "\" y1=\"" << ya(s.mean) << "\" x2=\"" << left + pw << "\" y2=\""
       << ya(s.mean) << "\" stroke=\"#888\" stroke-dasharray=\"5,4\"/>\n";
  os << "<text x=\"" << w / 2 << "\" y=\"" << h - 10 << "\" text-anchor=\"middle\">"
     << detail::xml_escape(summary_line(s)) << "</text>\n";
  os << "</svg>\n";
  return os.str();
}

}  // namespace eval
PHASEKV_NAMESPACE_END
