// phasekv-plan: writes a JSON-lines plan of prompts for a position-matched sweep (the paper's
// protocol): targets grouped by residue mod M, the query at a fixed position, target positions
// with equal mean and variances within 1 % across groups, prefix or in-sequence padding. Each
// line says where fillers, records, the target and the query go; an engine fills in tokens.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "phasekv/eval/plan.hpp"

int main(int argc, char** argv) {
  CLI::App app{"phasekv-plan: JSON-lines plan of a position-matched per-residue sweep"};
  std::int64_t modulus = 0, query = 0, count = 0, record_length = 1, origin = 0;
  std::int64_t lo = -1, hi = -1;
  std::uint64_t seed = 0;
  std::string padding = "prefix", output = "-";
  double max_spread = 0.01;
  app.add_option("--modulus,-m", modulus, "Group targets by residue modulo M")
      ->required()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--query-position,-q", query, "Fixed position of the query token")
      ->required()
      ->check(CLI::PositiveNumber);
  app.add_option("--count,-n", count, "Targets per residue group (a multiple of M)")->required();
  app.add_option("--record-length,-r", record_length, "Tokens per record")
      ->check(CLI::PositiveNumber);
  app.add_option("--min-target", lo, "Lowest allowed target position (default: origin)");
  app.add_option("--max-target", hi,
                 "Highest allowed target position (default: query - record length)");
  app.add_option("--padding", padding, "prefix: filler at the start; in-sequence: filler "
                                       "right before the target record")
      ->check(CLI::IsMember({"prefix", "in-sequence"}));
  app.add_option("--origin", origin, "Residue of position p is (p - origin) mod M")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", seed, "Seed of the line order and of the per-prompt content seeds");
  app.add_option("--max-variance-spread", max_spread,
                 "Largest allowed relative difference of target variances")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--output,-o", output, "Output file ('-' for stdout)");
  CLI11_PARSE(app, argc, argv);

  try {
    if (lo < 0) lo = origin;
    if (hi < 0) hi = query - record_length;
    if (hi + record_length > query) {
      std::fprintf(stderr,
                   "phasekv-plan: --max-target = %lld is invalid (the target record must end "
                   "before --query-position %lld)\n",
                   static_cast<long long>(hi), static_cast<long long>(query));
      return 1;
    }
    const phasekv::eval::TargetPlan plan =
        phasekv::eval::plan_targets(modulus, count, lo, hi, origin, max_spread);
    const phasekv::eval::Padding pad = padding == "prefix" ? phasekv::eval::Padding::prefix
                                                           : phasekv::eval::Padding::in_sequence;
    struct Item {
      std::int64_t residue, target;
    };
    std::vector<Item> items;
    for (std::int64_t r = 0; r < modulus; ++r)
      for (std::int64_t p : plan.positions[static_cast<std::size_t>(r)]) items.push_back({r, p});
    std::mt19937_64 rng(seed);
    std::shuffle(items.begin(), items.end(), rng);

    std::ofstream file;
    std::ostream* out = &std::cout;
    if (output != "-") {
      file.open(output);
      if (!file) {
        std::fprintf(stderr, "phasekv-plan: cannot open --output '%s'\n", output.c_str());
        return 1;
      }
      out = &file;
    }
    std::int64_t id = 0;
    for (const Item& it : items) {
      nlohmann::json j;
      j["id"] = id++;
      j["residue"] = it.residue;
      j["modulus"] = modulus;
      j["target"] = it.target;
      j["query_position"] = query;
      j["record_length"] = record_length;
      j["padding"] = padding;
      j["seed"] = rng();
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
      *out << j.dump() << '\n';
    }
    out->flush();
    if (!*out) {
      std::fprintf(stderr, "phasekv-plan: write failed\n");
      return 1;
    }
    std::fprintf(stderr,
                 "phasekv-plan: %lld prompts, %lld per residue mod %lld, targets in [%lld, %lld], "
                 "mean %.3f in every group, variance spread %.4f %%\n",
                 static_cast<long long>(items.size()), static_cast<long long>(count),
                 static_cast<long long>(modulus), static_cast<long long>(lo),
                 static_cast<long long>(hi), plan.mean[0], 100.0 * plan.variance_spread());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "phasekv-plan: %s\n", e.what());
    return 1;
  }
  return 0;
}
