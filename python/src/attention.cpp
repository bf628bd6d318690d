// CPU decode and prefill over compressed caches (phasekv/attention/cpu/), single-threaded or
// over the thread drivers.
#include <nanobind/stl/optional.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>
#include <vector>

#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/attention/cpu/thread_driver.hpp"
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/attention/params.hpp"
#include "phasekv/phase/origins.hpp"
#include "policy.hpp"

namespace phasekv_py {

namespace {

using phasekv::StandardVariant;
using phasekv::cpu::VisibilityRule;

// The visible set of a decode: one set for every KV head, or (per-head origins) one one-head
// set per KV head.
template <class T>
struct DecodeKV {
  phasekv::VisibleKV<T> all;                 ///< Every head's set (heads empty).
  std::vector<phasekv::VisibleKV<T>> heads;  ///< Or one set per KV head.
};

template <class T>
DecodeKV<T> decode_kv(const phasekv::VisibleKV<T>& all) {
  return {all, {}};
}
template <class T>
DecodeKV<T> decode_kv(std::vector<phasekv::VisibleKV<T>>&& heads) {
  return {{}, std::move(heads)};
}

// One decode step into out/lse, checked before the kernel runs; `release`: without the GIL
// (false when the caller already released it).
template <class T>
void run_decode(const char* fn, const float* q, std::int64_t q_heads, std::int64_t kv_heads,
                std::int64_t d_k, std::int64_t d_v, const DecodeKV<T>& kv,
                const StandardVariant& variant, float* out, float* lse, int threads,
                bool release = true) {
  phasekv::cpu::DecodeArgs<T> a;
  a.q = q;
  a.q_heads = q_heads;
  a.kv_heads = kv_heads;
  a.d_k = d_k;
  a.d_v = d_v;
  a.kv = kv.all;
  if (!kv.heads.empty()) {
    // one per KV head (a wrong count is a binding bug, not a caller's)
    if (static_cast<std::int64_t>(kv.heads.size()) != kv_heads)
      throw std::logic_error("phasekv: per-head visible sets do not match kv_heads");
    a.head_kv = kv.heads.data();
  }
  a.variant = variant;
  a.out = out;
  a.lse = lse;
  phasekv::cpu::check_decode_args(a, fn);
  std::optional<nb::gil_scoped_release> unlocked;
  if (release) unlocked.emplace();
  if (threads <= 1) {
    phasekv::cpu::decode(a);
    return;
  }
  with_pool(threads,
            [&](phasekv::cpu::ThreadPool& pool) { phasekv::cpu::decode_parallel(a, pool); });
}

// The arguments of pk.decode, imported and checked (everything but the cache's visible set,
// taken per step).
struct CacheDecode {
  const char* fn = "phasekv.decode";
  const CacheBase* c = nullptr;
  const float* q = nullptr;
  std::int64_t hq = 0, local = 0;
  StandardVariant v;
  std::pair<nb::object, float*> out, lse;
  int threads = 1;

  // One step: the visible set of the cache now, then the kernel (as a C++ engine calls it).
  // `release`: drop the GIL first. The cache's lock is taken without the GIL and given back
  // before the GIL is taken again, so that a thread waiting for the lock while holding the
  // GIL (another decode, append, clear) cannot deadlock with this one.
  void step(bool release) const {
    std::optional<nb::gil_scoped_release> unlocked;
    if (release) unlocked.emplace();
    std::lock_guard<std::mutex> lock(c->mu);
    const auto run = [&](auto kv) {
      run_decode(fn, q, hq, c->kv_heads(), c->key_dim(), c->value_dim(), kv, v, out.second,
                 lse.second, threads, false);
    };
    const auto visit = [&](auto kv) {
      std::visit([&](auto& sets) { run(decode_kv(std::move(sets))); }, kv);
    };
    if (phasekv::origins_uniform(c->origins()))
      visit(c->visible(local));
    else  // per-head origins: each KV head's own visible set
      visit(c->visible_per_head(local));
  }
};

CacheDecode prepare_decode(nb::handle q_obj, const PyCache& cache, nb::handle out_obj,
                           nb::handle lse_obj, std::optional<std::int64_t> local,
                           std::optional<float> scale, float softcap, float entry_bias,
                           nb::handle sinks, int threads) {
  CacheDecode d;
  const char* fn = d.fn;
  check_threads(fn, threads);
  d.threads = threads;
  d.c = cache.c.get();
  const CacheBase& c = *d.c;
  Array qa = import_array(fn, "q", q_obj, false);
  require_f32(qa);
  if (qa.ndim() != 2) require_shape(qa, {-1, c.key_dim()});
  d.hq = qa.shape(0);
  d.q = dense_f32(qa, {d.hq, c.key_dim()});
  d.out = output_f32(fn, "out", out_obj, {d.hq, c.value_dim()});
  d.lse = output_f32(fn, "lse", lse_obj, {d.hq});
  d.v = make_variant(fn, {scale, softcap, entry_bias, sinks}, d.hq, c.key_dim());
  d.local = local ? *local : c.local();
  return d;
}

nb::object decode_cache(nb::handle q_obj, const PyCache& cache, nb::handle out_obj,
                        nb::handle lse_obj, std::optional<std::int64_t> local,
                        std::optional<float> scale, float softcap, float entry_bias,
                        nb::handle sinks, int threads) {
  const CacheDecode d = prepare_decode(q_obj, cache, out_obj, lse_obj, local, scale, softcap,
                                       entry_bias, sinks, threads);
  d.step(true);
  return nb::make_tuple(d.out.first, d.lse.first);
}

// The benchmark's C++ side (benchmarks/python/bench_overhead.py): `calls` steps of pk.decode's
// C++ work (the cache's visible set, the argument check, the kernel) in a C++ loop without the
// GIL, `repeat` times; returns the best mean time of one step in microseconds.
double time_decode(nb::handle q_obj, const PyCache& cache, nb::handle out_obj, nb::handle lse_obj,
                   std::optional<std::int64_t> local, int threads, std::int64_t calls,
                   std::int64_t repeat) {
  if (calls < 1 || repeat < 1)
    value_error("phasekv._time_decode", "calls", "and repeat must be >= 1");
  const CacheDecode d = prepare_decode(q_obj, cache, out_obj, lse_obj, local, std::nullopt, 0.0f,
                                       0.0f, nb::none(), threads);
  double best = HUGE_VAL;
  nb::gil_scoped_release release;
  for (std::int64_t r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < calls; ++i) d.step(false);
    const std::chrono::duration<double, std::micro> dt = std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count() / static_cast<double>(calls));
  }
  return best;
}

