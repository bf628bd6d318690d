// The built-in compressor policies, compress_batch and the streaming CompressedCache
// (phasekv/compress/).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "policy.hpp"

namespace phasekv_py {

namespace {

using phasekv::Geometry;

struct PyUniformMean : Policy {};
struct PyOffsetSelect : Policy {};
struct PyMaxPool : Policy {};
struct PyGatedPool : Policy {};
struct PyFixedGates : Policy {};

Geometry policy_geometry(const Policy& p) {
  return std::visit([](const auto& q) { return q.geometry(); }, p.p);
}

std::string policy_repr(const Policy& p) {
  const Geometry g = policy_geometry(p);
  std::ostringstream os;
  os << policy_name(p.p) << "(Geometry(window=" << g.window() << ", stride=" << g.stride()
     << ", origin=" << g.origin()
     << "), input_dim=" << std::visit([](const auto& q) { return q.input_dim(); }, p.p)
     << ", output_dim=" << std::visit([](const auto& q) { return q.output_dim(); }, p.p) << ")";
  return os.str();
}

// A float32 C-contiguous parameter array (or None) as a ParamView; `keep` gets the array.
phasekv::ParamView param(const char* fn, const char* name, nb::handle obj,
                         std::vector<nb::object>& keep) {
  if (obj.is_none()) return phasekv::ParamView{};
  Array a = import_array(fn, name, obj, false);
  require_f32(a);
  require_contiguous(a);
  require_aligned(a, 4);
  if (a.ndim() > phasekv::ParamView::kMaxRank)
    value_error(fn, name, "has shape " + a.shape_text() + "; expected at most 4 dimensions");
  phasekv::ParamView v;
  v.data = static_cast<const float*>(a.data());
  v.rank = static_cast<int>(a.ndim());
  for (std::int64_t i = 0; i < a.ndim(); ++i) v.shape[i] = a.shape(i);
  keep.push_back(nb::borrow(obj));
  return v;
}

template <class T, class P>
class CacheImpl final : public CacheBase {
 public:
  CacheImpl(const P& kp, const P& vp, std::int64_t kv_heads, std::int64_t d_k, std::int64_t d_v,
            std::int64_t local, std::int64_t max_length, phasekv::Layout layout,
            const std::vector<std::int64_t>& origins)
      : c_(kp, vp, kv_heads, d_k, d_v, local, max_length, layout, origins) {}

  void append(const Array& keys, const Array& values) override {
    const auto k = kv_view<const T>(keys);
    const auto v = kv_view<const T>(values);
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu);
    c_.append(k, v);
  }
  AnyVisible visible(std::int64_t local) const override { return c_.visible(local); }
  AnyVisibleHeads visible_per_head(std::int64_t local) const override {
    return c_.visible_per_head(local);
  }
  const std::vector<std::int64_t>& origins() const override { return c_.origins(); }
  Geometry head_geometry(std::int64_t h) const override { return c_.head_geometry(h); }
  std::int64_t head_num_entries(std::int64_t h) const override { return c_.num_entries(h); }
  std::int64_t size() const override { return c_.size(); }
  std::int64_t max_length() const override { return c_.max_length(); }
  std::int64_t num_entries() const override { return c_.num_entries(); }
  std::int64_t max_entries() const override { return c_.max_entries(); }
  std::int64_t kv_heads() const override { return c_.kv_heads(); }
  std::int64_t key_dim() const override { return c_.key_dim(); }
  std::int64_t value_dim() const override { return c_.value_dim(); }
  std::int64_t local() const override { return c_.local(); }
  Geometry geometry() const override { return c_.geometry(); }
  std::int64_t memory_bytes() const override { return c_.memory_bytes(); }
  std::int64_t uncompressed_bytes() const override { return c_.uncompressed_bytes(); }
  double memory_ratio() const override { return c_.memory_ratio(); }
  void clear() override {
    std::lock_guard<std::mutex> lock(mu);
    c_.clear();
  }
  nb::object entries(bool keys, nb::handle owner, std::optional<std::int64_t> head) const override {
    if (head) return export_view<T>(keys ? c_.entry_keys(*head) : c_.entry_values(*head), owner);
    return export_view<T>(keys ? c_.entry_keys() : c_.entry_values(), owner);
  }

