// The evaluation side (phasekv/eval/): per-residue tallies, Wilson intervals, homogeneity,
// period, the summary and its reports, and the position-matched sweep plan.
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "phasekv/eval/plan.hpp"
#include "phasekv/eval/report.hpp"
#include "phasekv/eval/stats.hpp"

namespace phasekv_py {

namespace {

namespace ev = phasekv::eval;

// Per-residue counts from two equal-length lists.
std::vector<ev::Count> counts(const char* fn, const std::vector<std::int64_t>& correct,
                              const std::vector<std::int64_t>& n) {
  if (correct.size() != n.size())
    value_error(fn, "correct",
                "has " + std::to_string(correct.size()) + " groups; expected as many as n (" +
                    std::to_string(n.size()) + ")");
  std::vector<ev::Count> c(n.size());
  for (std::size_t i = 0; i < n.size(); ++i) {
    phasekv::detail::check_arg(n[i] >= 0, fn, "n[i]", n[i], "must be >= 0");
    phasekv::detail::check_arg(correct[i] >= 0 && correct[i] <= n[i], fn, "correct[i]", correct[i],
                               "must be in [0, n[i]]");
    c[i] = {correct[i], n[i]};
  }
  return c;
}

// Tally of outcomes by residue: (correct per residue, trials per residue).
std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>> tally(nb::handle positions,
                                                                      nb::handle correct,
                                                                      std::int64_t modulus,
                                                                      std::int64_t origin) {
  const char* fn = "phasekv.eval.tally";
  Array p = import_array(fn, "positions", positions, false);
  Array c = import_array(fn, "correct", correct, false);
  require_i64(p);
  require_contiguous(p);
  require_contiguous(c);
  if (p.ndim() != 1) require_shape(p, {-1});
  require_shape(c, {p.shape(0)});
  const nb::dlpack::dtype cd = c.a.dtype();
  const bool is_bool =
      cd.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bool) && cd.bits == 8;
  const bool is_i64 =
      cd.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) && cd.bits == 64;
  if (!is_bool && !is_i64) type_error(fn, "correct", "must hold bool or int64 (0/1) values");
  phasekv::detail::check_arg(origin >= 0 && origin <= phasekv::kMaxLength, fn, "origin", origin,
                             "must be in [0, 2^62]");
  ev::PhaseTally t(modulus);
  const auto* pos = static_cast<const std::int64_t*>(p.data());
  for (std::int64_t i = 0; i < p.shape(0); ++i) {
    std::int64_t ok = 0;
    if (is_bool)
      ok = static_cast<const std::uint8_t*>(c.data())[i] != 0;
    else
      ok = static_cast<const std::int64_t*>(c.data())[i];
    phasekv::detail::check_arg(ok == 0 || ok == 1, fn, "correct[i]", ok, "must be 0 or 1");
    phasekv::detail::check_arg(pos[i] >= -phasekv::kMaxLength && pos[i] <= phasekv::kMaxLength, fn,
                               "positions[i]", pos[i], "must be in [-2^62, 2^62]");
    t.add_position(pos[i], ok == 1, origin);
  }
  std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>> r;
  for (const ev::Count& k : t.counts()) {
    r.first.push_back(k.correct);
    r.second.push_back(k.n);
  }
  return r;
}

}  // namespace