// The raw/entry arrays of the array forms, as views of their storage type.
template <class T>
struct KVArrays {
  phasekv::StridedView<const T> raw_k, raw_v, entry_k, entry_v;
};

template <class T>
KVArrays<T> kv_arrays(const Array& rk, const Array& rv, const std::optional<Array>& ek,
                      const std::optional<Array>& ev) {
  KVArrays<T> r;
  r.raw_k = kv_view<const T>(rk);
  r.raw_v = kv_view<const T>(rv);
  if (ek) r.entry_k = kv_view<const T>(*ek);
  if (ev) r.entry_v = kv_view<const T>(*ev);
  return r;
}

// The K/V arguments of the array forms (decode_arrays, prefill), imported and checked.
struct KVInputs {
  VisibilityRule rule;
  Array rk, rv;
  std::optional<Array> ek, ev;
  Dtype dtype = Dtype::f32;
  std::int64_t kv_heads = 0, d_k = 0, d_v = 0;
};

KVInputs kv_inputs(const char* fn, nb::handle raw_k, nb::handle raw_v, nb::handle entry_k,
                   nb::handle entry_v, nb::handle geometry, std::int64_t local, std::int64_t window,
                   int threads) {
  check_threads(fn, threads);
  KVInputs r;
  r.rule = make_rule(fn, geometry, local, window);
  r.rk = import_array(fn, "raw_k", raw_k, false);
  r.rv = import_array(fn, "raw_v", raw_v, false);
  r.ek = optional_array(fn, "entry_k", entry_k);
  r.ev = optional_array(fn, "entry_v", entry_v);
  r.dtype = storage_dtype(r.rk);
  require_kv_layout(r.rk);
  require_kv_layout(r.rv);
  r.kv_heads = r.rk.shape(1);
  r.d_k = r.rk.shape(2);
  r.d_v = r.rv.shape(2);
  return r;
}

// Per-KV-head origins of the array forms: a compressed rule with origin 0 and one valid origin
// per KV head (the checks of cpu::check_prefill_args, made once here for decode_arrays).
void check_rule_origins(const char* fn, const VisibilityRule& rule,
                        const std::vector<std::int64_t>& origins, std::int64_t kv_heads) {
  if (origins.empty()) return;
  if (!rule.is_compressed())
    value_error(fn, "origins", "needs a geometry (uncompressed attention has no windows)");
  phasekv::detail::check_arg(rule.geometry().origin() == 0, fn, "geometry.origin",
                             rule.geometry().origin(),
                             "must be 0 with per-head origins (origins[h] is head h's origin)");
  phasekv::check_origins(fn, origins, kv_heads);
}

