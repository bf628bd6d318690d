/// @file
/// @brief The argument checks the attention entry points share, written once for the CPU
/// kernels and the CUDA host launchers: the head shape (query heads, KV heads, head dims) and
/// the visible set, either as a VisibleKV (decode) or as raw and entry views indexed by
/// position and window (prefill), against that shape.
///
/// Each public entry point checks its arguments once with these and then calls unchecked
/// `detail` functions. A failed check throws phasekv::invalid_argument (or its subclasses
/// shape_error and capacity_error) with the message `where: name = value is invalid
/// (requirement)`.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace detail {

/// Upper bounds of a head shape (a backend's grid or shared-memory limits) and how the
/// requirement reads in a message. The default has no upper bound ("must be >= 1").
struct HeadShapeLimits {
  std::int64_t max_heads = std::numeric_limits<std::int64_t>::max();  ///< Most query heads.
  const char* heads_requirement = "must be >= 1";  ///< Requirement of q_heads in messages.
  std::int64_t max_dim = std::numeric_limits<std::int64_t>::max();  ///< Largest d_k and d_v.
  const char* dim_requirement = "must be >= 1";  ///< Requirement of d_k / d_v in messages.
};

/// The shape a visible set must have, and the names the messages give its parts (the CPU and
/// CUDA decode arguments have `kv_heads`, `d_k`, `d_v` fields; CUDA prefill takes them from
/// `raw_k.heads`, `raw_k.dim`, `raw_v.dim`).
struct KVShape {
  std::int64_t heads = 0;               ///< KV heads every view must have.
  std::int64_t d_k = 0;                 ///< Key head dim.
  std::int64_t d_v = 0;                 ///< Value head dim.
  const char* heads_name = "kv_heads";  ///< Name of `heads` in messages.
  const char* d_k_name = "d_k";         ///< Name of `d_k` in messages.
  const char* d_v_name = "d_v";         ///< Name of `d_v` in messages.
};

/// Throws E naming `view.field` = `value` unless `ok`; the requirement is `requirement` (or
/// "must equal <equal_to>" when `equal_to` is given). The name is built only on failure.
template <class E, class V>
inline void check_view_field(bool ok, const char* where, const char* view, const char* field,
                             const V& value, const char* requirement,
                             const char* equal_to = nullptr) {
  if (ok) return;
  const std::string name = std::string(view) + "." + field;
  const std::string req = equal_to ? std::string("must equal ") + equal_to : requirement;
  phasekv::detail::throw_arg<E>(where, name.c_str(), value, req.c_str());
}

/// Checks a head shape: `q_heads` in [1, max_heads], `kv_heads` >= 1 dividing `q_heads`,
/// `d_k` and `d_v` in [1, max_dim].
inline void check_head_shape(const char* where, std::int64_t q_heads, std::int64_t kv_heads,
                             std::int64_t d_k, std::int64_t d_v, const HeadShapeLimits& lim = {}) {
  phasekv::detail::check_arg(q_heads >= 1 && q_heads <= lim.max_heads, where, "q_heads", q_heads,
                             lim.heads_requirement);
  phasekv::detail::check_arg(kv_heads >= 1, where, "kv_heads", kv_heads, "must be >= 1");
  phasekv::detail::check_arg<shape_error>(q_heads % kv_heads == 0, where, "q_heads", q_heads,
                                          "must be a multiple of kv_heads");
  phasekv::detail::check_arg<shape_error>(d_k >= 1 && d_k <= lim.max_dim, where, "d_k", d_k,
                                          lim.dim_requirement);
  phasekv::detail::check_arg<shape_error>(d_v >= 1 && d_v <= lim.max_dim, where, "d_v", d_v,
                                          lim.dim_requirement);
}

/// Checks a key view `k` and a value view `v` (named `k_name`, `v_name`) against `shape`:
/// valid views, at least `min_tokens` tokens each (`tokens_requirement` in the message;
/// capacity_error), `shape.heads` heads, dims `shape.d_k` and `shape.d_v` (shape_error).
template <class T>
void check_kv_views(const char* where, const char* k_name, const StridedView<T>& k,
                    const char* v_name, const StridedView<T>& v, const KVShape& shape,
                    std::int64_t min_tokens, const char* tokens_requirement) {
  check_view(k, where, k_name);
  check_view(v, where, v_name);
  check_view_field<capacity_error>(k.tokens >= min_tokens, where, k_name, "tokens", k.tokens,
                                   tokens_requirement);
  check_view_field<capacity_error>(v.tokens >= min_tokens, where, v_name, "tokens", v.tokens,
                                   tokens_requirement);
  check_view_field<shape_error>(k.heads == shape.heads, where, k_name, "heads", k.heads, "",
                                shape.heads_name);
  check_view_field<shape_error>(v.heads == shape.heads, where, v_name, "heads", v.heads, "",
                                shape.heads_name);
  check_view_field<shape_error>(k.dim == shape.d_k, where, k_name, "dim", k.dim, "",
                                shape.d_k_name);
  check_view_field<shape_error>(v.dim == shape.d_v, where, v_name, "dim", v.dim, "",
                                shape.d_v_name);
}

/// Checks a decode visible set: `kv.count` in [0, kMaxSegments], and every segment's keys
/// and values valid views of as many tokens as each other, with `shape`'s heads and dims.
template <class T>
void check_visible_set(const char* where, const VisibleKV<T>& kv, const KVShape& shape) {
  phasekv::detail::check_arg(kv.count >= 0 && kv.count <= VisibleKV<T>::kMaxSegments, where,
                             "kv.count", kv.count, "must be in [0, 4]");
  for (int s = 0; s < kv.count; ++s) {
    const KVSegment<T>& seg = kv.segments[s];
    check_kv_views(where, "kv.segments[].keys", seg.keys, "kv.segments[].values", seg.values, shape,
                   0, "must be >= 0");
    phasekv::detail::check_arg<shape_error>(seg.values.tokens == seg.keys.tokens, where,
                                            "kv.segments[].values.tokens", seg.values.tokens,
                                            "must equal keys.tokens");
  }
}

}  // namespace detail
PHASEKV_NAMESPACE_END