 private:
  phasekv::CompressedCache<T, P, P> c_;
};

std::unique_ptr<CacheBase> make_cache(Dtype dtype, nb::handle key_obj, nb::handle value_obj,
                                      std::int64_t kv_heads, std::int64_t d_k, std::int64_t d_v,
                                      std::int64_t local, std::int64_t max_length,
                                      phasekv::Layout layout,
                                      const std::vector<std::int64_t>& origins) {
  const char* fn = "phasekv.CompressedCache";
  const Policy& kp = nb::cast<const Policy&>(key_obj);
  const Policy& vp = nb::cast<const Policy&>(value_obj);
  if (kp.p.index() != vp.p.index())
    type_error(fn, "value_policy",
               std::string("is a ") + policy_name(vp.p) + "; the cache takes keys and values " +
                   "compressed by the same policy type (key_policy is a " + policy_name(kp.p) +
                   ")");
  std::unique_ptr<CacheBase> c = std::visit(
      [&](const auto& k) -> std::unique_ptr<CacheBase> {
        using P = std::decay_t<decltype(k)>;
        const P& v = std::get<P>(vp.p);
        return dispatch_dtype(dtype, [&](auto t) -> std::unique_ptr<CacheBase> {
          using T = decltype(t);
          return std::make_unique<CacheImpl<T, P>>(k, v, kv_heads, d_k, d_v, local, max_length,
                                                   layout, origins);
        });
      },
      kp.p);
  c->dtype = dtype;
  c->key_policy = nb::borrow(key_obj);
  c->value_policy = nb::borrow(value_obj);
  return c;
}

phasekv::Layout parse_layout(const char* fn, const std::string& layout) {
  if (layout == "NHD") return phasekv::Layout::NHD;
  if (layout == "HND") return phasekv::Layout::HND;
  value_error(fn, "layout", "= '" + layout + "' is invalid (must be 'NHD' or 'HND')");
}

}  // namespace