nb::object decode_arrays(nb::handle q_obj, nb::handle raw_k_obj, nb::handle raw_v_obj,
                         std::int64_t n, nb::handle entry_k_obj, nb::handle entry_v_obj,
                         nb::handle geometry, std::int64_t local, std::int64_t window,
                         nb::handle origins_obj, nb::handle out_obj, nb::handle lse_obj,
                         std::optional<float> scale, float softcap, float entry_bias,
                         nb::handle sinks, int threads) {
  const char* fn = "phasekv.decode_arrays";
  const KVInputs in = kv_inputs(fn, raw_k_obj, raw_v_obj, entry_k_obj, entry_v_obj, geometry, local,
                                window, threads);
  const std::vector<std::int64_t> origins = origins_arg(fn, "origins", origins_obj);
  check_rule_origins(fn, in.rule, origins, in.kv_heads);
  const std::int64_t kv_heads = in.kv_heads, d_k = in.d_k, d_v = in.d_v;
  Array qa = import_array(fn, "q", q_obj, false);
  require_f32(qa);
  if (qa.ndim() != 2) require_shape(qa, {-1, d_k});
  const std::int64_t hq = qa.shape(0);
  const float* q = dense_f32(qa, {hq, d_k});
  auto out = output_f32(fn, "out", out_obj, {hq, d_v});
  auto lse = output_f32(fn, "lse", lse_obj, {hq});
  const StandardVariant v = make_variant(fn, {scale, softcap, entry_bias, sinks}, hq, d_k);
  dispatch_dtype(in.dtype, [&](auto t) {
    using T = decltype(t);
    const KVArrays<T> a = kv_arrays<T>(in.rk, in.rv, in.ek, in.ev);
    DecodeKV<T> kv;
    if (origins.empty()) {
      kv.all = in.rule.visible_kv<T>(n, a.raw_k, a.raw_v, a.entry_k, a.entry_v);
    } else {  // KV head h sees Geometry(W, S, O_h) over its own rows
      for (std::int64_t h = 0; h < kv_heads; ++h) {
        using phasekv::head_view;
        kv.heads.push_back(in.rule.with_origin(origins[static_cast<std::size_t>(h)])
                               .visible_kv<T>(n, head_view(a.raw_k, h), head_view(a.raw_v, h),
                                              head_view(a.entry_k, h), head_view(a.entry_v, h)));
      }
    }
    run_decode(fn, q, hq, kv_heads, d_k, d_v, kv, v, out.second, lse.second, threads);
  });
  return nb::make_tuple(out.first, lse.first);
}

nb::object prefill(nb::handle q_obj, nb::handle raw_k_obj, nb::handle raw_v_obj, std::int64_t first,
                   nb::handle entry_k_obj, nb::handle entry_v_obj, nb::handle geometry,
                   std::int64_t local, std::int64_t window, nb::handle origins_obj,
                   nb::handle out_obj, nb::handle lse_obj, std::optional<float> scale,
                   float softcap, float entry_bias, nb::handle sinks, int threads) {
  const char* fn = "phasekv.prefill";
  const KVInputs in = kv_inputs(fn, raw_k_obj, raw_v_obj, entry_k_obj, entry_v_obj, geometry, local,
                                window, threads);
  const std::vector<std::int64_t> origins = origins_arg(fn, "origins", origins_obj);
  check_rule_origins(fn, in.rule, origins, in.kv_heads);
  const std::int64_t d_k = in.d_k, d_v = in.d_v;
  Array qa = import_array(fn, "q", q_obj, false);
  require_f32(qa);
  if (qa.ndim() != 3) require_shape(qa, {-1, -1, d_k});
  const std::int64_t t = qa.shape(0), hq = qa.shape(1);
  const float* q = dense_f32(qa, {t, hq, d_k});
  auto out = output_f32(fn, "out", out_obj, {t, hq, d_v});
  auto lse = output_f32(fn, "lse", lse_obj, {t, hq});
  const StandardVariant v = make_variant(fn, {scale, softcap, entry_bias, sinks}, hq, d_k);
  dispatch_dtype(in.dtype, [&](auto tag) {
    using T = decltype(tag);
    const KVArrays<T> a = kv_arrays<T>(in.rk, in.rv, in.ek, in.ev);
    phasekv::cpu::PrefillArgs<T> args;
    args.q = q;
    args.num_queries = t;
    args.q_heads = hq;
    args.kv_heads = in.kv_heads;
    args.d_k = d_k;
    args.d_v = d_v;
    args.first = first;
    args.rule = in.rule;
    args.origins = origins.empty() ? nullptr : origins.data();
    args.raw_k = a.raw_k;
    args.raw_v = a.raw_v;
    args.entry_k = a.entry_k;
    args.entry_v = a.entry_v;
    args.variant = v;
    args.out = out.second;
    args.lse = lse.second;
    phasekv::cpu::check_prefill_args(args, fn);
    nb::gil_scoped_release release;
    if (threads <= 1)
      phasekv::cpu::prefill(args);
    else
      with_pool(threads, [&](phasekv::cpu::ThreadPool& pool) {
        phasekv::cpu::prefill_parallel(args, pool);
      });
  });
  return nb::make_tuple(out.first, lse.first);
}

}  // namespace

