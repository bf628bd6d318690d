// phasekv-plan: writes a JSON-lines plan of prompts for a position-matched sweep (the paper's
// protocol): targets grouped by residue mod M, the query at a fixed position, target positions
// with equal mean and variances within 1 % across groups, prefix or in-sequence padding. Each
// line says where fillers, records, the target and the query go; an engine fills in tokens.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "phasekv/eval/plan.hpp"

namespace {

using phasekv_tools::UsageError;

std::string str(std::int64_t v) { return std::to_string(v); }

struct Item {
  std::int64_t residue, target;
};

// One line of the plan.
std::string plan_line(std::int64_t id, const Item& it, std::int64_t modulus, std::int64_t query,
                      std::int64_t record_length, const std::string& padding,
                      phasekv::eval::Padding pad, std::uint64_t seed, const std::string& judge) {
  nlohmann::json j;
  j["id"] = id;
  j["residue"] = it.residue;
  j["modulus"] = modulus;
  j["target"] = it.target;
  j["query_position"] = query;
  j["record_length"] = record_length;
  j["padding"] = padding;
  j["seed"] = seed;
  if (!judge.empty()) j["judge"] = judge;
  nlohmann::json segs = nlohmann::json::array();
  for (const auto& s : phasekv::eval::layout_prompt(it.target, query, record_length, pad)) {
    nlohmann::json e{{"kind", s.kind}, {"start", s.start}, {"length", s.length}};
    if (s.records > 0) {
      e["first_record"] = s.first_record;
      e["records"] = s.records;
    }
    segs.push_back(e);
  }
  j["segments"] = segs;
  return j.dump();
}

}  // namespace

