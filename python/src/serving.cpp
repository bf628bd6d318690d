// Paged serving (phasekv/serving/): page pools and block tables over caller arrays (PagedKV),
// and the plan/run life cycle of a serving step: AppendPlan (paged append with the
// compressors), DecodePlan and PrefillPlan (batch attention), plus the one-off paged_append,
// page_needs and the page-sharing queries. Python module phasekv._core.serving.
//
// Everything reads and writes the caller's arrays in place: the pools, the tables and the
// lengths are held (kept alive) by a PagedKV and read through pointers at plan and run time,
// as an engine's own buffers are; a plan records what it was made for and every run compares
// its arguments with it (a stale run raises ValueError naming the field).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "phasekv/serving/append_run.hpp"
#include "phasekv/serving/batch_decode.hpp"
#include "phasekv/serving/batch_prefill.hpp"
#include "phasekv/serving/paged_append.hpp"
#include "phasekv/serving/sharing.hpp"
#include "policy.hpp"

namespace phasekv_py {

namespace {

using i64 = std::int64_t;
using phasekv::Layout;

// The storage types of paged serving: float32 and bfloat16. Each type instantiates the batch
// decode kernels for every instruction-set target (about 20 s of CPU at -O1 per type on the
// 2-core build machine); float16 would be one more alternative here and in serving_dtype.
using AnyPagedKV = std::variant<phasekv::PagedKV<float>, phasekv::PagedKV<phasekv::bf16_t>>;

// Writable views of a PagedKV's pools (the same memory), for the appends.
template <class T>
struct WritablePools {
  phasekv::PagePool<T> raw, entry;
};
using AnyPools = std::variant<WritablePools<float>, WritablePools<phasekv::bf16_t>>;

// Calls `f(T{})` with T the element type of a serving storage type (see AnyPagedKV).
template <class F>
decltype(auto) dispatch_serving(Dtype d, F&& f) {
  if (d == Dtype::bf16) return f(phasekv::bf16_t{});
  return f(float{});
}

// The Python object phasekv.serving.PagedKV: the C++ descriptor over the caller's arrays and
// the arrays themselves (kept alive while it lives).
struct PyPagedKV {
  AnyPagedKV kv;
  AnyPools pools;  // writable views of kv's pools (used when `writable`)
  Dtype dtype = Dtype::f32;
  Layout layout = Layout::NHD;
  bool writable = false;  // every pool array is writable (append may write them)
  nb::object raw_pool, entry_pool, raw_table, entry_table, lengths;  // the caller's objects
  std::vector<std::int64_t> origins;  // per-KV-head origins (kv's origins point here), or none
};

// The page geometry of one pool: `pages` pages of `page_size` slots of `heads` x `dim`
// elements, `page_stride` elements apart.
struct PoolPart {
  void* data = nullptr;
  i64 pages = 0, page_size = 0, heads = 0, dim = 0, page_stride = 0;
};

// One array of a pool: `[pages, P, H, d]` (NHD) or `[pages, H, P, d]` (HND) of storage type
// `d`, dense inside a page (any page stride).
PoolPart pool_part(const char* fn, const Array& a, Dtype d, Layout layout) {
  require_dtype(a, d);
  if (a.ndim() != 4)
    value_error(fn, a.name,
                std::string("must have 4 dimensions ") +
                    (layout == Layout::NHD ? "[pages, page_size, heads, dim]"
                                           : "[pages, heads, page_size, dim]") +
                    ", got shape " + a.shape_text());
  PoolPart p;
  p.pages = a.shape(0);
  p.page_size = a.shape(layout == Layout::NHD ? 1 : 2);
  p.heads = a.shape(layout == Layout::NHD ? 2 : 1);
  p.dim = a.shape(3);
  p.page_stride = a.stride(0);
  p.data = a.data();
  if (a.a.size() == 0) {
    p.page_stride = p.page_size * p.heads * p.dim;
    p.data = nullptr;
    return p;
  }
  // dense inside a page: the strides of the layout, unit stride along dim
  const i64 inner[3] = {layout == Layout::NHD ? p.heads * p.dim : p.page_size * p.dim,
                        layout == Layout::NHD ? p.dim : p.dim, 1};
  for (int i = 1; i < 4; ++i)
    if (a.shape(i) > 1 && a.stride(i) != inner[i - 1])
      value_error(fn, a.name,
                  "must be dense inside a page (any page stride); its stride along dimension " +
                      std::to_string(i) + " is " + std::to_string(a.stride(i)) + ", expected " +
                      std::to_string(inner[i - 1]));
  if (p.page_stride < 0) value_error(fn, a.name, "must have a non-negative page stride");
  require_aligned(a, d == Dtype::f32 ? 4 : 2);
  return p;
}

// The pool argument `name` = (keys, values) as a PagePool of T; `writable` is cleared when
// either array is read-only.
template <class T>
phasekv::PagePool<T> pool_arg(const char* fn, const char* name, nb::handle obj, Layout layout,
                              Dtype d, bool& writable) {
  if (!nb::isinstance<nb::tuple>(obj) || nb::len(obj) != 2)
    type_error(fn, name, "must be a tuple (keys, values) of page arrays");
  const std::string names[2] = {std::string(name) + "[0] (keys)",
                                std::string(name) + "[1] (values)"};
  PoolPart part[2];
  for (int i = 0; i < 2; ++i) {
    nb::handle x = nb::borrow<nb::tuple>(obj)[i];
    Array a;
    try {
      a = import_array(fn, names[i].c_str(), x, true);
    } catch (const nb::builtin_exception&) {  // read-only (or not an array: raised below)
      a = import_array(fn, names[i].c_str(), x, false);
      writable = false;
    }
    part[i] = pool_part(fn, a, d, layout);
  }
  const PoolPart &k = part[0], &v = part[1];
  const char* what[3] = {"pages", "page_size", "heads"};
  const i64 kk[3] = {k.pages, k.page_size, k.heads}, vv[3] = {v.pages, v.page_size, v.heads};
  for (int i = 0; i < 3; ++i)
    if (kk[i] != vv[i])
      value_error(fn, names[1].c_str(),
                  std::string("has ") + what[i] + " = " + std::to_string(vv[i]) +
                      "; the keys have " + std::to_string(kk[i]));
  phasekv::PagePool<T> p;
  p.keys = static_cast<T*>(k.data);
  p.values = static_cast<T*>(v.data);
  p.pages = k.pages;
  p.page_size = k.page_size;
  p.heads = k.heads;
  p.d_k = k.dim;
  p.d_v = v.dim;
  p.layout = layout;
  p.key_page_stride = k.page_stride;
  p.value_page_stride = v.page_stride;
  return p;
}

// The storage type of a pool argument (its key array).
Dtype pool_dtype(const char* fn, const char* name, nb::handle obj) {
  if (!nb::isinstance<nb::tuple>(obj) || nb::len(obj) != 2)
    type_error(fn, name, "must be a tuple (keys, values) of page arrays");
  const std::string n = std::string(name) + "[0] (keys)";
  return storage_dtype(import_array(fn, n.c_str(), nb::borrow<nb::tuple>(obj)[0], false));
}

Layout parse_layout(const char* fn, const std::string& layout) {
  if (layout == "NHD") return Layout::NHD;
  if (layout == "HND") return Layout::HND;
  value_error(fn, "layout", "= '" + layout + "' is invalid (must be 'NHD' or 'HND')");
}

void make_paged_kv(PyPagedKV* self, nb::handle raw_pool, nb::handle raw_table, nb::handle lengths,
                   nb::handle entry_pool, nb::handle entry_table, nb::handle geometry, i64 local,
                   i64 window, i64 ring_slots, const std::string& layout_name,
                   nb::handle origins_obj) {
  const char* fn = "phasekv.serving.PagedKV";
  std::vector<std::int64_t> origins = origins_arg(fn, "origins", origins_obj);
  const Layout layout = parse_layout(fn, layout_name);
  const phasekv::cpu::VisibilityRule rule = make_rule(fn, geometry, local, window);
  const Dtype d = pool_dtype(fn, "raw_pool", raw_pool);
  if (d == Dtype::f16)
    type_error(fn, "raw_pool[0] (keys)",
               "has dtype float16; paged serving takes float32 or bfloat16 pools");
  const phasekv::BlockTable rt = block_table(fn, kRawTable, raw_table, -1);
  const i64 B = rt.batch;
  const Array la = import_array(fn, "lengths", lengths, false);
  const std::int64_t* len = dense_i64(la, {B});
  if (rule.is_compressed() && (entry_pool.is_none() || entry_table.is_none()))
    value_error(fn, entry_pool.is_none() ? "entry_pool" : "entry_table",
                "is None; a compressed layer (geometry given) needs entry pages");
  if (!rule.is_compressed() && !(entry_pool.is_none() && entry_table.is_none()))
    value_error(fn, entry_pool.is_none() ? "entry_table" : "entry_pool",
                "must be None without a geometry (uncompressed layers have no entries)");
  bool writable = true;
  using Built = std::pair<AnyPagedKV, AnyPools>;
  Built built = dispatch_serving(d, [&](auto t) -> Built {
    using T = decltype(t);
    WritablePools<T> w;
    w.raw = pool_arg<T>(fn, "raw_pool", raw_pool, layout, d, writable);
    // uncompressed layers read no entries: the raw pool and table stand in
    w.entry = rule.is_compressed() ? pool_arg<T>(fn, "entry_pool", entry_pool, layout, d, writable)
                                   : w.raw;
    phasekv::PagedKV<T> kv;
    kv.raw_pool = w.raw;
    kv.raw_table = rt;
    kv.entry_pool = w.entry;
    kv.entry_table = rule.is_compressed() ? block_table(fn, kEntryTable, entry_table, B) : rt;
    kv.lengths = len;
    kv.batch = B;
    kv.rule = rule;
    kv.ring_slots = ring_slots;
    kv.origins = origins.empty() ? nullptr : origins.data();
    // checked here, naming the Python arguments: count, values, rule
    if (!origins.empty()) {
      if (static_cast<i64>(origins.size()) != w.raw.heads)
        value_error(fn, "origins",
                    "has " + std::to_string(origins.size()) + " entries; the pools have " +
                        std::to_string(w.raw.heads) + " KV heads (one origin per KV head)");
      phasekv::detail::check_paged_kv_fields(kv, w.raw.heads, w.raw.d_k, w.raw.d_v, fn, "");
    }
    return {kv, w};
  });
  new (self) PyPagedKV();
  self->origins = std::move(origins);
  std::visit([&](auto& k) { k.origins = self->origins.empty() ? nullptr : self->origins.data(); },
             built.first);
  self->kv = built.first;
  self->pools = built.second;
  self->dtype = d;
  self->layout = layout;
  self->writable = writable;
  self->raw_pool = nb::borrow(raw_pool);
  self->entry_pool = nb::borrow(entry_pool);
  self->raw_table = nb::borrow(raw_table);
  self->entry_table = nb::borrow(entry_table);
  self->lengths = nb::borrow(lengths);
}

template <class T>
const phasekv::PagedKV<T>& kv_of(const PyPagedKV& p) {
  return std::get<phasekv::PagedKV<T>>(p.kv);
}

// Raises ValueError unless the cache has the dtype a plan was made for.
void require_plan_dtype(const char* fn, const PyPagedKV& kv, Dtype planned) {
  if (kv.dtype != planned)
    value_error(fn, "kv",
                std::string("has dtype ") + dtype_name(kv.dtype) + "; the plan was made for " +
                    dtype_name(planned) + " (plan again)");
}

// Raises ValueError unless `got` (a batch size) equals the planned one.
void require_batch(const char* fn, i64 got, i64 planned) {
  if (got != planned)
    value_error(fn, "kv.batch",
                "= " + std::to_string(got) + " differs from the planned batch " +
                    std::to_string(planned) + " (plan again)");
}

// Raises ValueError unless 1 <= workers <= 1024.
void check_workers(const char* fn, int workers) {
  phasekv::detail::check_arg(workers >= 1 && workers <= 1024, fn, "workers", workers,
                             "must be in [1, 1024]");
}

// A plan's workspace: run never allocates.
using Workspace = std::vector<unsigned char>;

i64 batch_of(const PyPagedKV& kv) {
  return std::visit([](const auto& k) { return k.batch; }, kv.kv);
}

// ---------------------------------------------------------------------------------------------
// DecodePlan and PrefillPlan: one Python object shape and one run path over either C++ plan.

// The Python objects phasekv.serving.DecodePlan (Plan = phasekv::DecodePlan) and PrefillPlan.
template <class Plan>
struct PyAttentionPlan {
  Plan plan;
  Dtype dtype = Dtype::f32;
  i64 q_heads = 0, d_k = 0, d_v = 0;
  Workspace ws;
  std::mutex mu;  // one run at a time (the workspace)
};
using PyDecodePlan = PyAttentionPlan<phasekv::DecodePlan>;
using PyPrefillPlan = PyAttentionPlan<phasekv::PrefillPlan>;

// The arguments of one layer (q, out, lse and variant unset): decode ignores `qo_indptr`.
template <class T>
void attention_args(phasekv::BatchDecodeArgs<T>&, const std::int32_t*) {}
template <class T>
void attention_args(phasekv::BatchPrefillArgs<T>& a, const std::int32_t* qo_indptr) {
  a.qo_indptr = qo_indptr;
}
template <class T, class Plan>
using ArgsOf = std::conditional_t<std::is_same<Plan, phasekv::DecodePlan>::value,
                                  phasekv::BatchDecodeArgs<T>, phasekv::BatchPrefillArgs<T>>;

template <class T, class Plan>
ArgsOf<T, Plan> layer_args(const PyPagedKV& p, i64 q_heads, const std::int32_t* qo_indptr) {
  const phasekv::PagedKV<T>& kv = kv_of<T>(p);
  ArgsOf<T, Plan> a;
  a.q_heads = q_heads;
  a.kv_heads = kv.raw_pool.heads;
  a.d_k = kv.raw_pool.d_k;
  a.d_v = kv.raw_pool.d_v;
  a.kv = kv;
  attention_args(a, qo_indptr);
  return a;
}

// The C++ plan calls of each kind.
template <class A>
void plan_layer(phasekv::DecodePlan& plan, const A& a, int workers, i64 kv_chunk) {
  plan.plan(a, workers, kv_chunk);
}
template <class A>
void plan_layer(phasekv::PrefillPlan& plan, const A& a, int workers, i64) {
  plan.plan(a, workers);
}
template <class A>
void run_layer(const phasekv::DecodePlan& plan, const A& a, Workspace& ws) {
  if (plan.workers() <= 1) return phasekv::batch_decode(plan, a, ws.data(), ws.size());
  with_pool(plan.workers(), [&](phasekv::cpu::ThreadPool& pool) {
    phasekv::batch_decode_parallel(plan, a, pool, ws.data(), ws.size());
  });
}
template <class A>
void run_layer(const phasekv::PrefillPlan& plan, const A& a, Workspace& ws) {
  if (plan.workers() <= 1) return phasekv::batch_prefill(plan, a, ws.data(), ws.size());
  with_pool(plan.workers(), [&](phasekv::cpu::ThreadPool& pool) {
    phasekv::batch_prefill_parallel(plan, a, pool, ws.data(), ws.size());
  });
}
i64 planned_batch(const phasekv::DecodePlan& p) { return p.batch(); }
i64 planned_batch(const phasekv::PrefillPlan& p) { return p.record().batch(); }
i64 planned_batch(const phasekv::AppendPlan& p) { return p.batch(); }

template <class Plan>
void attention_plan(const char* fn, PyAttentionPlan<Plan>& self, const PyPagedKV& kv,
                    const std::int32_t* qo_indptr, i64 q_heads, int workers, i64 kv_chunk) {
  check_workers(fn, workers);
  dispatch_serving(kv.dtype, [&](auto t) {
    using T = decltype(t);
    const auto a = layer_args<T, Plan>(kv, q_heads, qo_indptr);
    nb::gil_scoped_release release;  // planning reads no Python object
    std::lock_guard<std::mutex> lock(self.mu);
    plan_layer(self.plan, a, workers, kv_chunk);
    self.ws.assign(self.plan.workspace_bytes(), 0);
    self.dtype = kv.dtype;
    self.q_heads = q_heads;
    self.d_k = a.d_k;
    self.d_v = a.d_v;
  });
}

// A run over `rows` query rows (decode: one per sequence; prefill: qo_indptr[B]).
template <class Plan>
nb::object attention_run(const char* fn, PyAttentionPlan<Plan>& self, nb::handle q_obj,
                         const PyPagedKV& kv, const std::int32_t* qo_indptr, nb::handle out_obj,
                         nb::handle lse_obj, const Logits& logits) {
  if (!self.plan.planned()) value_error(fn, "plan", "is empty; call plan() first");
  require_plan_dtype(fn, kv, self.dtype);
  const i64 B = batch_of(kv);
  require_batch(fn, B, planned_batch(self.plan));
  i64 rows = B;
  if (qo_indptr != nullptr) {
    rows = B > 0 ? qo_indptr[B] : 0;
    if (rows < 0) value_error(fn, "qo_indptr", "[-1] must be >= 0");
  }
  const Array qa = input_f32(fn, "q", q_obj, {rows, self.q_heads, self.d_k});
  auto out = output_f32(fn, "out", out_obj, {rows, self.q_heads, self.d_v});
  auto lse = output_f32(fn, "lse", lse_obj, {rows, self.q_heads});
  const phasekv::StandardVariant v = make_variant(fn, logits, self.q_heads, self.d_k);
  dispatch_serving(kv.dtype, [&](auto t) {
    using T = decltype(t);
    auto a = layer_args<T, Plan>(kv, self.q_heads, qo_indptr);
    a.q = static_cast<const float*>(qa.data());
    a.out = out.second;
    a.lse = lse.second;
    a.variant = v;
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(self.mu);
    run_layer(self.plan, a, self.ws);  // compares a with the plan before writing
  });
  return nb::make_tuple(out.first, lse.first);
}

void decode_plan(PyDecodePlan& self, const PyPagedKV& kv, i64 q_heads, int workers, i64 kv_chunk) {
  attention_plan("phasekv.serving.DecodePlan.plan", self, kv, nullptr, q_heads, workers, kv_chunk);
}

nb::object decode_run(PyDecodePlan& self, nb::handle q_obj, const PyPagedKV& kv, nb::handle out_obj,
                      nb::handle lse_obj, std::optional<float> scale, float softcap,
                      float entry_bias, nb::handle sinks) {
  return attention_run("phasekv.serving.DecodePlan.run", self, q_obj, kv, nullptr, out_obj, lse_obj,
                       {scale, softcap, entry_bias, sinks});
}

void prefill_plan(PyPrefillPlan& self, const PyPagedKV& kv, nb::handle qo_indptr_obj, i64 q_heads,
                  int workers) {
  const char* fn = "phasekv.serving.PrefillPlan.plan";
  const Array qi = input_i32(fn, "qo_indptr", qo_indptr_obj, {batch_of(kv) + 1});
  attention_plan(fn, self, kv, static_cast<const std::int32_t*>(qi.data()), q_heads, workers, 0);
}

nb::object prefill_run(PyPrefillPlan& self, nb::handle q_obj, const PyPagedKV& kv,
                       nb::handle qo_indptr_obj, nb::handle out_obj, nb::handle lse_obj,
                       std::optional<float> scale, float softcap, float entry_bias,
                       nb::handle sinks) {
  const char* fn = "phasekv.serving.PrefillPlan.run";
  const Array qi = input_i32(fn, "qo_indptr", qo_indptr_obj, {batch_of(kv) + 1});
  return attention_run(fn, self, q_obj, kv, static_cast<const std::int32_t*>(qi.data()), out_obj,
                       lse_obj, {scale, softcap, entry_bias, sinks});
}

// ---------------------------------------------------------------------------------------------
// Append

// The writable append arguments of `kv` with the new tokens `keys` / `values` (rows
// `new_indptr[b] .. new_indptr[b + 1]` of sequence b).
template <class T>
phasekv::PagedAppendArgs<T> append_args(const char* fn, const PyPagedKV& p,
                                        const std::int32_t* new_indptr, const Array& keys,
                                        const Array& values) {
  if (!p.writable) value_error(fn, "kv", "has a read-only pool array; an append writes the pools");
  const phasekv::PagedKV<T>& kv = kv_of<T>(p);
  const WritablePools<T>& w = std::get<WritablePools<T>>(p.pools);
  phasekv::PagedAppendArgs<T> a;
  a.raw_pool = w.raw;
  a.raw_table = kv.raw_table;
  a.entry_pool = w.entry;
  a.entry_table = kv.entry_table;
  a.lengths = kv.lengths;
  a.batch = kv.batch;
  a.ring_slots = kv.ring_slots;
  a.origins = kv.origins;
  a.new_indptr = new_indptr;
  a.keys = kv_view<const T>(keys);
  a.values = kv_view<const T>(values);
  return a;
}

// The policies of an append to `kv`: both given for a compressed layer (the same type and
// geometry as the layer's), None for an uncompressed one. Returns the key policy (null: none).
const Policy* append_policies(const char* fn, const PyPagedKV& kv, nb::handle key_policy,
                              nb::handle& value_policy) {
  const phasekv::cpu::VisibilityRule rule = std::visit([](const auto& k) { return k.rule; }, kv.kv);
  if (!rule.is_compressed()) {
    if (!key_policy.is_none() || !value_policy.is_none())
      value_error(fn, key_policy.is_none() ? "value_policy" : "key_policy",
                  "must be None for an uncompressed layer (kv has no geometry)");
    return nullptr;
  }
  if (key_policy.is_none() || !nb::isinstance<Policy>(key_policy))
    type_error(fn, "key_policy", "must be a phasekv policy for a compressed layer");
  if (value_policy.is_none()) value_policy = key_policy;
  if (!nb::isinstance<Policy>(value_policy))
    type_error(fn, "value_policy", "must be a phasekv policy or None");
  const Policy& kp = nb::cast<const Policy&>(key_policy);
  const Policy& vp = nb::cast<const Policy&>(value_policy);
  if (kp.p.index() != vp.p.index())
    type_error(fn, "value_policy", "must be of the same policy type as key_policy");
  const phasekv::Geometry g = std::visit([](const auto& q) { return q.geometry(); }, kp.p);
  if (g != rule.geometry())
    value_error(fn, "key_policy",
                "has geometry (" + std::to_string(g.window()) + ", " + std::to_string(g.stride()) +
                    ", " + std::to_string(g.origin()) + "); it must equal kv's geometry");
  return &kp;
}

// Calls `f(T{}, kp, vp)` with the storage type of `kv` and the policies (the same type).
template <class F>
void with_policies(const PyPagedKV& kv, const Policy& kp, const Policy& vp, F&& f) {
  std::visit(
      [&](const auto& k) {
        using P = std::decay_t<decltype(k)>;
        const P& v = std::get<P>(vp.p);
        dispatch_serving(kv.dtype, [&](auto t) { f(t, k, v); });
      },
      kp.p);
}

struct PyAppendPlan {
  phasekv::AppendPlan plan;
  Dtype dtype = Dtype::f32;
  std::size_t policy_kind = 0;  // AnyPolicy index of the planned policies (compressed plans)
  std::vector<Array> readers;   // the reader counts the plan reads again at every run
  Workspace ws;
  std::mutex mu;
};

struct AppendInputs {
  Array indptr, keys, values;
  const std::int32_t* ip() const { return static_cast<const std::int32_t*>(indptr.data()); }
};

AppendInputs append_inputs(const char* fn, const PyPagedKV& kv, nb::handle new_indptr,
                           nb::handle keys, nb::handle values) {
  AppendInputs r;
  r.indptr = input_i32(fn, "new_indptr", new_indptr, {batch_of(kv) + 1});
  r.keys = import_array(fn, "keys", keys, false);
  r.values = import_array(fn, "values", values, false);
  require_dtype(r.keys, kv.dtype);
  require_dtype(r.values, kv.dtype);
  return r;
}

phasekv::PageReaders readers_arg(const char* fn, nb::handle obj, std::vector<Array>& keep) {
  phasekv::PageReaders r;
  if (obj.is_none()) return r;
  if (!nb::isinstance<nb::tuple>(obj) || nb::len(obj) != 2)
    type_error(fn, "readers",
               "must be None or a tuple (raw_readers, entry_readers) of int32 arrays (or None)");
  const nb::tuple t = nb::borrow<nb::tuple>(obj);
  const char* names[2] = {"readers[0] (raw)", "readers[1] (entries)"};
  const std::int32_t* p[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    if (t[i].is_none()) continue;
    keep.push_back(input_i32(fn, names[i], t[i], {-1}));
    p[i] = static_cast<const std::int32_t*>(keep.back().data());
  }
  r.raw = p[0];
  r.entry = p[1];
  return r;
}

void append_plan(PyAppendPlan& self, const PyPagedKV& kv, nb::handle new_indptr, nb::handle keys,
                 nb::handle values, nb::handle key_policy, nb::handle value_policy, int workers,
                 nb::handle readers_obj, i64 chunk) {
  const char* fn = "phasekv.serving.AppendPlan.plan";
  check_workers(fn, workers);
  const AppendInputs in = append_inputs(fn, kv, new_indptr, keys, values);
  std::vector<Array> keep;
  const phasekv::PageReaders readers = readers_arg(fn, readers_obj, keep);
  const Policy* kp = append_policies(fn, kv, key_policy, value_policy);
  // the pool sizes the reader counts must cover
  const auto check_readers = [&](const auto& k) {
    if (readers.raw && keep.front().shape(0) < k.raw_pool.pages)
      value_error(fn, "readers[0] (raw)", "must have raw pool pages entries");
    if (readers.entry && keep.back().shape(0) < k.entry_pool.pages)
      value_error(fn, "readers[1] (entries)", "must have entry pool pages entries");
  };
  std::visit(check_readers, kv.kv);
  // plans without the GIL (it reads no Python object), then records what it was made for
  const auto commit = [&](auto&& make_plan) {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(self.mu);
    make_plan();
    self.readers = keep;  // kept alive: every run reads the counts again
    self.ws.assign(self.plan.workspace_bytes(), 0);
    self.dtype = kv.dtype;
    self.policy_kind = kp != nullptr ? kp->p.index() : 0;
  };
  if (kp == nullptr) {
    dispatch_serving(kv.dtype, [&](auto t) {
      using T = decltype(t);
      const auto a = append_args<T>(fn, kv, in.ip(), in.keys, in.values);
      commit([&] { self.plan.plan_raw(kv_of<T>(kv).rule, a, workers, readers, chunk); });
    });
  } else {
    with_policies(
        kv, *kp, nb::cast<const Policy&>(value_policy), [&](auto t, const auto& k, const auto& v) {
          using T = decltype(t);
          const auto a = append_args<T>(fn, kv, in.ip(), in.keys, in.values);
          commit(
              [&] { self.plan.plan(k, v, kv_of<T>(kv).rule.local(), a, workers, readers, chunk); });
        });
  }
}

void append_run(PyAppendPlan& self, const PyPagedKV& kv, nb::handle new_indptr, nb::handle keys,
                nb::handle values, nb::handle key_policy, nb::handle value_policy) {
  const char* fn = "phasekv.serving.AppendPlan.run";
  if (self.plan.workers() < 1) value_error(fn, "plan", "is empty; call plan() first");
  require_plan_dtype(fn, kv, self.dtype);
  require_batch(fn, batch_of(kv), self.plan.batch());
  const AppendInputs in = append_inputs(fn, kv, new_indptr, keys, values);
  const Policy* kp = append_policies(fn, kv, key_policy, value_policy);
  if ((kp != nullptr) != self.plan.compressed())
    value_error(fn, "kv", "is a compressed layer and the plan a raw-only one, or the reverse");
  // the C++ plan compares geometry, dims and local; the policy type is the binding's record
  if (kp != nullptr && kp->p.index() != self.policy_kind)
    value_error(fn, "key_policy",
                std::string("is a ") + policy_name(kp->p) + "; the plan was made for " +
                    policy_type_name(self.policy_kind) + " (plan again)");
  const int w = self.plan.workers();
  if (kp == nullptr) {
    dispatch_serving(kv.dtype, [&](auto t) {
      using T = decltype(t);
      const auto a = append_args<T>(fn, kv, in.ip(), in.keys, in.values);
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(self.mu);
      if (w <= 1)
        phasekv::paged_append_raw_run(self.plan, a);
      else
        with_pool(w, [&](phasekv::cpu::ThreadPool& pool) {
          phasekv::paged_append_raw_run_parallel(self.plan, a, pool);
        });
    });
    return;
  }
  with_policies(
      kv, *kp, nb::cast<const Policy&>(value_policy), [&](auto t, const auto& k, const auto& v) {
        using T = decltype(t);
        const auto a = append_args<T>(fn, kv, in.ip(), in.keys, in.values);
        const i64 local = kv_of<T>(kv).rule.local();
        nb::gil_scoped_release release;
        std::lock_guard<std::mutex> lock(self.mu);
        if (w <= 1)
          phasekv::paged_append_run(self.plan, k, v, local, a, self.ws.data(), self.ws.size());
        else
          with_pool(w, [&](phasekv::cpu::ThreadPool& pool) {
            phasekv::paged_append_run_parallel(self.plan, k, v, local, a, pool, self.ws.data(),
                                               self.ws.size());
          });
      });
}

// One-off paged_append (no plan): checks everything, then appends.
void paged_append_once(const PyPagedKV& kv, nb::handle new_indptr, nb::handle keys,
                       nb::handle values, nb::handle key_policy, nb::handle value_policy,
                       int threads) {
  const char* fn = "phasekv.serving.paged_append";
  check_threads(fn, threads);
  const AppendInputs in = append_inputs(fn, kv, new_indptr, keys, values);
  const Policy* kp = append_policies(fn, kv, key_policy, value_policy);
  if (kp == nullptr)
    value_error(fn, "kv", "has no geometry; an uncompressed layer appends through AppendPlan");
  with_policies(
      kv, *kp, nb::cast<const Policy&>(value_policy), [&](auto t, const auto& k, const auto& v) {
        using T = decltype(t);
        const auto a = append_args<T>(fn, kv, in.ip(), in.keys, in.values);
        const i64 local = kv_of<T>(kv).rule.local();
        // every thread makes the same checks before writing anything (the pool rethrows)
        nb::gil_scoped_release release;
        run_threads(threads,
                    [&](int i, int count) { phasekv::paged_append(k, v, local, a, i, count); });
      });
}

// The properties every plan object has.
template <class Py>
void plan_properties(nb::class_<Py>& c) {
  c.def_prop_ro(
       "workers", [](const Py& s) { return s.plan.workers(); }, "Threads a run uses.")
      .def_prop_ro(
          "batch", [](const Py& s) { return planned_batch(s.plan); }, "Sequences planned.")
      .def_prop_ro(
          "workspace_bytes", [](const Py& s) { return s.ws.size(); },
          "Bytes of the workspace the plan holds.");
}

}  // namespace

void bind_serving(nb::module_& root) {
  nb::module_ m = root.def_submodule(
      "serving",
      "Paged serving: page pools and block tables over caller arrays (PagedKV) and the "
      "plan/run life cycle of a serving step (AppendPlan, DecodePlan, PrefillPlan).");

  nb::class_<PyPagedKV>(
      m, "PagedKV",
      "A batch of sequences over paged storage in the caller's arrays (no copy; kept alive by "
      "this object and read in place by every plan and run). Pools are tuples (keys, values) "
      "of arrays [pages, page_size, heads, d] (layout 'NHD') or [pages, heads, page_size, d] "
      "('HND'), dense inside a page, any page stride (so one array of [K|V] pages sliced in "
      "two works), one storage dtype (float32 or bfloat16). Tables are vLLM's dense "
      "int32 [B, max_blocks] or FlashInfer's CSR tuple (indptr [B + 1], indices) of int32. "
      "lengths: int64 [B], n_b tokens of sequence b (read at every plan and run: update it in "
      "place after an append). Raw position p of sequence b lives at raw slot p (ring_slots "
      "0) or, with a ring of R slots, p below the origin O and O + (p - O) mod R after it; "
      "entry j at entry slot j; slot s in page table[b][s // page_size], row s % page_size. "
      "With a geometry the layer is compressed (entry_pool and entry_table required, "
      "local = the raw window L), else causal (window 0) or a sliding window. origins: one "
      "origin O_h per KV head (the geometry's origin must then be 0): head h has the windows "
      "of Geometry(W, S, O_h); entry slot j holds entry j of every head with j < J_h(n), and "
      "the raw ring starts at max(origins).")
      .def(
          "__init__",
          [](PyPagedKV* self, nb::handle raw_pool, nb::handle raw_table, nb::handle lengths,
             nb::handle entry_pool, nb::handle entry_table, nb::handle geometry, i64 local,
             i64 window, i64 ring_slots, const std::string& layout, nb::handle origins) {
            make_paged_kv(self, raw_pool, raw_table, lengths, entry_pool, entry_table, geometry,
                          local, window, ring_slots, layout, origins);
          },
          nb::arg("raw_pool"), nb::arg("raw_table"), nb::arg("lengths"), nb::kw_only(),
          nb::arg("entry_pool").none() = nb::none(), nb::arg("entry_table").none() = nb::none(),
          nb::arg("geometry").none() = nb::none(), nb::arg("local") = 0, nb::arg("window") = 0,
          nb::arg("ring_slots") = 0, nb::arg("layout") = "NHD",
          nb::arg("origins").none() = nb::none())
      .def_prop_ro(
          "batch", [](const PyPagedKV& s) { return batch_of(s); }, "Sequences B.")
      .def_prop_ro(
          "dtype", [](const PyPagedKV& s) { return std::string(dtype_name(s.dtype)); },
          "Storage dtype of the pools.")
      .def_prop_ro(
          "kv_heads",
          [](const PyPagedKV& s) {
            return std::visit([](const auto& k) { return k.raw_pool.heads; }, s.kv);
          },
          "KV heads of a slot.")
      .def_prop_ro(
          "writable", [](const PyPagedKV& s) { return s.writable; },
          "Whether every pool array is writable (an append needs it).")
      .def_prop_ro(
          "lengths", [](const PyPagedKV& s) { return s.lengths; },
          "The caller's lengths array (int64 [B]).");

  const char* logit_doc =
      " Logits: scale * <q, k> (scale None: 1/sqrt(d_k)), softcap * tanh(s / softcap) when "
      "softcap > 0, plus entry_bias on compressed entries; sinks: float32 [q_heads]. out and "
      "lse are float32 C-contiguous outputs written in place (new numpy arrays when None); "
      "returns (out, lse). The GIL is released while it runs; one run of a plan at a time.";

  nb::class_<PyDecodePlan> decode(
      m, "DecodePlan",
      "The plan of a batch decode step (one query token per sequence): work items (sequence, "
      "KV chunk of kv_chunk visible items, a multiple of 64) balanced over `workers` threads, "
      "and its workspace. Made once per step; serves every layer whose PagedKV has the same "
      "lengths, tables, rule and head shape (the pools may differ). Results do not depend on "
      "`workers`.");
  decode
      .def(
          "__init__",
          [](PyDecodePlan* self, const PyPagedKV& kv, i64 q_heads, int workers, i64 kv_chunk) {
            new (self) PyDecodePlan();
            decode_plan(*self, kv, q_heads, workers, kv_chunk);
          },
          nb::arg("kv"), nb::arg("q_heads"), nb::kw_only(), nb::arg("workers") = 1,
          nb::arg("kv_chunk") = phasekv::kDefaultKvChunk,
          "Plans a step for kv and q_heads query heads (a multiple of kv.kv_heads). Validates "
          "the tables against the lengths (pages of the pools, no page written twice); raises "
          "naming the argument, the sequence and the index.")
      .def("plan", &decode_plan, nb::arg("kv"), nb::arg("q_heads"), nb::kw_only(),
           nb::arg("workers") = 1, nb::arg("kv_chunk") = phasekv::kDefaultKvChunk,
           "Plans again (the next step) into this object.")
      .def("run", &decode_run, nb::arg("q"), nb::arg("kv"), nb::arg("out").none() = nb::none(),
           nb::arg("lse").none() = nb::none(), nb::kw_only(), nb::arg("scale").none() = nb::none(),
           nb::arg("softcap") = 0.0f, nb::arg("entry_bias") = 0.0f,
           nb::arg("sinks").none() = nb::none(),
           (std::string("Decode: q float32 [B, q_heads, d_k] (sequence b's query at position "
                        "n_b - 1), out [B, q_heads, d_v], lse [B, q_heads] (-inf where nothing "
                        "is visible). kv must be what the plan was made for (same lengths, "
                        "tables, rule, pool shapes): a difference raises ValueError naming the "
                        "field before anything is written.") +
            logit_doc)
               .c_str())
      .def_prop_ro(
          "work_items", [](const PyDecodePlan& s) { return s.plan.items().size(); },
          "Work items (sequence, KV chunk).");
  plan_properties(decode);

  nb::class_<PyPrefillPlan> prefill(
      m, "PrefillPlan",
      "The plan of a batch prefill step: sequence b has qo_indptr[b + 1] - qo_indptr[b] "
      "queries at its last positions (n_b - t_b .. n_b - 1; the lengths include the new "
      "tokens), work items balanced over `workers` threads, and its workspace.");
  prefill
      .def(
          "__init__",
          [](PyPrefillPlan* self, const PyPagedKV& kv, nb::handle qo_indptr, i64 q_heads,
             int workers) {
            new (self) PyPrefillPlan();
            prefill_plan(*self, kv, qo_indptr, q_heads, workers);
          },
          nb::arg("kv"), nb::arg("qo_indptr"), nb::arg("q_heads"), nb::kw_only(),
          nb::arg("workers") = 1,
          "Plans a step for kv, int32 qo_indptr [B + 1] and q_heads query heads.")
      .def("plan", &prefill_plan, nb::arg("kv"), nb::arg("qo_indptr"), nb::arg("q_heads"),
           nb::kw_only(), nb::arg("workers") = 1, "Plans again into this object.")
      .def("run", &prefill_run, nb::arg("q"), nb::arg("kv"), nb::arg("qo_indptr"),
           nb::arg("out").none() = nb::none(), nb::arg("lse").none() = nb::none(), nb::kw_only(),
           nb::arg("scale").none() = nb::none(), nb::arg("softcap") = 0.0f,
           nb::arg("entry_bias") = 0.0f, nb::arg("sinks").none() = nb::none(),
           (std::string("Prefill: q float32 [qo_indptr[B], q_heads, d_k], out [qo_indptr[B], "
                        "q_heads, d_v], lse [qo_indptr[B], q_heads]; each query sees what a "
                        "decode at its position would. kv and qo_indptr must be what the plan "
                        "was made for (ValueError naming the field otherwise).") +
            logit_doc)
               .c_str());
  plan_properties(prefill);

  nb::class_<PyAppendPlan> append(
      m, "AppendPlan",
      "The plan of a step's paged append: the new tokens of sequence b are rows "
      "new_indptr[b] .. new_indptr[b + 1] of keys [N, kv_heads, d_k] and values [N, kv_heads, "
      "d_v] (the pools' dtype, any token/head strides), appended at positions n_b .. (kv's "
      "lengths are the lengths before the append; the tables must already list the pages of "
      "the lengths after it, see page_needs). A compressed layer pools every window that "
      "completes with key_policy / value_policy (value_policy None: key_policy; the layer's "
      "geometry) into the entry pages, the same bits as CompressedCache.append and "
      "compress_batch; the raw tokens go to the raw pages (all, or the ring). Work is "
      "balanced over `workers` threads, inside long chunks too. readers: optional "
      "(raw_readers, entry_readers) int32 counts per page of the live sequences listing it "
      "(count_page_readers), kept by the plan and read again by every run: a step that would "
      "write a shared page is refused, also when the counts changed since the plan.");
  append
      .def(
          "__init__",
          [](PyAppendPlan* self, const PyPagedKV& kv, nb::handle new_indptr, nb::handle keys,
             nb::handle values, nb::handle key_policy, nb::handle value_policy, int workers,
             nb::handle readers, i64 chunk) {
            new (self) PyAppendPlan();
            append_plan(*self, kv, new_indptr, keys, values, key_policy, value_policy, workers,
                        readers, chunk);
          },
          nb::arg("kv"), nb::arg("new_indptr"), nb::arg("keys"), nb::arg("values"),
          nb::arg("key_policy").none() = nb::none(), nb::arg("value_policy").none() = nb::none(),
          nb::kw_only(), nb::arg("workers") = 1, nb::arg("readers").none() = nb::none(),
          nb::arg("chunk") = phasekv::kAppendChunk,
          "Plans the append (validates the policies, new tokens, tables and every page the "
          "step touches; raises naming the argument, the sequence and the index).")
      .def("plan", &append_plan, nb::arg("kv"), nb::arg("new_indptr"), nb::arg("keys"),
           nb::arg("values"), nb::arg("key_policy").none() = nb::none(),
           nb::arg("value_policy").none() = nb::none(), nb::kw_only(), nb::arg("workers") = 1,
           nb::arg("readers").none() = nb::none(), nb::arg("chunk") = phasekv::kAppendChunk,
           "Plans again into this object.")
      .def("run", &append_run, nb::arg("kv"), nb::arg("new_indptr"), nb::arg("keys"),
           nb::arg("values"), nb::arg("key_policy").none() = nb::none(),
           nb::arg("value_policy").none() = nb::none(),
           "Writes the entries and raw tokens into kv's pools in place (GIL released). The "
           "arguments must be what the plan was made for (ValueError naming the field, "
           "nothing written, otherwise). Afterwards set kv's lengths to lengths_after.")
      .def_prop_ro(
          "lengths_after",
          [](const PyAppendPlan& s) {
            return nb::module_::import_("numpy").attr("array")(s.plan.lengths_after(), "int64");
          },
          "The lengths after the append (a new int64 array).");
  plan_properties(append);

  m.def("paged_append", &paged_append_once, nb::arg("kv"), nb::arg("new_indptr"), nb::arg("keys"),
        nb::arg("values"), nb::arg("key_policy"), nb::arg("value_policy").none() = nb::none(),
        nb::kw_only(), nb::arg("threads") = 1,
        "A one-off compressed append without a plan (what AppendPlan does, checked in full "
        "and split by sequence over `threads`): the same bits as AppendPlan.run.");

  m.def(
      "page_needs",
      [](i64 n, i64 raw_page_size, i64 entry_page_size, nb::handle geometry, i64 local, i64 window,
         i64 ring_slots, nb::handle origins) {
        const char* fn = "phasekv.serving.page_needs";
        const phasekv::cpu::VisibilityRule rule = make_rule(fn, geometry, local, window);
        const phasekv::PageNeeds p =
            phasekv::page_needs(rule, ring_slots, n, raw_page_size, entry_page_size,
                                origins_arg(fn, "origins", origins));
        return nb::make_tuple(p.raw_pages, p.entry_pages);
      },
      nb::arg("n"), nb::kw_only(), nb::arg("raw_page_size"), nb::arg("entry_page_size") = 1,
      nb::arg("geometry").none() = nb::none(), nb::arg("local") = 0, nb::arg("window") = 0,
      nb::arg("ring_slots") = 0, nb::arg("origins").none() = nb::none(),
      "(raw_pages, entry_pages) the tables of a sequence of n tokens must list (for a step "
      "appending t tokens, ask for n + t before planning); with per-KV-head origins, the "
      "entries of the smallest origin and the ring from the largest.");

  m.def(
      "count_page_readers",
      [](const PyPagedKV& kv, nb::handle raw_obj, nb::handle entry_obj) {
        const char* fn = "phasekv.serving.count_page_readers";
        return std::visit(
            [&](const auto& k) {
              auto raw = output_i32(fn, "raw_readers", raw_obj, {k.raw_pool.pages});
              std::pair<nb::object, std::int32_t*> ent{nb::none(), nullptr};
              if (k.uses_entries())
                ent = output_i32(fn, "entry_readers", entry_obj, {k.entry_pool.pages});
              phasekv::count_page_readers(k, raw.second, ent.second);
              return nb::make_tuple(raw.first, ent.first);
            },
            kv.kv);
      },
      nb::arg("kv"), nb::arg("raw_readers").none() = nb::none(),
      nb::arg("entry_readers").none() = nb::none(),
      "(raw_readers, entry_readers): int32 counts, per page of kv's pools, of the sequences "
      "of kv (every live sequence) that list it among the pages they use (entry_readers None "
      "for an uncompressed layer). Pass them as AppendPlan's readers.");
  m.def(
      "writable_from",
      [](const PyPagedKV& kv, i64 b) {
        const phasekv::WritableFrom w =
            std::visit([&](const auto& k) { return phasekv::writable_from(k, b); }, kv.kv);
        return nb::make_tuple(w.raw, w.entries);
      },
      nb::arg("kv"), nb::arg("b"),
      "(raw, entries): for sequence b of kv (every live sequence), the first raw and entry "
      "table index from which every page it uses is listed by no other sequence (pages below "
      "it are shared: copy them before writing).");
}

}  // namespace phasekv_py
