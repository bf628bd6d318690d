// The built-in compressor policies and the streaming cache as Python objects, shared by
// compress.cpp (which binds them) and attention.cpp (which decodes over a cache).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <variant>
#include <vector>

#include "common.hpp"
#include "phasekv/attention/visible_set.hpp"
#include "phasekv/compress/fixed_gates.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/max_pool.hpp"
#include "phasekv/compress/offset_select.hpp"
#include "phasekv/compress/uniform_mean.hpp"

namespace phasekv_py {

/// One of the built-in policies.
using AnyPolicy = std::variant<phasekv::UniformMean, phasekv::OffsetSelect, phasekv::MaxPool,
                               phasekv::GatedPool, phasekv::FixedGates>;

/// The Python name of the policy type of AnyPolicy alternative `index`.
inline const char* policy_type_name(std::size_t index) {
  switch (index) {
    case 0: return "UniformMean";
    case 1: return "OffsetSelect";
    case 2: return "MaxPool";
    case 3: return "GatedPool";
    default: return "FixedGates";
  }
}

/// The Python name of a policy's type.
inline const char* policy_name(const AnyPolicy& p) { return policy_type_name(p.index()); }

/// A policy as Python holds it: the C++ policy (non-owning pointers into parameter arrays) and
/// the Python arrays it points into, kept alive as long as the policy.
struct Policy {
  AnyPolicy p;                   ///< The C++ policy.
  std::vector<nb::object> keep;  ///< Parameter arrays the policy reads.
};

/// The visible set of a cache in its storage type.
using AnyVisible = std::variant<phasekv::VisibleKV<float>, phasekv::VisibleKV<phasekv::bf16_t>,
                                phasekv::VisibleKV<phasekv::f16_t>>;

/// The per-KV-head visible sets of a cache (one one-head set per KV head) in its storage type.
using AnyVisibleHeads = std::variant<std::vector<phasekv::VisibleKV<float>>,
                                     std::vector<phasekv::VisibleKV<phasekv::bf16_t>>,
                                     std::vector<phasekv::VisibleKV<phasekv::f16_t>>>;

/// A CompressedCache of any storage type and built-in policy (the same policy type for keys
/// and values), behind virtual calls. Calls lock `mu` (they run without the GIL).
struct CacheBase {
  virtual ~CacheBase() = default;
  /// Appends caller K/V arrays (checked by the C++ cache; nothing written on error).
  virtual void append(const Array& keys, const Array& values) = 0;
  /// The visible set of a decode query at position size() - 1 with local window `local`
  /// (every KV head; the C++ cache refuses it when the heads' origins differ).
  virtual AnyVisible visible(std::int64_t local) const = 0;
  /// The visible set of each KV head (its own origin).
  virtual AnyVisibleHeads visible_per_head(std::int64_t local) const = 0;
  /// The origin of every KV head.
  virtual const std::vector<std::int64_t>& origins() const = 0;
  /// The geometry (W, S, O_h) of KV head h (checks h).
  virtual phasekv::Geometry head_geometry(std::int64_t h) const = 0;
  /// J_h(n) of KV head h (checks h).
  virtual std::int64_t head_num_entries(std::int64_t h) const = 0;
  virtual std::int64_t size() const = 0;
  virtual std::int64_t max_length() const = 0;
  virtual std::int64_t num_entries() const = 0;
  virtual std::int64_t max_entries() const = 0;
  virtual std::int64_t kv_heads() const = 0;
  virtual std::int64_t key_dim() const = 0;
  virtual std::int64_t value_dim() const = 0;
  virtual std::int64_t local() const = 0;
  virtual phasekv::Geometry geometry() const = 0;
  virtual std::int64_t memory_bytes() const = 0;
  virtual std::int64_t uncompressed_bytes() const = 0;
  virtual double memory_ratio() const = 0;
  virtual void clear() = 0;
  /// The J(n) entry keys / values as numpy views (owner: the Python cache object); with a
  /// head h, that head's J_h(n) entries `[J_h(n), 1, d]` (checks h).
  virtual nb::object entries(bool keys, nb::handle owner,
                             std::optional<std::int64_t> head) const = 0;

  Dtype dtype = Dtype::f32;  ///< Storage type.
  mutable std::mutex mu;     ///< Serializes calls from Python threads.
  nb::object key_policy;     ///< The Python policies (keep their parameters alive).
  nb::object value_policy;
};

/// The Python object phasekv.CompressedCache.
struct PyCache {
  std::unique_ptr<CacheBase> c;
};

}  // namespace phasekv_py