void bind_eval(nb::module_& root) {
  nb::module_ m = root.def_submodule("eval", "The phase report and sweep planning.");
  nb::class_<ev::GroupStats>(m, "GroupStats", "Statistics of one residue group.")
      .def_ro("residue", &ev::GroupStats::residue)
      .def_ro("n", &ev::GroupStats::n, "Trials.")
      .def_ro("correct", &ev::GroupStats::correct, "Successes.")
      .def_ro("accuracy", &ev::GroupStats::accuracy, "correct / n (NaN when n = 0).")
      .def_ro("ci_low", &ev::GroupStats::ci_low, "Wilson 95 % lower bound.")
      .def_ro("ci_high", &ev::GroupStats::ci_high, "Wilson 95 % upper bound.");
  nb::class_<ev::Summary>(m, "Summary",
                          "The per-residue report: groups, mean, worst, best, gap (percentage "
                          "points), homogeneity p-value and detected period.")
      .def_ro("modulus", &ev::Summary::modulus)
      .def_ro("groups", &ev::Summary::groups)
      .def_ro("mean", &ev::Summary::mean, "Unweighted mean over non-empty groups.")
      .def_ro("worst", &ev::Summary::worst)
      .def_ro("worst_residue", &ev::Summary::worst_residue)
      .def_ro("best", &ev::Summary::best)
      .def_ro("best_residue", &ev::Summary::best_residue)
      .def_ro("gap_pp", &ev::Summary::gap_pp, "100 * (best - worst).")
      .def_ro("homogeneity_p", &ev::Summary::homogeneity_p)
      .def_ro("period", &ev::Summary::period)
      .def_ro("empty_groups", &ev::Summary::empty_groups)
      .def("summary_line", &ev::summary_line)
      .def("to_markdown", &ev::to_markdown)
      .def("to_csv", &ev::to_csv)
      .def("to_json", &ev::to_json)
      .def("to_bars", &ev::to_bars, nb::arg("width") = 40)
      .def("to_svg", &ev::to_svg, nb::arg("title") = "Accuracy by residue");

  m.def(
      "wilson_interval",
      [](std::int64_t correct, std::int64_t n, double z) {
        const ev::Interval iv = ev::wilson_interval(correct, n, z);
        return std::make_pair(iv.low, iv.high);
      },
      nb::arg("correct"), nb::arg("n"), nb::arg("z") = ev::kZ95,
      "Wilson score interval (low, high) of correct successes out of n trials.");
  m.def(
      "homogeneity_test",
      [](const std::vector<std::int64_t>& correct, const std::vector<std::int64_t>& n) {
        const ev::HomogeneityTest t =
            ev::homogeneity_test(counts("phasekv.eval.homogeneity_test", correct, n));
        return std::make_tuple(t.statistic, t.dof, t.p_value);
      },
      nb::arg("correct"), nb::arg("n"),
      "Pearson chi-square homogeneity test over groups: (statistic, dof, p_value).");
  m.def(
      "detect_period",
      [](const std::vector<std::int64_t>& correct, const std::vector<std::int64_t>& n,
         double alpha) {
        return ev::detect_period(counts("phasekv.eval.detect_period", correct, n), alpha);
      },
      nb::arg("correct"), nb::arg("n"), nb::arg("alpha") = ev::kDefaultPeriodAlpha,
      "The smallest divisor p of the group count whose residue classes are each homogeneous.");
  m.def(
      "summarize",
      [](const std::vector<std::int64_t>& correct, const std::vector<std::int64_t>& n,
         double period_alpha) {
        return ev::summarize(counts("phasekv.eval.summarize", correct, n), period_alpha);
      },
      nb::arg("correct"), nb::arg("n"), nb::arg("period_alpha") = ev::kDefaultPeriodAlpha,
      "The Summary of per-residue counts (index = residue).");
  m.def("tally", &tally, nb::arg("positions"), nb::arg("correct"), nb::arg("modulus"),
        nb::arg("origin") = 0,
        "Counts outcomes by residue (position - origin) mod modulus: positions int64 [N], "
        "correct bool or int64 0/1 [N]; returns (correct per residue, trials per residue).");

  nb::class_<ev::TargetPlan>(m, "TargetPlan",
                             "Target positions per residue group with equal means and "
                             "variances within a tolerance.")
      .def_ro("modulus", &ev::TargetPlan::modulus)
      .def_ro("positions", &ev::TargetPlan::positions, "positions[r]: the targets of residue r.")
      .def_ro("mean", &ev::TargetPlan::mean)
      .def_ro("variance", &ev::TargetPlan::variance)
      .def("variance_spread", &ev::TargetPlan::variance_spread);
  m.def("plan_targets", &ev::plan_targets, nb::arg("modulus"), nb::arg("count"), nb::arg("lo"),
        nb::arg("hi"), nb::arg("origin") = 0, nb::arg("max_variance_spread") = 0.01,
        "Plans `count` targets per residue group modulo `modulus` within [lo, hi], every "
        "group with the same mean position (count must be a multiple of modulus).");

  nb::class_<ev::PromptSegment>(m, "PromptSegment", "One span of a planned prompt.")
      .def_ro("kind", &ev::PromptSegment::kind, "'filler', 'records', 'target' or 'query'.")
      .def_ro("start", &ev::PromptSegment::start)
      .def_ro("length", &ev::PromptSegment::length)
      .def_ro("first_record", &ev::PromptSegment::first_record)
      .def_ro("records", &ev::PromptSegment::records)
      .def("__repr__", [](const ev::PromptSegment& s) {
        return "PromptSegment(kind='" + s.kind + "', start=" + std::to_string(s.start) +
               ", length=" + std::to_string(s.length) + ")";
      });
  m.def(
      "layout_prompt",
      [](std::int64_t target, std::int64_t query_position, std::int64_t record_length,
         const std::string& padding) {
        ev::Padding p = ev::Padding::prefix;
        if (padding == "in_sequence")
          p = ev::Padding::in_sequence;
        else if (padding != "prefix")
          value_error("phasekv.eval.layout_prompt", "padding",
                      "= '" + padding + "' is invalid (must be 'prefix' or 'in_sequence')");
        return ev::layout_prompt(target, query_position, record_length, p);
      },
      nb::arg("target"), nb::arg("query_position"), nb::arg("record_length"),
      nb::arg("padding") = "prefix",
      "The spans of a prompt whose target record starts at `target` and whose query sits at "
      "`query_position`.");
}

}  // namespace phasekv_py
