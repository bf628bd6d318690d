// Shared pieces of the phasekv._core bindings: importing caller arrays without copies
// (DLPack or the buffer protocol, through nanobind), checking them with errors that name the
// argument, describing them as phasekv views, and dispatching on the storage type.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "phasekv/attention/cpu/thread_pool.hpp"
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/attention/params.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/serving/paged.hpp"

namespace phasekv_py {

namespace nb = nanobind;

/// Storage types of K/V arrays.
enum class Dtype { f32, bf16, f16 };

/// Python-visible name of a storage type.
inline const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::f32: return "float32";
    case Dtype::bf16: return "bfloat16";
    case Dtype::f16: return "float16";
  }
  return "?";
}

/// Parses a dtype argument: "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16", or any
/// object whose str() ends in one of those (numpy, ml_dtypes and torch dtypes).
Dtype parse_dtype(const char* fn, const char* name, nb::handle obj);

/// A caller array imported without a copy: the nanobind handle keeps it alive.
struct Array {
  nb::ndarray<nb::ro> a;  ///< The import (read-only view; writability checked separately).
  const char* name = "";  ///< Argument name, for messages.
  const char* fn = "";    ///< Function name, for messages.
  bool bf16 = false;      ///< A numpy ml_dtypes.bfloat16 array imported as its uint16 bits.

  std::int64_t ndim() const { return static_cast<std::int64_t>(a.ndim()); }
  std::int64_t shape(std::int64_t i) const { return static_cast<std::int64_t>(a.shape(i)); }
  std::int64_t stride(std::int64_t i) const { return a.stride(static_cast<std::size_t>(i)); }
  void* data() const { return const_cast<void*>(a.data()); }
  std::string shape_text() const;
};

/// Imports `obj` (argument `name` of `fn`) as a CPU array without copying. Raises TypeError
/// when it is not an array (DLPack or buffer protocol) and ValueError when it is not in host
/// memory, or is read-only while `writable` is asked.
Array import_array(const char* fn, const char* name, nb::handle obj, bool writable);

/// Raises TypeError unless the array holds floats of a storage type; returns it.
Dtype storage_dtype(const Array& a);

/// Raises TypeError unless the array holds `want`.
void require_dtype(const Array& a, Dtype want);

/// Raises TypeError unless the array holds float32.
void require_f32(const Array& a);

/// Raises TypeError unless the array holds signed or unsigned integers of 64 bits (int64).
void require_i64(const Array& a);

/// Raises TypeError unless the array holds int32.
void require_i32(const Array& a);

/// Raises TypeError unless the array holds uint8 (bytes).
void require_u8(const Array& a);

/// True when the array holds uint8 (bytes).
bool is_u8(const Array& a);

/// Raises ValueError unless the array has exactly `shape` (-1 = any extent).
void require_shape(const Array& a, std::initializer_list<std::int64_t> shape);

/// Raises ValueError unless the array is C-contiguous (dense, row-major).
void require_contiguous(const Array& a);

/// Raises ValueError unless the data pointer is aligned to `bytes`.
void require_aligned(const Array& a, std::int64_t bytes);

/// A float32 C-contiguous array of exactly `shape`: its data.
float* dense_f32(const Array& a, std::initializer_list<std::int64_t> shape);

/// Imports input `obj` (argument `name` of `fn`) as a float32 C-contiguous array of `shape`
/// (-1 = any extent); its data is `data()`.
Array input_f32(const char* fn, const char* name, nb::handle obj,
                std::initializer_list<std::int64_t> shape);

/// The same for an int32 array.
Array input_i32(const char* fn, const char* name, nb::handle obj,
                std::initializer_list<std::int64_t> shape);

/// An int32 C-contiguous array of exactly `shape` (-1 = any extent): its data.
const std::int32_t* dense_i32(const Array& a, std::initializer_list<std::int64_t> shape);

/// An int64 C-contiguous array of exactly `shape` (-1 = any extent): its data.
const std::int64_t* dense_i64(const Array& a, std::initializer_list<std::int64_t> shape);

