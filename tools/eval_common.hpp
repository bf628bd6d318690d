// Shared pieces of the evaluation tools (phasekv-report, phasekv-sweep): the report output
// flags and writing report files. Internal to tools/, not part of the installed headers.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

#include "phasekv/eval/report.hpp"

namespace phasekv_tools {

// Where the report goes besides stdout.
struct ReportOutputs {
  std::string json;       // --json FILE
  std::string csv;        // --csv FILE
  std::string plot;       // --plot FILE (SVG)
  std::string markdown;   // --markdown FILE
  std::string title;      // --title (plot title)
  double alpha = phasekv::eval::kDefaultPeriodAlpha;  // --alpha (period detection)
  bool bars = false;      // --bars: also print a bar chart
};

inline void add_report_flags(CLI::App& app, ReportOutputs& o) {
  app.add_option("--json", o.json, "Write the summary as JSON to FILE");
  app.add_option("--csv", o.csv, "Write the per-residue table as CSV to FILE");
  app.add_option("--plot", o.plot, "Write an SVG plot of accuracy vs residue to FILE");
  app.add_option("--markdown", o.markdown, "Write the Markdown table to FILE");
  app.add_option("--title", o.title, "Title of the plot");
  app.add_option("--alpha", o.alpha,
                 "Significance level of period detection (Bonferroni over classes)")
      ->check(CLI::Range(1e-12, 0.5));
  app.add_flag("--bars", o.bars, "Also print a per-residue bar chart");
}

inline void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open '" + path + "' for writing");
  f << text;
  f.close();
  if (!f) throw std::runtime_error("cannot write '" + path + "'");
}

// Prints the table (or only the summary line when `quiet`) and the bars to stdout and writes
// the requested files.
inline void emit_report(const phasekv::eval::Summary& s, const ReportOutputs& o,
                        const std::string& default_title, bool quiet = false) {
  if (quiet)
    std::printf("%s\n", phasekv::eval::summary_line(s).c_str());
  else
    std::fputs(phasekv::eval::to_markdown(s).c_str(), stdout);
  if (o.bars) {
    std::fputs("\n", stdout);
    std::fputs(phasekv::eval::to_bars(s).c_str(), stdout);
  }
  const std::string title = o.title.empty() ? default_title : o.title;
  if (!o.json.empty()) write_text_file(o.json, phasekv::eval::to_json(s));
  if (!o.csv.empty()) write_text_file(o.csv, phasekv::eval::to_csv(s));
  if (!o.plot.empty()) write_text_file(o.plot, phasekv::eval::to_svg(s, title));
  if (!o.markdown.empty())
    write_text_file(o.markdown, "# " + title + "\n\n" + phasekv::eval::to_markdown(s));
}

}  // namespace phasekv_tools