void bind_attention(nb::module_& m) {
  const char* logit_doc =
      " Logits: scale * <q, k> (scale None: 1/sqrt(d_k)), then softcap * tanh(s / softcap) "
      "when softcap > 0, plus entry_bias on compressed entries; sinks: float32 [q_heads] "
      "logits added to each head's denominator. out/lse: float32 C-contiguous outputs "
      "written in place (new numpy arrays when None); returns (out, lse). threads > 1 splits "
      "the work over a process-wide thread pool; the GIL is released while it runs.";
  m.def("decode", &decode_cache, nb::arg("q"), nb::arg("cache"), nb::arg("out").none() = nb::none(),
        nb::arg("lse").none() = nb::none(), nb::kw_only(), nb::arg("local").none() = nb::none(),
        nb::arg("scale").none() = nb::none(), nb::arg("softcap") = 0.0f,
        nb::arg("entry_bias") = 0.0f, nb::arg("sinks").none() = nb::none(), nb::arg("threads") = 1,
        (std::string("Decode attention of one query token over a CompressedCache: q float32 "
                     "[q_heads, d_k] (q_heads a multiple of kv_heads, head h reads KV head "
                     "h / (q_heads / kv_heads)); out [q_heads, d_v]; lse [q_heads] (-inf when "
                     "nothing is visible). The query sits at position cache.size - 1 and sees "
                     "the prefix, the J(n) entries and the raw band of the last `local` "
                     "tokens (default: the cache's).") +
         logit_doc)
            .c_str());
  m.def("_time_decode", &time_decode, nb::arg("q"), nb::arg("cache"), nb::arg("out"),
        nb::arg("lse"), nb::kw_only(), nb::arg("local").none() = nb::none(), nb::arg("threads") = 1,
        nb::arg("calls") = 200, nb::arg("repeat") = 7,
        "Benchmark helper: the best mean microseconds of one decode(q, cache, out, lse) step "
        "timed in a C++ loop (the same visible set, check and kernel, no Python call).");
  m.def("decode_arrays", &decode_arrays, nb::arg("q"), nb::arg("raw_k"), nb::arg("raw_v"),
        nb::arg("n"), nb::arg("entry_k").none() = nb::none(),
        nb::arg("entry_v").none() = nb::none(), nb::kw_only(),
        nb::arg("geometry").none() = nb::none(), nb::arg("local") = 0, nb::arg("window") = 0,
        nb::arg("origins").none() = nb::none(), nb::arg("out").none() = nb::none(),
        nb::arg("lse").none() = nb::none(), nb::arg("scale").none() = nb::none(),
        nb::arg("softcap") = 0.0f, nb::arg("entry_bias") = 0.0f,
        nb::arg("sinks").none() = nb::none(), nb::arg("threads") = 1,
        (std::string("Decode attention of the query at position n - 1 over caller arrays: raw "
                     "K/V [>= n, kv_heads, d] by absolute position and entries [>= J(n), "
                     "kv_heads, d] by window (any token/head strides, one dtype). With a "
                     "geometry the query sees the prefix, the entries and the raw band of "
                     "`local` tokens; without one it is plain causal attention (window 0) or "
                     "a sliding window of `window` tokens. origins: one origin per KV head "
                     "(the geometry's origin must be 0): KV head h sees what Geometry(W, S, "
                     "O_h) shows over its rows, entry row j of head h being its entry j (as "
                     "compress_batch with the same origins writes them).") +
         logit_doc)
            .c_str());
  m.def("prefill", &prefill, nb::arg("q"), nb::arg("raw_k"), nb::arg("raw_v"), nb::kw_only(),
        nb::arg("first"), nb::arg("entry_k").none() = nb::none(),
        nb::arg("entry_v").none() = nb::none(), nb::arg("geometry").none() = nb::none(),
        nb::arg("local") = 0, nb::arg("window") = 0, nb::arg("origins").none() = nb::none(),
        nb::arg("out").none() = nb::none(), nb::arg("lse").none() = nb::none(),
        nb::arg("scale").none() = nb::none(), nb::arg("softcap") = 0.0f,
        nb::arg("entry_bias") = 0.0f, nb::arg("sinks").none() = nb::none(), nb::arg("threads") = 1,
        (std::string("Prefill attention of T queries at positions first .. first + T - 1: q "
                     "float32 [T, q_heads, d_k], out [T, q_heads, d_v], lse [T, q_heads]; each "
                     "query sees what decode_arrays would show it (raw K/V [>= first + T, "
                     "kv_heads, d], entries [>= J(first + T), kv_heads, d]); origins as "
                     "decode_arrays.") +
         logit_doc)
            .c_str());
}

}  // namespace phasekv_py