int main(int argc, char** argv) {
  using phasekv_tools::int_range;
  CLI::App app{"phasekv-plan: JSON-lines plan of a position-matched per-residue sweep"};
  std::int64_t modulus = 0, query = 0, count = 0, record_length = 1, origin = 0;
  std::int64_t lo = 0, hi = 0;
  std::uint64_t seed = 0;
  std::string padding = "prefix", output = "-", judge;
  double max_spread = 0.01, max_memory = 0.0;
  const std::int64_t k40 = phasekv::kMaxGeometryExtent;
  int_range<std::int64_t>(
      app.add_option("--modulus,-m", modulus, "Group targets by residue modulo M")->required(), 1,
      std::int64_t{1} << 20);
  int_range<std::int64_t>(
      app.add_option("--query-position,-q", query, "Fixed position of the query token")->required(),
      1, k40);
  int_range<std::int64_t>(
      app.add_option("--count,-n", count, "Targets per residue group (a multiple of M)")
          ->required(),
      1, std::int64_t{1} << 30);
  int_range<std::int64_t>(app.add_option("--record-length,-r", record_length, "Tokens per record"),
                          1, k40);
  int_range<std::int64_t>(
      app.add_option("--min-target", lo, "Lowest allowed target position (default: origin)"), 0,
      k40);
  int_range<std::int64_t>(app.add_option("--max-target", hi,
                                         "Highest allowed target position (default: query - "
                                         "record length)"),
                          0, k40);
  app.add_option("--padding", padding,
                 "prefix: filler at the start; in-sequence: filler "
                 "right before the target record")
      ->check(CLI::IsMember({"prefix", "in-sequence"}));
  app.add_option("--judge", judge,
                 "How a runner decides correct: greedy (the greedy continuation equals the "
                 "answer) or logprob (the answer is the most likely next token); written "
                 "into every line (default: no field, the runner's choice)")
      ->check(CLI::IsMember({"greedy", "logprob"}));
  int_range<std::int64_t>(
      app.add_option("--origin", origin, "Residue of position p is (p - origin) mod M"), 0, k40);
  int_range<std::uint64_t>(
      app.add_option("--seed", seed, "Seed of the line order and of the per-prompt content seeds"),
      0, std::numeric_limits<std::uint64_t>::max());
  phasekv_tools::real_range(app.add_option("--max-variance-spread", max_spread,
                                           "Largest allowed relative difference of target "
                                           "variances"),
                            0.0, 1.0);
  phasekv_tools::file_name(app.add_option("--output,-o", output, "Output file ('-' for stdout)"));
  phasekv_tools::add_max_memory_flag(app, max_memory);
  if (const int rc = phasekv_tools::parse_args(app, argc, argv, "phasekv-plan"); rc >= 0) return rc;

  return phasekv_tools::run_main("phasekv-plan", [&]() -> int {
    // Every flag is at most 2^40, so no sum or product below overflows.
    if (count % modulus != 0)
      throw UsageError("--count = " + str(count) + " must be a multiple of --modulus = " +
                       str(modulus) + " (exact mean matching)");
    if (record_length >= query)
      throw UsageError("--record-length = " + str(record_length) +
                       " leaves no room for a target: the target record must end before "
                       "--query-position = " +
                       str(query));
    if (judge == "logprob" && record_length != 2)
      throw UsageError(
          "--judge logprob needs one-token answers: --record-length 2 (a key and "
          "its value), not --record-length = " +
          str(record_length));
    if (!app.count("--min-target")) lo = origin;
    if (!app.count("--max-target")) hi = query - record_length;
    if (lo < origin)
      throw UsageError("--min-target = " + str(lo) + " is below --origin = " + str(origin));
    if (hi + record_length > query)
      throw UsageError("--max-target = " + str(hi) + " is invalid: the target record (" +
                       "--record-length = " + str(record_length) +
                       ") must end before --query-position = " + str(query) +
                       ", so --max-target must be at most " + str(query - record_length));
    {
      // As phasekv::eval::plan_targets: blocks origin + M a with a whole block of margin on
      // each side inside [lo, hi]; at least two of them.
      const std::int64_t a_min = (lo - origin + 2 * modulus - 1) / modulus;
      const std::int64_t a_max_num = hi - origin - modulus + 1;
      const std::int64_t a_max = a_max_num >= 0 ? a_max_num / modulus : -1;
      if (a_max < a_min + 1)
        throw UsageError("the target range [" + str(lo) + ", " + str(hi) +
                         "] (--min-target to --max-target) is too short for --modulus = " +
                         str(modulus) + ": it must hold two blocks of " + str(modulus) +
                         " positions starting at --origin + k * " + str(modulus) +
                         ", with a block of margin on each side (at least 3 * " + str(modulus) +
                         " = " + str(3 * modulus) + " positions)");
    }
    const double items_n = static_cast<double>(modulus) * static_cast<double>(count);
    phasekv_tools::check_memory(
        {{"targets of --modulus " + str(modulus) + " x --count " + str(count),
          items_n * (sizeof(Item) + sizeof(std::int64_t))},
         {"the program", 16.0 * 1024 * 1024}},
        max_memory);

    const phasekv::eval::Padding pad =
        padding == "prefix" ? phasekv::eval::Padding::prefix : phasekv::eval::Padding::in_sequence;
    phasekv_tools::OutputFiles files;
    std::ostream* out = &std::cout;
    if (output != "-") {
      out = &files.add("--output", output);
      // Refuse a plan the file system cannot hold: every line is about as long as the one
      // with the largest numbers (the last id, the largest target).
      const Item widest{modulus - 1, hi};
      const double line = static_cast<double>(
          plan_line(modulus * count - 1, widest, modulus, query, record_length, padding, pad,
                    std::numeric_limits<std::uint64_t>::max(), judge)
              .size() +
          1);
      const double need = line * items_n, avail = files.free_space(output);
      if (need > avail)
        throw UsageError("--output '" + output + "' would take about " +
                         phasekv_tools::format_bytes(need) + " (--modulus " + str(modulus) +
                         " x --count " + str(count) + " lines), more than the " +
                         phasekv_tools::format_bytes(avail) + " free on its file system");
    }
    const phasekv::eval::TargetPlan plan = phasekv::eval::plan_targets(
        modulus, count, lo, hi, origin, std::numeric_limits<double>::infinity());
    if (!(plan.variance_spread() <= max_spread))
      throw UsageError("the target variances differ by " +
                       phasekv_tools::format_real(std::round(1e4 * plan.variance_spread()) / 1e2) +
                       " % across residue groups, more than --max-variance-spread = " +
                       phasekv_tools::format_real(max_spread) +
                       "; use a larger --count or a wider range "
                       "--min-target to --max-target (now [" +
                       str(lo) + ", " + str(hi) + "])");
    std::vector<Item> items;
    items.reserve(static_cast<std::size_t>(modulus * count));
    for (std::int64_t r = 0; r < modulus; ++r)
      for (std::int64_t p : plan.positions[static_cast<std::size_t>(r)]) items.push_back({r, p});
    std::mt19937_64 rng(seed);
    std::shuffle(items.begin(), items.end(), rng);

    std::int64_t id = 0;
    for (const Item& it : items) {
      *out << plan_line(id, it, modulus, query, record_length, padding, pad, rng(), judge) << '\n';
      ++id;
    }
    if (output != "-") {
      files.commit();
    } else {
      out->flush();
      if (!*out) throw std::runtime_error("cannot write the plan to stdout");
    }
    std::fprintf(stderr,
                 "phasekv-plan: %lld prompts, %lld per residue mod %lld, targets in [%lld, %lld], "
                 "mean %.3f in every group, variance spread %.4f %%\n",
                 static_cast<long long>(items.size()), static_cast<long long>(count),
                 static_cast<long long>(modulus), static_cast<long long>(lo),
                 static_cast<long long>(hi), plan.mean[0], 100.0 * plan.variance_spread());
    return 0;
  });
}
