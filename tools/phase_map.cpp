// phasekv-phase-map: prints, for a chunk geometry, which windows cover each position (with
// phase and offset), and what a decode query at a given position sees; with --origins (one
// origin per KV head, staggered windows), the phase of every position per head and what each
// head's query sees.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "phasekv/phasekv.hpp"

namespace {

void print_map(const phasekv::Geometry& g, std::int64_t positions) {
  std::printf("\n  pos  phase  covering windows (j:offset)\n");
  std::printf("  ---  -----  ---------------------------\n");
  for (std::int64_t p = 0; p < positions; ++p) {
    std::string cov;
    if (g.in_prefix(p)) {
      cov = "prefix (kept raw)";
    } else if (g.cover_count(p) == 0) {
      cov = "gap (no window)";
    } else {
      for (std::int64_t j = g.first_covering_window(p); j <= g.last_covering_window(p); ++j) {
        if (!cov.empty()) cov += "  ";
        cov += "j" + std::to_string(j) + ":" + std::to_string(g.offset(p, j));
      }
    }
    const std::string phase = g.in_prefix(p) ? "-" : std::to_string(g.phase(p));
    std::printf("  %3lld  %5s  %s\n", static_cast<long long>(p), phase.c_str(), cov.c_str());
  }
}

void print_query(const phasekv::Geometry& g, std::int64_t local, std::int64_t t) {
  const std::int64_t n = t + 1;
  const phasekv::Visibility v = g.visible(n, local);
  std::printf("\nA query at position %lld (n = %lld tokens seen) attends to:\n",
              static_cast<long long>(t), static_cast<long long>(n));
  if (v.prefix_end > 0)
    std::printf("  prefix              positions [0, %lld)            %lld raw tokens\n",
                static_cast<long long>(v.prefix_end), static_cast<long long>(v.prefix_end));
  else
    std::printf("  prefix              none\n");
  if (v.entries > 0)
    std::printf("  compressed entries  j in [0, %lld), covering [%lld, %lld)  %lld entries\n",
                static_cast<long long>(v.entries), static_cast<long long>(g.window_begin(0)),
                static_cast<long long>(g.window_end(v.entries - 1)),
                static_cast<long long>(v.entries));
  else
    std::printf("  compressed entries  none (no window complete yet)\n");
  if (v.raw_count() > 0)
    std::printf("  raw range           positions [%lld, %lld]          %lld raw tokens\n",
                static_cast<long long>(v.raw_begin), static_cast<long long>(t),
                static_cast<long long>(v.raw_count()));
  else
    std::printf("  raw range           none\n");
  std::printf("  raw tail begins at %lld; total %lld items vs %lld for an uncompressed cache\n",
              static_cast<long long>(g.raw_tail_begin(n)), static_cast<long long>(v.total()),
              static_cast<long long>(n));
}

// Per-head origins: one row per KV head, one column per position (its phase under that head's
// origin, '-' in the head's raw prefix, '.' in a gap no window holds).
void print_head_map(const phasekv::Geometry& sg, const std::vector<std::int64_t>& origins,
                    std::int64_t positions) {
  const auto digits = [](std::int64_t x) {
    return static_cast<std::int64_t>(std::to_string(x).size());
  };
  const std::int64_t last = positions > 0 ? positions - 1 : 0;
  const std::int64_t width =
      1 + (digits(sg.stride() - 1) > digits(last) ? digits(sg.stride() - 1) : digits(last));
  const auto cell = [&](const std::string& text) {
    return std::string(static_cast<std::size_t>(width) - text.size(), ' ') + text;
  };
  std::printf("\n  phase of each position per KV head ('-' raw prefix, '.' gap: no window)\n");
  std::string axis;
  for (std::int64_t p = 0; p < positions; ++p) axis += cell(std::to_string(p));
  std::printf("  position        %s\n", axis.c_str());
  for (std::size_t h = 0; h < origins.size(); ++h) {
    const phasekv::Geometry g(sg.window(), sg.stride(), origins[h]);
    std::string row;
    for (std::int64_t p = 0; p < positions; ++p)
      row += cell(g.in_prefix(p) ? "-" : g.cover_count(p) == 0 ? "." : std::to_string(g.phase(p)));
    std::printf("  head %3lld O=%-5lld%s\n", static_cast<long long>(h),
                static_cast<long long>(g.origin()), row.c_str());
  }
}

// What the query at position t sees, per head.
void print_head_query(const phasekv::Geometry& sg, const std::vector<std::int64_t>& origins,
                      std::int64_t local, std::int64_t t) {
  const std::int64_t n = t + 1;
  std::printf("\nA query at position %lld (n = %lld tokens seen) attends to, per KV head:\n",
              static_cast<long long>(t), static_cast<long long>(n));
  std::printf("  head      O  prefix        entries  covering        raw range        items\n");
  for (std::size_t h = 0; h < origins.size(); ++h) {
    const phasekv::Geometry g(sg.window(), sg.stride(), origins[h]);
    const phasekv::Visibility v = g.visible(n, local);
    const std::string pre = v.prefix_end > 0 ? "[0, " + std::to_string(v.prefix_end) + ")" : "none";
    const std::string cov = v.entries > 0 ? "[" + std::to_string(g.window_begin(0)) + ", " +
                                                std::to_string(g.window_end(v.entries - 1)) + ")"
                                          : "none";
    const std::string raw = v.raw_count() > 0
                                ? "[" + std::to_string(v.raw_begin) + ", " + std::to_string(t) + "]"
                                : "none";
    std::printf("  %4lld %6lld  %-12s  %7lld  %-14s  %-15s  %5lld\n", static_cast<long long>(h),
                static_cast<long long>(g.origin()), pre.c_str(), static_cast<long long>(v.entries),
                cov.c_str(), raw.c_str(), static_cast<long long>(v.total()));
  }
  std::printf("  (an uncompressed cache holds %lld tokens per head)\n", static_cast<long long>(n));
}

// Most (position, window) pairs the map lists: 16M pairs is about 200 MB of text, and the
// longest line holds at most --positions pairs (the map's memory stays below 40 MB).
constexpr std::int64_t kMaxPairs = std::int64_t{1} << 24;

// Pairs the map of `positions` positions lists (stops counting past kMaxPairs).
std::int64_t map_pairs(const phasekv::Geometry& g, std::int64_t positions) {
  std::int64_t pairs = 0;
  for (std::int64_t p = 0; p < positions && pairs <= kMaxPairs; ++p)
    pairs += g.in_prefix(p) ? 1 : (g.cover_count(p) > 0 ? g.cover_count(p) : 1);
  return pairs;
}

}  // namespace