void bind_compress(nb::module_& m) {
  nb::class_<Policy>(m, "Policy",
                     "A compressor policy: turns each complete window of W token vectors into "
                     "one cache entry. Built by UniformMean, OffsetSelect, MaxPool, GatedPool "
                     "or FixedGates.")
      .def_prop_ro("geometry", &policy_geometry, "The chunk geometry (W, S, O).")
      .def_prop_ro(
          "input_dim",
          [](const Policy& p) {
            return std::visit([](const auto& q) { return q.input_dim(); }, p.p);
          },
          "Channels of a raw token vector (d_in).")
      .def_prop_ro(
          "output_dim",
          [](const Policy& p) {
            return std::visit([](const auto& q) { return q.output_dim(); }, p.p);
          },
          "Channels of an entry (d_out).")
      .def_prop_ro(
          "kv_heads",
          [](const Policy& p) {
            return std::visit([](const auto& q) { return phasekv::policy_kv_heads(q); }, p.p);
          },
          "KV heads the parameters cover (0: any head count).")
      .def("__repr__", &policy_repr);

  nb::class_<PyUniformMean, Policy>(m, "UniformMean",
                                    "Mean pooling: every entry is the mean of its W tokens.")
      .def(
          "__init__",
          [](PyUniformMean* self, const Geometry& g, std::int64_t dim) {
            const phasekv::UniformMean p(g, dim);
            new (self) PyUniformMean();
            self->p = p;
          },
          nb::arg("geometry"), nb::arg("dim"));
  nb::class_<PyOffsetSelect, Policy>(
      m, "OffsetSelect", "One-hot selection: every entry is the token at in-window offset r.")
      .def(
          "__init__",
          [](PyOffsetSelect* self, const Geometry& g, std::int64_t dim, std::int64_t offset) {
            const phasekv::OffsetSelect p(g, dim, offset);
            new (self) PyOffsetSelect();
            self->p = p;
          },
          nb::arg("geometry"), nb::arg("dim"), nb::arg("offset"))
      .def_prop_ro("offset", [](const PyOffsetSelect& p) {
        return std::get<phasekv::OffsetSelect>(p.p).offset();
      });
  nb::class_<PyMaxPool, Policy>(m, "MaxPool",
                                "Element-wise max pooling over the window (NaN propagates).")
      .def(
          "__init__",
          [](PyMaxPool* self, const Geometry& g, std::int64_t dim) {
            const phasekv::MaxPool p(g, dim);
            new (self) PyMaxPool();
            self->p = p;
          },
          nb::arg("geometry"), nb::arg("dim"));
  nb::class_<PyGatedPool, Policy>(
      m, "GatedPool",
      "Gated pooling (the paper's and DeepSeek-V4's compressor): gate logits "
      "s_i = Z_i x_i + b_i, alpha = softmax over the window, entry = sum_i alpha_i * C_i x_i. "
      "Parameters are float32 C-contiguous arrays read in place (kept alive by the policy): "
      "gate_weight [kv_heads, W, G, d_in], gate_bias [kv_heads, W, G], payload "
      "[kv_heads, W, d_out, d_in]; G = 1 (gates='scalar') or d_out (gates='vector'); None = "
      "absent (zero Z, zero b, identity C).")
      .def(
          "__init__",
          [](PyGatedPool* self, const Geometry& g, std::int64_t kv_heads, std::int64_t d_in,
             std::int64_t d_out, const std::string& gates, nb::handle gate_weight,
             nb::handle gate_bias, nb::handle payload) {
            const char* fn = "phasekv.GatedPool";
            phasekv::GateKind kind = phasekv::GateKind::scalar;
            if (gates == "vector")
              kind = phasekv::GateKind::vector;
            else if (gates != "scalar")
              value_error(fn, "gates",
                          "= '" + gates + "' is invalid (must be 'scalar' or 'vector')");
            std::vector<nb::object> keep;
            const phasekv::ParamView z = param(fn, "gate_weight", gate_weight, keep);
            const phasekv::ParamView b = param(fn, "gate_bias", gate_bias, keep);
            const phasekv::ParamView c = param(fn, "payload", payload, keep);
            const phasekv::GatedPool p(g, kv_heads, d_in, d_out, kind, z, b, c);
            new (self) PyGatedPool();
            self->p = p;
            self->keep = std::move(keep);
          },
          nb::arg("geometry"), nb::arg("kv_heads"), nb::arg("d_in"), nb::arg("d_out"),
          nb::arg("gates") = "scalar", nb::arg("gate_weight").none() = nb::none(),
          nb::arg("gate_bias").none() = nb::none(), nb::arg("payload").none() = nb::none())
      .def(
          "cycled",
          [](const PyGatedPool& self, std::int64_t delta) {
            PyGatedPool r;
            r.p = std::get<phasekv::GatedPool>(self.p).cycled(delta);
            r.keep = self.keep;
            return r;
          },
          nb::arg("delta"),
          "The same policy with the gate parameters of offset i acting at (i + delta) mod W "
          "(gate cycling, the paper's intervention); payload maps stay.")
      .def_prop_ro("gate_shift", [](const PyGatedPool& p) {
        return std::get<phasekv::GatedPool>(p.p).gate_shift();
      });
  nb::class_<PyFixedGates, Policy>(
      m, "FixedGates",
      "Fixed weights per head and offset: entry = sum_i w[h, i] x_i; weights is a float32 "
      "C-contiguous [heads, W] array read in place, or None for uniform 1/W.")
      .def(
          "__init__",
          [](PyFixedGates* self, const Geometry& g, std::int64_t dim, std::int64_t heads,
             nb::handle weights) {
            const char* fn = "phasekv.FixedGates";
            std::vector<nb::object> keep;
            const float* w = nullptr;
            if (!weights.is_none()) {
              Array a = import_array(fn, "weights", weights, false);
              w = dense_f32(a, {heads, g.window()});
              keep.push_back(nb::borrow(weights));
            }
            const phasekv::FixedGates p(g, dim, heads, w);
            new (self) PyFixedGates();
            self->p = p;
            self->keep = std::move(keep);
          },
          nb::arg("geometry"), nb::arg("dim"), nb::arg("heads"),
          nb::arg("weights").none() = nb::none());

  m.def(
      "compress_batch",
      [](const Policy& policy, nb::handle raw_obj, nb::handle entries_obj, int threads,
         nb::handle origins_obj) {
        const char* fn = "phasekv.compress_batch";
        check_threads(fn, threads);
        const std::vector<std::int64_t> origins = origins_arg(fn, "origins", origins_obj);
        Array raw = import_array(fn, "raw", raw_obj, false);
        Array entries = import_array(fn, "entries", entries_obj, true);
        const Dtype d = storage_dtype(raw);
        return std::visit(
            [&](const auto& p) {
              return dispatch_dtype(d, [&](auto t) {
                using T = decltype(t);
                const phasekv::StridedView<const T> r = kv_view<const T>(raw);
                const phasekv::StridedView<T> e = kv_view<T>(entries);
                // Uniform: checked here; per-head origins: every thread makes the same checks
                // before writing anything (the pool rethrows).
                std::int64_t j = origins.empty() ? phasekv::check_compress_batch<T>(p, r, e) : 0;
                nb::gil_scoped_release release;
                run_threads(threads, [&](int i, int count) {
                  const std::int64_t ji = phasekv::compress_batch<T>(p, origins, r, e, i, count);
                  if (i == 0) j = ji;
                });
                return j;
              });
            },
            policy.p);
      },
      nb::arg("policy"), nb::arg("raw"), nb::arg("entries"), nb::arg("threads") = 1,
      nb::arg("origins").none() = nb::none(),
      "Compresses a whole prefill: raw [n, kv_heads, d_in] (position t at row t, any token "
      "and head strides, unit stride along d_in) into entries [>= J(n), kv_heads, d_out] of "
      "the same dtype (float32, bfloat16 or float16), in place. Returns J(n). Bit-identical "
      "to streaming the same tokens through a CompressedCache, for any thread count. origins: "
      "one origin per KV head (the policy's origin must be 0): entry j of head h is window "
      "[O_h + j*S, O_h + j*S + W) of head h, written for j < J_h(n); J(n) is then the largest "
      "J_h(n), and head h's rows at and above J_h(n) are left untouched.");

  nb::class_<PyCache>(m, "CompressedCache",
                      "A streaming compressed KV cache: the raw prefix, one entry per complete "
                      "window, and a ring of the last max(W, L) raw tokens. Appending tokens "
                      "emits each entry when its window completes, the same bits as "
                      "compress_batch.")
      .def(
          "__init__",
          [](PyCache* self, nb::handle key_policy, nb::handle value_policy, std::int64_t kv_heads,
             std::int64_t d_k, std::int64_t d_v, std::int64_t local, std::int64_t max_length,
             nb::handle dtype, const std::string& layout, nb::handle origins) {
            const char* fn = "phasekv.CompressedCache";
            if (!nb::isinstance<Policy>(key_policy))
              type_error(fn, "key_policy", "must be a phasekv policy (UniformMean, ...)");
            if (value_policy.is_none()) value_policy = key_policy;
            if (!nb::isinstance<Policy>(value_policy))
              type_error(fn, "value_policy", "must be a phasekv policy or None");
            auto c = make_cache(parse_dtype(fn, "dtype", dtype), key_policy, value_policy, kv_heads,
                                d_k, d_v, local, max_length, parse_layout(fn, layout),
                                origins_arg(fn, "origins", origins));
            new (self) PyCache();
            self->c = std::move(c);
          },
          nb::arg("key_policy"), nb::arg("value_policy").none() = nb::none(), nb::kw_only(),
          nb::arg("kv_heads"), nb::arg("d_k"), nb::arg("d_v"), nb::arg("local"),
          nb::arg("max_length"), nb::arg("dtype") = "float32", nb::arg("layout") = "NHD",
          nb::arg("origins").none() = nb::none(),
          "An owning cache for max_length tokens; value_policy None means key_policy. Both "
          "policies must be of the same type and geometry; their input and output dims must "
          "be d_k (keys) and d_v (values). origins: one origin O_h per KV head (each in "
          "[0, 2^40], any value, also >= S; the policies' origin must then be 0): KV head h "
          "has windows [O_h + j*S, O_h + j*S + W), raw prefix [0, O_h), and sees what "
          "Geometry(W, S, O_h) shows. None: every head at the policies' origin.")
      .def(
          "append",
          [](PyCache& self, nb::handle keys, nb::handle values) {
            const char* fn = "phasekv.CompressedCache.append";
            Array k = import_array(fn, "keys", keys, false);
            Array v = import_array(fn, "values", values, false);
            require_dtype(k, self.c->dtype);
            require_dtype(v, self.c->dtype);
            self.c->append(k, v);
          },
          nb::arg("keys"), nb::arg("values"),
          "Appends t tokens: keys [t, kv_heads, d_k], values [t, kv_heads, d_v] in the cache's "
          "dtype (any token/head strides). Raises (writing nothing) on a shape mismatch or when "
          "the cache would exceed max_length.")
      .def(
          "clear", [](PyCache& self) { self.c->clear(); }, "Forgets every token.")
      .def(
          "visible",
          [](const PyCache& self, std::optional<std::int64_t> local,
             std::optional<std::int64_t> head) {
            const std::int64_t l = local ? *local : self.c->local();
            if (head) {
              const phasekv::Geometry g = self.c->head_geometry(*head);  // checks `head`
              (void)self.c->visible_per_head(l);                         // checks `local`
              return g.visible(self.c->size(), l);
            }
            if (!phasekv::origins_uniform(self.c->origins()))
              value_error("phasekv.CompressedCache.visible", "origins",
                          "differ between KV heads: pass head=h, or use visible_per_head()");
            (void)self.c->visible(l);  // checks `local`
            return self.c->head_geometry(0).visible(self.c->size(), l);
          },
          nb::arg("local").none() = nb::none(), nb::arg("head").none() = nb::none(),
          "The Visibility of a decode query at position size - 1 (local window: the cache's "
          "by default, any smaller one allowed). With per-head origins that differ, pass the "
          "KV head (or use visible_per_head).")
      .def(
          "visible_per_head",
          [](const PyCache& self, std::optional<std::int64_t> local) {
            const std::int64_t l = local ? *local : self.c->local();
            (void)self.c->visible_per_head(l);  // checks `local`
            nb::list r;
            for (std::int64_t h = 0; h < self.c->kv_heads(); ++h)
              r.append(self.c->head_geometry(h).visible(self.c->size(), l));
            return r;
          },
          nb::arg("local").none() = nb::none(),
          "The Visibility of each KV head (a list of kv_heads), each with its own origin.")
      .def(
          "entry_keys",
          [](nb::handle self, std::optional<std::int64_t> head) {
            return nb::cast<const PyCache&>(self).c->entries(true, self, head);
          },
          nb::arg("head").none() = nb::none(),
          "The J(n) compressed keys [J(n), kv_heads, d_k] as a read-only numpy view of the "
          "cache's memory (valid while the cache lives; later appends write into it). With "
          "per-head origins, J(n) is the largest J_h(n) and head h's rows at and above J_h(n) "
          "are not entries; entry_keys(head=h) is head h's J_h(n) entries [J_h(n), 1, d_k].")
      .def(
          "entry_values",
          [](nb::handle self, std::optional<std::int64_t> head) {
            return nb::cast<const PyCache&>(self).c->entries(false, self, head);
          },
          nb::arg("head").none() = nb::none(),
          "The J(n) compressed values [J(n), kv_heads, d_v] (see entry_keys).")
      .def(
          "head_geometry", [](const PyCache& s, std::int64_t h) { return s.c->head_geometry(h); },
          nb::arg("h"), "The Geometry (W, S, O_h) of KV head h.")
      .def(
          "head_num_entries",
          [](const PyCache& s, std::int64_t h) { return s.c->head_num_entries(h); }, nb::arg("h"),
          "Compressed entries of KV head h so far, J_h(n).")
      .def_prop_ro(
          "origins", [](const PyCache& s) { return s.c->origins(); },
          "The origin of every KV head (a list of kv_heads; all geometry.origin unless the "
          "cache was built with origins).")
      .def_prop_ro(
          "size", [](const PyCache& s) { return s.c->size(); }, "Tokens appended (n).")
      .def("__len__", [](const PyCache& s) { return s.c->size(); })
      .def_prop_ro("max_length", [](const PyCache& s) { return s.c->max_length(); })
      .def_prop_ro(
          "num_entries", [](const PyCache& s) { return s.c->num_entries(); },
          "Compressed entry rows in use so far, J(n) (with per-head origins the largest "
          "J_h(n); see head_num_entries).")
      .def_prop_ro("max_entries", [](const PyCache& s) { return s.c->max_entries(); })
      .def_prop_ro("kv_heads", [](const PyCache& s) { return s.c->kv_heads(); })
      .def_prop_ro("key_dim", [](const PyCache& s) { return s.c->key_dim(); })
      .def_prop_ro("value_dim", [](const PyCache& s) { return s.c->value_dim(); })
      .def_prop_ro("local", [](const PyCache& s) { return s.c->local(); })
      .def_prop_ro("geometry", [](const PyCache& s) { return s.c->geometry(); })
      .def_prop_ro("dtype", [](const PyCache& s) { return std::string(dtype_name(s.c->dtype)); })
      .def_prop_ro("key_policy", [](const PyCache& s) { return s.c->key_policy; })
      .def_prop_ro("value_policy", [](const PyCache& s) { return s.c->value_policy; })
      .def_prop_ro(
          "memory_bytes", [](const PyCache& s) { return s.c->memory_bytes(); },
          "Bytes of K/V the cache holds for the current n.")
      .def_prop_ro(
          "uncompressed_bytes", [](const PyCache& s) { return s.c->uncompressed_bytes(); },
          "Bytes an uncompressed cache of the same length would hold.")
      .def_prop_ro(
          "memory_ratio", [](const PyCache& s) { return s.c->memory_ratio(); },
          "memory_bytes / uncompressed_bytes (1 when n = 0).");
}

}  // namespace phasekv_py