/// The import of an optional input argument (None: nullopt).
std::optional<Array> optional_array(const char* fn, const char* name, nb::handle obj);

/// A float32 C-contiguous output of exactly `shape`: the caller's array `obj` (checked, written
/// in place) or, when `obj` is None, a new numpy array. Returns the object and its data.
std::pair<nb::object, float*> output_f32(const char* fn, const char* name, nb::handle obj,
                                         std::initializer_list<std::int64_t> shape);

/// An int32 C-contiguous output of exactly `shape` (as output_f32).
std::pair<nb::object, std::int32_t*> output_i32(const char* fn, const char* name, nb::handle obj,
                                                std::initializer_list<std::int64_t> shape);

/// An optional per-KV-head origin list (argument `name` of `fn`): None gives an empty list
/// (every head at the geometry's origin), a sequence of integers (list, tuple, 1-D integer
/// array) its values. Raises TypeError otherwise; the values are checked by the C++ call
/// that takes them (naming `origins.size()` or `origins[h]`).
std::vector<std::int64_t> origins_arg(const char* fn, const char* name, nb::handle obj);

/// Raises ValueError naming `name` = `value` and the requirement.
[[noreturn]] void value_error(const char* fn, const char* name, const std::string& what);
/// Raises TypeError naming `name` and the requirement.
[[noreturn]] void type_error(const char* fn, const char* name, const std::string& what);

/// Element type of a storage dtype.
template <Dtype D>
struct dtype_type;
template <>
struct dtype_type<Dtype::f32> {
  using type = float;
};
template <>
struct dtype_type<Dtype::bf16> {
  using type = phasekv::bf16_t;
};
template <>
struct dtype_type<Dtype::f16> {
  using type = phasekv::f16_t;
};

/// Calls `f(T{})` with T the element type of `d` (float, bf16_t, f16_t).
template <class F>
decltype(auto) dispatch_dtype(Dtype d, F&& f) {
  switch (d) {
    case Dtype::bf16: return f(phasekv::bf16_t{});
    case Dtype::f16: return f(phasekv::f16_t{});
    case Dtype::f32: break;
  }
  return f(float{});
}

/// The storage dtype of element type T.
template <class T>
constexpr Dtype dtype_of() {
  if constexpr (std::is_same<T, phasekv::bf16_t>::value)
    return Dtype::bf16;
  else if constexpr (std::is_same<T, phasekv::f16_t>::value)
    return Dtype::f16;
  else
    return Dtype::f32;
}

/// Raises ValueError unless the array is `[tokens, heads, dim]` with unit stride along dim and
/// non-negative token and head strides.
void require_kv_layout(const Array& a);

/// A `[tokens, heads, dim]` array of storage type T (its dtype already checked) as a view:
/// unit stride along dim, non-negative token and head strides (NHD, HND or any slice of
/// them), data aligned to the element. Raises ValueError naming the argument otherwise.
template <class T>
phasekv::StridedView<T> kv_view(const Array& a) {
  require_dtype(a, dtype_of<std::remove_const_t<T>>());
  require_kv_layout(a);
  require_aligned(a, static_cast<std::int64_t>(sizeof(T)));
  phasekv::StridedView<T> v;
  v.data = static_cast<T*>(a.data());
  v.tokens = a.shape(0);
  v.heads = a.shape(1);
  v.dim = a.shape(2);
  v.token_stride = a.stride(0);
  v.head_stride = a.stride(1);
  if (a.a.size() == 0) {  // dense strides for an empty array (its own may be anything)
    v.data = nullptr;
    v.token_stride = v.heads * v.dim;
    v.head_stride = v.dim;
  }
  return v;
}

/// Views numpy uint16 bits as ml_dtypes.bfloat16 when ml_dtypes is importable (else returns
/// the bits).
nb::object view_bf16(nb::object bits);

