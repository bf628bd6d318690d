// Shared pieces of the evaluation tools (phasekv-report, phasekv-sweep): the report output
// flags and writing report files. Internal to tools/, not part of the installed headers.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "cli_common.hpp"
#include "phasekv/eval/report.hpp"

namespace phasekv_tools {

// Where the report goes besides stdout.
struct ReportOutputs {
  std::string json;                                   // --json FILE
  std::string csv;                                    // --csv FILE
  std::string plot;                                   // --plot FILE (SVG)
  std::string markdown;                               // --markdown FILE
  std::string title;                                  // --title (plot title)
  double alpha = phasekv::eval::kDefaultPeriodAlpha;  // --alpha (period detection)
  bool bars = false;                                  // --bars: also print a bar chart
};

inline void add_report_flags(CLI::App& app, ReportOutputs& o) {
  file_name(app.add_option("--json", o.json, "Write the summary as JSON to FILE"));
  file_name(app.add_option("--csv", o.csv, "Write the per-residue table as CSV to FILE"));
  file_name(app.add_option("--plot", o.plot, "Write an SVG plot of accuracy vs residue to FILE"));
  file_name(app.add_option("--markdown", o.markdown, "Write the Markdown table to FILE"));
  app.add_option("--title", o.title, "Title of the plot");
  real_range(app.add_option("--alpha", o.alpha,
                            "Significance level of period detection (Bonferroni over classes)"),
             1e-12, 0.5);
  app.add_flag("--bars", o.bars, "Also print a per-residue bar chart");
}

// Memory the report of `modulus` residues takes (summary, tables, plot): about 512 bytes per
// residue (measured: 270 bytes per residue for --modulus 1048576 with every output).
inline MemoryItem report_memory(std::int64_t modulus) {
  return {"the report of --modulus " + std::to_string(modulus) + " residues",
          512.0 * static_cast<double>(modulus)};
}

// The report files given on the command line, created (as temporary files) before the run.
struct ReportFiles {
  std::ostream *json = nullptr, *csv = nullptr, *plot = nullptr, *markdown = nullptr;
};

inline ReportFiles open_report_files(OutputFiles& files, const ReportOutputs& o) {
  ReportFiles r;
  if (!o.json.empty()) r.json = &files.add("--json", o.json);
  if (!o.csv.empty()) r.csv = &files.add("--csv", o.csv);
  if (!o.plot.empty()) r.plot = &files.add("--plot", o.plot);
  if (!o.markdown.empty()) r.markdown = &files.add("--markdown", o.markdown);
  return r;
}

// Writes the requested files (renamed into place only when all of them were written), then
// prints `header`, the table (or only the summary line when `quiet`) and the bars to stdout.
inline void emit_report(const phasekv::eval::Summary& s, const ReportOutputs& o,
                        const ReportFiles& r, OutputFiles& files, const std::string& default_title,
                        const std::string& header, bool quiet = false) {
  const std::string title = o.title.empty() ? default_title : o.title;
  if (r.json) *r.json << phasekv::eval::to_json(s);
  if (r.csv) *r.csv << phasekv::eval::to_csv(s);
  if (r.plot) *r.plot << phasekv::eval::to_svg(s, title);
  if (r.markdown) *r.markdown << "# " + title + "\n\n" + phasekv::eval::to_markdown(s);
  files.commit();
  std::fputs(header.c_str(), stdout);
  if (quiet)
    std::printf("%s\n", phasekv::eval::summary_line(s).c_str());
  else
    std::fputs(phasekv::eval::to_markdown(s).c_str(), stdout);
  if (o.bars) {
    std::fputs("\n", stdout);
    std::fputs(phasekv::eval::to_bars(s).c_str(), stdout);
  }
}

}  // namespace phasekv_tools