int main(int argc, char** argv) {
  using phasekv_tools::int_range;
  CLI::App app{
      "phasekv-phase-map: windows, phases and query visibility of a chunk geometry.\n"
      "Default: DeepSeek-V4 compressed sparse attention (W=8, S=4, L=128)."};
  std::int64_t window = 8, stride = 4, origin = 0, local = 128, positions = 24, query = 0;
  std::vector<std::int64_t> origins;
  const std::int64_t k40 = phasekv::kMaxGeometryExtent;
  int_range<std::int64_t>(
      app.add_option("-W,--window", window, "window length W (tokens per entry)")
          ->capture_default_str(),
      1, k40);
  int_range<std::int64_t>(app.add_option("-S,--stride", stride, "stride S between window starts")
                              ->capture_default_str(),
                          1, k40);
  int_range<std::int64_t>(
      app.add_option("-O,--origin", origin, "origin O (positions below it are the raw prefix)")
          ->capture_default_str(),
      0, k40);
  int_range<std::int64_t>(
      app.add_option("--origins", origins,
                     "per-KV-head origins O0,O1,... (staggered windows: head h's windows start "
                     "at O_h + j*S); prints one row per head instead of --origin's map")
          ->delimiter(','),
      0, k40);
  int_range<std::int64_t>(
      app.add_option("-L,--local", local, "local window L (recent raw tokens kept visible)")
          ->capture_default_str(),
      0, k40);
  int_range<std::int64_t>(app.add_option("-p,--positions", positions, "how many positions to map")
                              ->capture_default_str(),
                          0, std::int64_t{1} << 20);
  int_range<std::int64_t>(app.add_option("-q,--query", query,
                                         "query position to explain (default: O + 2L + W + S - 1)"),
                          0, phasekv::kMaxLength - 1);
  if (const int rc = phasekv_tools::parse_args(app, argc, argv, "phasekv-phase-map"); rc >= 0)
    return rc;
  return phasekv_tools::run_main("phasekv-phase-map", [&]() -> int {
    if (!origins.empty()) {
      if (app.count("--origin"))
        throw phasekv_tools::UsageError(
            "--origin and --origins exclude each other (--origins gives every head's origin)");
      const std::int64_t heads = static_cast<std::int64_t>(origins.size());
      if (heads > 1024)
        throw phasekv_tools::UsageError("--origins lists " + std::to_string(heads) +
                                        " heads; at most 1024");
      if (heads * positions > kMaxPairs)
        throw phasekv_tools::UsageError("the map of --positions " + std::to_string(positions) +
                                        " for " + std::to_string(heads) +
                                        " heads lists more than " + std::to_string(kMaxPairs) +
                                        " cells; lower --positions");
      const phasekv::Geometry sg(window, stride);
      phasekv::check_origins("phasekv-phase-map", origins, heads);
      std::int64_t omax = 0;
      for (std::int64_t o : origins) omax = o > omax ? o : omax;
      if (!app.count("--query")) query = omax + 2 * local + window + stride - 1;
      std::printf("phasekv phase map: W=%lld S=%lld L=%lld, %lld KV heads with origins",
                  static_cast<long long>(window), static_cast<long long>(stride),
                  static_cast<long long>(local), static_cast<long long>(heads));
      for (std::int64_t o : origins) std::printf(" %lld", static_cast<long long>(o));
      std::printf(
          "\nphase(p) of head h = (p - O_h) mod S; head h's window j covers "
          "[O_h + j*S, O_h + j*S + W)\n");
      print_head_map(sg, origins, positions);
      print_head_query(sg, origins, local, query);
      std::fflush(stdout);
      if (std::ferror(stdout)) throw std::runtime_error("cannot write to stdout");
      return 0;
    }
    const phasekv::Geometry g(window, stride, origin);
    if (!app.count("--query")) query = origin + 2 * local + window + stride - 1;
    const std::int64_t pairs = map_pairs(g, positions);
    if (pairs > kMaxPairs)
      throw phasekv_tools::UsageError(
          "the map of --positions " + std::to_string(positions) + " with --window " +
          std::to_string(window) + " and --stride " + std::to_string(stride) + " lists more than " +
          std::to_string(kMaxPairs) +
          " (position, window) pairs; lower --positions or --window, or raise --stride");
    const char* kind = g.has_gaps()   ? "gaps (W < S)"
                       : g.overlaps() ? "overlapping (W > S)"
                                      : "tiling (W = S)";
    std::printf("phasekv phase map: W=%lld S=%lld O=%lld L=%lld, %s\n",
                static_cast<long long>(window), static_cast<long long>(stride),
                static_cast<long long>(origin), static_cast<long long>(local), kind);
    std::printf("phase(p) = (p - O) mod S; each window j covers [O + j*S, O + j*S + W)\n");
    print_map(g, positions);
    print_query(g, local, query);
    std::fflush(stdout);
    if (std::ferror(stdout)) throw std::runtime_error("cannot write to stdout");
    return 0;
  });
}