/// Exports a `[tokens, heads, dim]` view of memory owned by `owner` as a read-only numpy array
/// (no copy) of storage type T: float32, float16, or ml_dtypes.bfloat16 (its uint16 bits
/// without ml_dtypes).
template <class T>
nb::object export_view(const phasekv::StridedView<const T>& v, nb::handle owner) {
  using Bits = std::conditional_t<std::is_same<T, float>::value, float, std::uint16_t>;
  nb::object arr;
  if (v.tokens == 0 || v.heads == 0 || v.dim == 0 || v.data == nullptr) {
    arr = nb::module_::import_("numpy").attr("zeros")(
        nb::make_tuple(v.tokens, v.heads, v.dim),
        std::is_same<T, float>::value ? "float32" : "uint16");
  } else {
    std::size_t shape[3] = {static_cast<std::size_t>(v.tokens), static_cast<std::size_t>(v.heads),
                            static_cast<std::size_t>(v.dim)};
    std::int64_t strides[3] = {v.token_stride, v.head_stride, 1};
    arr = nb::cast(nb::ndarray<nb::numpy, nb::ro>(const_cast<T*>(v.data), 3, shape, owner, strides,
                                                  nb::dtype<Bits>()));
  }
  if constexpr (std::is_same<T, phasekv::f16_t>::value) return arr.attr("view")("float16");
  if constexpr (std::is_same<T, phasekv::bf16_t>::value) return view_bf16(arr);
  return arr;
}

/// The logit options every attention call takes (scale None: 1/sqrt(d_k); sinks: None or a
/// float32 [q_heads] array).
struct Logits {
  std::optional<float> scale;
  float softcap = 0.0f;
  float entry_bias = 0.0f;
  nb::handle sinks;
};

/// The StandardVariant of `o` for `q_heads` query heads of dim `d_k` (checks sinks).
phasekv::StandardVariant make_variant(const char* fn, const Logits& o, std::int64_t q_heads,
                                      std::int64_t d_k);

/// The visibility rule of the arguments geometry / local / window: compressed with a
/// phasekv.Geometry, else causal (window 0) or a sliding window. Raises naming the argument.
phasekv::cpu::VisibilityRule make_rule(const char* fn, nb::handle geometry, std::int64_t local,
                                       std::int64_t window);

/// The argument names of a block table: the dense array, and the two arrays of the CSR form.
struct TableNames {
  const char* table;
  const char* indptr;
  const char* indices;
};
inline constexpr TableNames kBlockTable{"block_table", "block_table[0] (indptr)",
                                        "block_table[1] (indices)"};
inline constexpr TableNames kRawTable{"raw_table", "raw_table[0] (indptr)",
                                      "raw_table[1] (indices)"};
inline constexpr TableNames kEntryTable{"entry_table", "entry_table[0] (indptr)",
                                        "entry_table[1] (indices)"};

/// A block table (no copy): vLLM's dense int32 `[B, max_blocks]`, or FlashInfer's CSR form as
/// a tuple `(indptr [B + 1], indices [nnz])` of int32 arrays; B = -1: any. The caller keeps
/// the arrays alive while the table is used.
phasekv::BlockTable block_table(const char* fn, const TableNames& n, nb::handle obj,
                                std::int64_t B);

/// Calls `f(pool)` with a process-wide phasekv::cpu::ThreadPool of `threads` threads (the
/// caller's included; made again when the count changes), held by one call at a time. Call
/// without the GIL.
void with_pool(int threads, const std::function<void(phasekv::cpu::ThreadPool&)>& f);

/// Runs `f(thread_index, thread_count)` on `threads` threads (the pool of with_pool; no pool
/// for one thread). Call without the GIL.
void run_threads(int threads, const std::function<void(int, int)>& f);

/// Raises ValueError unless 1 <= threads <= 1024.
void check_threads(const char* fn, int threads);

/// The phasekv module's init pieces, one per concept.
void bind_geometry(nb::module_& m);
void bind_compress(nb::module_& m);
void bind_attention(nb::module_& m);
void bind_eval(nb::module_& m);
void bind_dsv4(nb::module_& m);
void bind_sweep(nb::module_& m);
void bind_serving(nb::module_& m);

}  // namespace phasekv_py
