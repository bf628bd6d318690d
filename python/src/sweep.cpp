// The idealized retrieval sweep (phasekv/eval/retrieval.hpp: the R1/R2 tasks that
// phasekv-sweep runs through a compressor policy, the compressed cache and an attention backend;
// the specialization map; the DeepSeek-V4 layer of dsv4_retrieval.hpp), the induction model's
// trained gates, and the mitigation study (mitigations.hpp). Runs release the GIL.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common.hpp"
#include "phasekv/eval/dsv4_retrieval.hpp"
#include "phasekv/eval/induction_model.hpp"
#include "phasekv/eval/mitigations.hpp"
#include "phasekv/eval/retrieval.hpp"
#include "phasekv/eval/specialization.hpp"
#include "policy.hpp"

namespace phasekv_py {

namespace {

namespace ev = phasekv::eval;
using i64 = std::int64_t;

ev::Task parse_task(const char* fn, const std::string& task) {
  if (task == "R1") return ev::Task::R1;
  if (task == "R2") return ev::Task::R2;
  value_error(fn, "task", "= '" + task + "' is invalid (must be 'R1' or 'R2')");
}

// The settings of a retrieval run (RetrievalConfig without per-head origins), as Python passes
// them to every run function.
struct RunSettings {
  std::string task = "R2";
  i64 dim = 128, vocab = 1024, context = 512, heads = 1;
  double gamma = 64.0;
  i64 local = 0, modulus = 0, contexts = 80, targets_per_group = 4, min_depth = 0, max_depth = 0;
  std::uint64_t seed = 1;
  std::vector<i64> knockout;
  std::string attention = "kernel";
  double period_alpha = ev::kDefaultPeriodAlpha;
};

ev::RetrievalConfig config(const char* fn, const RunSettings& s) {
  ev::RetrievalConfig c;
  c.task = parse_task(fn, s.task);
  c.dim = s.dim;
  c.vocab = s.vocab;
  c.context = s.context;
  c.heads = s.heads;
  c.gamma = s.gamma;
  c.local = s.local;
  c.modulus = s.modulus;
  c.contexts = s.contexts;
  c.targets_per_group = s.targets_per_group;
  c.min_depth = s.min_depth;
  c.max_depth = s.max_depth;
  c.seed = s.seed;
  c.knockout = s.knockout;
  if (s.attention != "kernel" && s.attention != "reference")
    value_error(fn, "attention",
                "= '" + s.attention + "' is invalid (must be 'kernel' or 'reference')");
  return c;
}

// Calls f(key_policy, value_policy, attend) with the C++ policies (NoCompression for both when
// key_policy is None) and the attention backend; the policies must be one built-in type.
template <class F>
void with_policies(const char* fn, nb::handle key, nb::handle value, const std::string& attention,
                   F&& f) {
  const auto attend = [&](const auto& kp, const auto& vp) {
    if (attention == "reference")
      f(kp, vp, ev::ReferenceAttention{});
    else
      f(kp, vp, ev::KernelAttention{});
  };
  if (key.is_none() != value.is_none())
    type_error(fn, key.is_none() ? "key_policy" : "value_policy",
               "is None while the other policy is not (None for both: uncompressed attention)");
  if (key.is_none()) {
    nb::gil_scoped_release release;
    attend(ev::NoCompression{}, ev::NoCompression{});
    return;
  }
  if (!nb::isinstance<Policy>(key)) type_error(fn, "key_policy", "must be a phasekv.Policy");
  if (!nb::isinstance<Policy>(value)) type_error(fn, "value_policy", "must be a phasekv.Policy");
  const AnyPolicy& kp = nb::cast<const Policy&>(key).p;
  const AnyPolicy& vp = nb::cast<const Policy&>(value).p;
  if (kp.index() != vp.index())
    type_error(fn, "value_policy", "must be the same policy type as key_policy");
  std::visit(
      [&](const auto& k) {
        using P = std::decay_t<decltype(k)>;
        const P& v = std::get<P>(vp);
        nb::gil_scoped_release release;
        attend(k, v);
      },
      kp);
}

template <class T>
nb::object numpy_of(const std::vector<T>& v, const char* dtype) {
  nb::object a = nb::module_::import_("numpy").attr("empty")(v.size(), dtype);
  Array out = import_array("phasekv.eval", "result", a, true);
  std::copy(v.begin(), v.end(), static_cast<T*>(out.data()));
  return a;
}

// (summary, positions int64, predictions int64, correct bool) of a retrieval run.
nb::tuple result_tuple(const ev::RetrievalResult& r, double alpha) {
  std::vector<std::uint8_t> ok(r.correct.begin(), r.correct.end());
  return nb::make_tuple(ev::summarize(r.tally, alpha), numpy_of(r.positions, "int64"),
                        numpy_of(r.predictions, "int64"), numpy_of(ok, "bool"));
}

nb::tuple run_sweep(nb::handle key, nb::handle value, const RunSettings& s) {
  const char* fn = "phasekv.eval.sweep";
  const ev::RetrievalConfig cfg = config(fn, s);
  ev::RetrievalResult r;
  with_policies(fn, key, value, s.attention, [&](const auto& kp, const auto& vp, auto attend) {
    r = ev::run_retrieval(cfg, kp, vp, attend);
  });
  return result_tuple(r, s.period_alpha);
}

ev::SpecializationMap run_map(nb::handle key, nb::handle value, const RunSettings& s) {
  const char* fn = "phasekv.eval.specialization_map";
  if (key.is_none()) type_error(fn, "key_policy", "is None; the map needs a compressor");
  const ev::RetrievalConfig cfg = config(fn, s);
  ev::SpecializationMap m;
  with_policies(fn, key, value, s.attention, [&](const auto& kp, const auto& vp, auto attend) {
    using P = std::decay_t<decltype(kp)>;
    if constexpr (!std::is_same<P, ev::NoCompression>::value)
      m = ev::specialization_map(cfg, kp, vp, attend, s.period_alpha);
  });
  return m;
}

// (summary, selected: (correct per residue, trials per residue), positions, predictions,
// correct) of a DeepSeek-V4 layer run.
nb::tuple run_dsv4(const RunSettings& s, const ev::Dsv4Config& c) {
  const char* fn = "phasekv.eval.dsv4_sweep";
  const ev::RetrievalConfig cfg = config(fn, s);
  ev::Dsv4RetrievalResult r;
  {
    nb::gil_scoped_release release;
    r = ev::run_dsv4_retrieval(cfg, c);
  }
  std::vector<i64> sel_ok, sel_n;
  for (const ev::Count& k : r.selected.counts()) {
    sel_ok.push_back(k.correct);
    sel_n.push_back(k.n);
  }
  nb::tuple base = result_tuple(r.retrieval, s.period_alpha);
  return nb::make_tuple(base[0], nb::make_tuple(sel_ok, sel_n), base[1], base[2], base[3]);
}

// Gates of the idealized induction model after `steps` of gradient flow (orthonormal limit),
// as FixedGates weights: (key [heads, W], value [heads, W]) float32, and the offsets.
nb::tuple train_induction(const ev::InductionConfig& cfg, i64 steps) {
  if (steps < 0) value_error("phasekv.eval.train_induction", "steps", "must be >= 0");
  std::vector<double> k, v;
  std::vector<i64> ko, vo;
  {
    nb::gil_scoped_release release;
    ev::InductionModel model(cfg);
    for (i64 i = 0; i < steps; ++i) model.step(true);
    k = model.key_weights();
    v = model.value_weights();
    for (i64 h = 0; h < cfg.heads; ++h) {
      ko.push_back(model.key_offset(h));
      vo.push_back(model.value_offset(h));
    }
  }
  const std::vector<float> kf(k.begin(), k.end()), vf(v.begin(), v.end());
  const auto shaped = [&](const std::vector<float>& x) {
    return numpy_of(x, "float32").attr("reshape")(cfg.heads, cfg.window);
  };
  return nb::make_tuple(shaped(kf), shaped(vf), ko, vo);
}

}  // namespace

void bind_sweep(nb::module_& root) {
  nb::module_ m = nb::borrow<nb::module_>(root.attr("eval"));

  nb::class_<RunSettings>(m, "RunSettings",
                          "Settings of an idealized retrieval run (phasekv::eval::"
                          "RetrievalConfig; phasekv.eval.sweep fills it from keywords).")
      .def(nb::init<>())
      .def_rw("task", &RunSettings::task, "'R1' (stored records) or 'R2' (induction).")
      .def_rw("dim", &RunSettings::dim, "Embedding dimension d.")
      .def_rw("vocab", &RunSettings::vocab, "Vocabulary N (>= context).")
      .def_rw("context", &RunSettings::context, "Tokens per context T (query at T - 1).")
      .def_rw("heads", &RunSettings::heads, "Heads (the policies must cover them).")
      .def_rw("gamma", &RunSettings::gamma, "Query scale.")
      .def_rw("local", &RunSettings::local, "Local raw window L.")
      .def_rw("modulus", &RunSettings::modulus, "Residue modulus; 0 = the stride.")
      .def_rw("contexts", &RunSettings::contexts, "Random contexts.")
      .def_rw("targets_per_group", &RunSettings::targets_per_group,
              "Targets per residue and context (trials per residue = contexts x this).")
      .def_rw("min_depth", &RunSettings::min_depth, "0 = L + W + S.")
      .def_rw("max_depth", &RunSettings::max_depth, "0 = as deep as the context allows.")
      .def_rw("seed", &RunSettings::seed)
      .def_rw("knockout", &RunSettings::knockout, "Heads whose entries are excluded.")
      .def_rw("attention", &RunSettings::attention, "'kernel' (CPU decode) or 'reference'.")
      .def_rw("period_alpha", &RunSettings::period_alpha, "Level of the period test.");
  m.def("_sweep", &run_sweep, nb::arg("key_policy").none(), nb::arg("value_policy").none(),
        nb::arg("settings"),
        "run_retrieval: (Summary, positions, predictions, correct); see phasekv.eval.sweep.");

  nb::class_<ev::SpecializationMap>(m, "SpecializationMap",
                                    "Heads x residues: which head serves which phase (each head "
                                    "knocked out in turn, and kept alone).")
      .def_ro("heads", &ev::SpecializationMap::heads)
      .def_ro("modulus", &ev::SpecializationMap::modulus)
      .def_ro("baseline", &ev::SpecializationMap::baseline, "No head knocked out.")
      .def_ro("none", &ev::SpecializationMap::none, "Every head knocked out.")
      .def_ro("knocked", &ev::SpecializationMap::knocked, "knocked[h]: head h knocked out.")
      .def_ro("alone", &ev::SpecializationMap::alone, "alone[h]: only head h kept.")
      .def("drop", &ev::SpecializationMap::drop, nb::arg("h"), nb::arg("r"),
           "Accuracy drop of residue r when head h is knocked out (fraction).")
      .def("needed", &ev::SpecializationMap::needed, nb::arg("h"), nb::arg("r"))
      .def("suffices", &ev::SpecializationMap::suffices, nb::arg("h"), nb::arg("r"))
      .def("findings", &ev::specialization_findings)
      .def("to_markdown", [](const ev::SpecializationMap& x) { return ev::to_markdown(x); })
      .def("to_csv", [](const ev::SpecializationMap& x) { return ev::to_csv(x); })
      .def("to_json", [](const ev::SpecializationMap& x) { return ev::to_json(x); })
      .def(
          "to_svg",
          [](const ev::SpecializationMap& x, const std::string& title) {
            return ev::to_svg(x, title);
          },
          nb::arg("title") = "Phase specialization map")
      .def("_repr_markdown_", [](const ev::SpecializationMap& x) { return ev::to_markdown(x); });
  m.def("_specialization_map", &run_map, nb::arg("key_policy").none(),
        nb::arg("value_policy").none(), nb::arg("settings"),
        "specialization_map; see phasekv.eval.specialization_map.");

  nb::enum_<ev::Dsv4Layer>(m, "Dsv4Layer")
      .value("csa", ev::Dsv4Layer::csa)
      .value("hca", ev::Dsv4Layer::hca);
  nb::enum_<ev::Dsv4Indexer>(m, "Dsv4Indexer")
      .value("all", ev::Dsv4Indexer::all)
      .value("exact", ev::Dsv4Indexer::exact)
      .value("oracle", ev::Dsv4Indexer::oracle)
      .value("lightning", ev::Dsv4Indexer::lightning);
  nb::class_<ev::Dsv4Config>(m, "Dsv4Config",
                             "A DeepSeek-V4 layer of the idealized sweep "
                             "(phasekv::eval::Dsv4Config).")
      .def(nb::init<>())
      .def_rw("layer", &ev::Dsv4Config::layer)
      .def_rw("ratio", &ev::Dsv4Config::ratio, "S; 0 = 4 (CSA) or 128 (HCA).")
      .def_rw("window", &ev::Dsv4Config::window, "Raw sliding window.")
      .def_rw("offsets", &ev::Dsv4Config::offsets, "Key offsets in the window; [] = uniform.")
      .def_rw("sharpness", &ev::Dsv4Config::sharpness)
      .def_rw("content_scale", &ev::Dsv4Config::content_scale)
      .def_rw("indexer", &ev::Dsv4Config::indexer)
      .def_rw("top_k", &ev::Dsv4Config::top_k)
      .def_rw("index_sharpness", &ev::Dsv4Config::index_sharpness)
      .def_rw("index_offset", &ev::Dsv4Config::index_offset)
      .def_rw("index_noise", &ev::Dsv4Config::index_noise)
      .def_rw("min_depth", &ev::Dsv4Config::min_depth)
      .def_rw("max_depth", &ev::Dsv4Config::max_depth);
  m.def("_dsv4_sweep", &run_dsv4, nb::arg("settings"), nb::arg("layer"),
        "run_dsv4_retrieval; see phasekv.eval.dsv4_sweep.");

  nb::class_<ev::InductionConfig>(m, "InductionConfig",
                                  "The idealized induction model (phasekv::eval::"
                                  "InductionConfig).")
      .def(nb::init<>())
      .def_rw("window", &ev::InductionConfig::window)
      .def_rw("windows", &ev::InductionConfig::windows)
      .def_rw("heads", &ev::InductionConfig::heads)
      .def_rw("dim", &ev::InductionConfig::dim)
      .def_rw("vocab", &ev::InductionConfig::vocab)
      .def_rw("gamma", &ev::InductionConfig::gamma)
      .def_rw("tau", &ev::InductionConfig::tau)
      .def_rw("init_scale", &ev::InductionConfig::init_scale)
      .def_rw("learning_rate", &ev::InductionConfig::learning_rate)
      .def_rw("batch", &ev::InductionConfig::batch)
      .def_rw("seed", &ev::InductionConfig::seed)
      .def_rw("orthonormal", &ev::InductionConfig::orthonormal);
  m.def("_train_induction", &train_induction, nb::arg("config"), nb::arg("steps"),
        "(key weights, value weights, key offsets, value offsets) after `steps` steps.");

  // The mitigation study.
  nb::class_<ev::MitigationDesign>(m, "MitigationDesign",
                                   "A compressor design of the mitigation study at equal memory.")
      .def(nb::init<>())
      .def_rw("name", &ev::MitigationDesign::name)
      .def_rw("what", &ev::MitigationDesign::what)
      .def_rw("window", &ev::MitigationDesign::window)
      .def_rw("stride", &ev::MitigationDesign::stride)
      .def_rw("staggered", &ev::MitigationDesign::staggered, "Per-head origins h * S / H.")
      .def_rw("local", &ev::MitigationDesign::local)
      .def_rw("phase_dropout", &ev::MitigationDesign::phase_dropout)
      .def_rw("mean_head", &ev::MitigationDesign::mean_head)
      .def_rw("spread_init", &ev::MitigationDesign::spread_init)
      .def_rw("training_only", &ev::MitigationDesign::training_only)
      .def("__repr__",
           [](const ev::MitigationDesign& d) { return "MitigationDesign('" + d.name + "')"; });
  nb::class_<ev::StudyConfig>(m, "StudyConfig", "Settings shared by every row of the study.")
      .def(nb::init<>())
      .def_rw("heads", &ev::StudyConfig::heads)
      .def_rw("seeds", &ev::StudyConfig::seeds)
      .def_rw("train_steps", &ev::StudyConfig::train_steps)
      .def_rw("train_windows", &ev::StudyConfig::train_windows)
      .def_rw("gain", &ev::StudyConfig::gain)
      .def_rw("learning_rate", &ev::StudyConfig::learning_rate)
      .def_rw("dim", &ev::StudyConfig::dim)
      .def_rw("context", &ev::StudyConfig::context)
      .def_rw("contexts", &ev::StudyConfig::contexts)
      .def_rw("targets_per_group", &ev::StudyConfig::targets_per_group)
      .def_rw("min_depth", &ev::StudyConfig::min_depth)
      .def_rw("max_depth", &ev::StudyConfig::max_depth)
      .def_rw("eval_seed", &ev::StudyConfig::eval_seed);
  nb::class_<ev::DesignCost>(m, "DesignCost", "Memory and work relative to uniform W = S.")
      .def_ro("memory", &ev::DesignCost::memory)
      .def_ro("attend", &ev::DesignCost::attend)
      .def_ro("compress", &ev::DesignCost::compress);
  nb::class_<ev::Spread>(m, "Spread", "Mean, sample sd, min and max over seeds.")
      .def_ro("mean", &ev::Spread::mean)
      .def_ro("sd", &ev::Spread::sd)
      .def_ro("min", &ev::Spread::min)
      .def_ro("max", &ev::Spread::max);
  nb::class_<ev::DesignResult>(m, "DesignResult", "The measurements of one design.")
      .def_ro("design", &ev::DesignResult::design)
      .def_ro("r1", &ev::DesignResult::r1, "R1 with the best hand-set gates.")
      .def_ro("r2", &ev::DesignResult::r2, "R2 with the best hand-set gates.")
      .def_ro("trained", &ev::DesignResult::trained, "R2 with trained gates, pooled over seeds.")
      .def_ro("per_seed", &ev::DesignResult::per_seed)
      .def_ro("key_offsets", &ev::DesignResult::key_offsets)
      .def_ro("seed_mean", &ev::DesignResult::seed_mean)
      .def_ro("seed_worst", &ev::DesignResult::seed_worst)
      .def_ro("seed_gap", &ev::DesignResult::seed_gap)
      .def_ro("covered", &ev::DesignResult::covered)
      .def_ro("cost", &ev::DesignResult::cost);
  nb::class_<ev::StudyResult>(m, "StudyResult", "The whole study for one StudyConfig.")
      .def_ro("config", &ev::StudyResult::config)
      .def_ro("rows", &ev::StudyResult::rows)
      .def("to_markdown", [](const ev::StudyResult& s) { return ev::to_markdown(s); })
      .def("_repr_markdown_", [](const ev::StudyResult& s) { return ev::to_markdown(s); });
  m.def("mitigation_designs", &ev::mitigation_designs, nb::arg("stride") = 8,
        "The study's designs for stride S (uniform, overlap, staggered, mixed, local window, "
        "phase dropout, one-token overlap, phase-spread init, staggered + spread).");
  m.def("design_cost", &ev::design_cost, nb::arg("design"), nb::arg("heads"), nb::arg("n0") = 4096,
        "Memory and work of a design relative to uniform W = S at lengths [n0, n0 + S).");
  m.def(
      "measure_design",
      [](const ev::MitigationDesign& d, const ev::StudyConfig& s) {
        nb::gil_scoped_release release;
        return ev::measure_design(d, s);
      },
      nb::arg("design"), nb::arg("config"),
      "Measures one design: hand-set R1 and R2, then config.seeds trained models on R2 (GIL "
      "released while it runs).");
  m.def(
      "run_study",
      [](const ev::StudyConfig& s) {
        nb::gil_scoped_release release;
        return ev::run_study(s);
      },
      nb::arg("config"), "measure_design for every design of mitigation_designs(8).");
  m.def(
      "study_svg", [](const std::vector<ev::StudyResult>& s) { return ev::to_svg(s); },
      nb::arg("studies"),
      "The combined plot of one or more studies (R2 hand-set and trained per design).");
}

}  // namespace phasekv_py
