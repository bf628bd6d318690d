// Array import and checks of the bindings (see common.hpp).
#include "common.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <mutex>
#include <vector>

#include "phasekv/attention/cpu/thread_pool.hpp"
#include "phasekv/core/error.hpp"

namespace phasekv_py {

namespace {
// str(obj) as a std::string.
std::string text(nb::handle obj) {
  PyObject* s = PyObject_Str(obj.ptr());
  if (s == nullptr) throw nb::python_error();
  return nb::cast<std::string>(nb::steal<nb::str>(s));
}

std::string py_type_name(nb::handle obj) {
  return text(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()))).attr("__name__"));
}

bool is_numpy_bf16(nb::handle obj) {
  if (!nb::hasattr(obj, "dtype") || !nb::hasattr(obj, "view")) return false;
  try {
    const std::string name = text(obj.attr("dtype"));
    return name == "bfloat16" && py_type_name(obj) == "ndarray";
  } catch (const nb::python_error&) {
    return false;
  } catch (const nb::cast_error&) {
    return false;
  }
}

std::string dtype_text(const nb::dlpack::dtype& d) {
  std::string kind;
  switch (static_cast<nb::dlpack::dtype_code>(d.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: kind = "bool"; break;
    default: kind = "code" + std::to_string(d.code) + "_"; break;
  }
  return kind + std::to_string(d.bits);
}
}  // namespace

void value_error(const char* fn, const char* name, const std::string& what) {
  std::string msg = std::string(fn) + ": " + name + " " + what;
  throw nb::value_error(msg.c_str());
}

void type_error(const char* fn, const char* name, const std::string& what) {
  std::string msg = std::string(fn) + ": " + name + " " + what;
  throw nb::type_error(msg.c_str());
}

std::string Array::shape_text() const {
  std::string s = "(";
  for (std::int64_t i = 0; i < ndim(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape(i));
  }
  if (ndim() == 1) s += ",";
  return s + ")";
}

Array import_array(const char* fn, const char* name, nb::handle obj, bool writable) {
  Array r;
  r.fn = fn;
  r.name = name;
  if (obj.is_none()) type_error(fn, name, "is None; expected an array");
  // One import on the common path (a writable import when an output is asked for); the
  // fallbacks below only tell the failures apart.
  nb::object src = nb::borrow(obj);
  bool ok = false;
  for (int attempt = 0; attempt < 2 && !ok; ++attempt) {
    if (writable) {
      nb::ndarray<> w;
      ok = nb::try_cast(src, w, false);
      if (ok) r.a = nb::ndarray<nb::ro>(w);
    } else {
      ok = nb::try_cast(src, r.a, false);
    }
    if (ok) break;
    if (attempt == 0 && is_numpy_bf16(obj)) {
      // numpy exports ml_dtypes.bfloat16 neither through DLPack nor with a buffer format
      // nanobind reads: take its bits (the same memory).
      src = obj.attr("view")("uint16");
      r.bf16 = true;
    } else {
      break;
    }
  }
  if (!ok) {
    if (writable && nb::try_cast(src, r.a, false))
      value_error(fn, name, "is read-only; an output must be writable");
    type_error(fn, name,
               "must be an array (DLPack or buffer protocol: numpy, torch, jax), got " +
                   py_type_name(obj));
  }
  if (r.a.device_type() != nb::device::cpu::value)
    value_error(fn, name,
                "is on device type " + std::to_string(r.a.device_type()) +
                    "; these functions take host (CPU) memory");
  return r;
}

Dtype storage_dtype(const Array& a) {
  const nb::dlpack::dtype d = a.a.dtype();
  if (a.bf16) return Dtype::bf16;
  if (d.lanes == 1 && d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float)) {
    if (d.bits == 32) return Dtype::f32;
    if (d.bits == 16) return Dtype::f16;
  }
  if (d.lanes == 1 && d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) &&
      d.bits == 16)
    return Dtype::bf16;
  type_error(a.fn, a.name,
             "has dtype " + dtype_text(d) + "; expected float32, bfloat16 or float16");
}

void require_dtype(const Array& a, Dtype want) {
  const Dtype got = storage_dtype(a);
  if (got != want)
    type_error(a.fn, a.name,
               std::string("has dtype ") + dtype_name(got) + "; expected " + dtype_name(want));
}

void require_f32(const Array& a) {
  const nb::dlpack::dtype d = a.a.dtype();
  if (a.bf16 || d.lanes != 1 ||
      d.code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float) || d.bits != 32)
    type_error(
        a.fn, a.name,
        "has dtype " + (a.bf16 ? std::string("bfloat16") : dtype_text(d)) + "; expected float32");
}

void require_i64(const Array& a) {
  const nb::dlpack::dtype d = a.a.dtype();
  if (a.bf16 || d.lanes != 1 || d.code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) ||
      d.bits != 64)
    type_error(a.fn, a.name, "has dtype " + dtype_text(d) + "; expected int64");
}

void require_i32(const Array& a) {
  const nb::dlpack::dtype d = a.a.dtype();
  if (a.bf16 || d.lanes != 1 || d.code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) ||
      d.bits != 32)
    type_error(a.fn, a.name, "has dtype " + dtype_text(d) + "; expected int32");
}

bool is_u8(const Array& a) {
  const nb::dlpack::dtype d = a.a.dtype();
  return !a.bf16 && d.lanes == 1 &&
         d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt) && d.bits == 8;
}

void require_u8(const Array& a) {
  if (!is_u8(a))
    type_error(a.fn, a.name, "has dtype " + dtype_text(a.a.dtype()) + "; expected uint8 (bytes)");
}

void require_shape(const Array& a, std::initializer_list<std::int64_t> shape) {
  bool ok = a.ndim() == static_cast<std::int64_t>(shape.size());
  std::int64_t i = 0;
  std::string want = "(";
  for (std::int64_t s : shape) {
    if (i) want += ", ";
    want += s < 0 ? std::string("*") : std::to_string(s);
    if (ok && s >= 0 && a.shape(i) != s) ok = false;
    ++i;
  }
  if (shape.size() == 1) want += ",";
  want += ")";
  if (!ok) value_error(a.fn, a.name, "has shape " + a.shape_text() + "; expected " + want);
}

void require_contiguous(const Array& a) {
  if (a.a.size() == 0) return;  // no element is addressed
  std::int64_t expect = 1;
  for (std::int64_t i = a.ndim() - 1; i >= 0; --i) {
    if (a.shape(i) > 1 && a.stride(i) != expect)
      value_error(a.fn, a.name,
                  "must be C-contiguous (dense, row-major); its stride along dimension " +
                      std::to_string(i) + " is " + std::to_string(a.stride(i)) +
                      " elements, expected " + std::to_string(expect));
    expect *= a.shape(i);
  }
}

void require_aligned(const Array& a, std::int64_t bytes) {
  if (reinterpret_cast<std::uintptr_t>(a.data()) % static_cast<std::uintptr_t>(bytes) != 0)
    value_error(a.fn, a.name,
                "data is not aligned to its element size (" + std::to_string(bytes) + " bytes)");
}

void require_kv_layout(const Array& a) {
  if (a.ndim() != 3)
    value_error(a.fn, a.name,
                "must have 3 dimensions [tokens, heads, dim], got shape " + a.shape_text());
  if (a.a.size() == 0) return;  // no element is addressed: any strides (DLPack may give 0)
  if (a.shape(2) > 1 && a.stride(2) != 1)
    value_error(a.fn, a.name,
                "must have unit stride along its last dimension (dim); got stride " +
                    std::to_string(a.stride(2)));
  if (a.stride(0) < 0 || a.stride(1) < 0)
    value_error(a.fn, a.name, "must have non-negative strides");
}

float* dense_f32(const Array& a, std::initializer_list<std::int64_t> shape) {
  require_f32(a);
  require_shape(a, shape);
  require_contiguous(a);
  require_aligned(a, 4);
  return static_cast<float*>(a.data());
}

const std::int32_t* dense_i32(const Array& a, std::initializer_list<std::int64_t> shape) {
  require_i32(a);
  require_shape(a, shape);
  require_contiguous(a);
  require_aligned(a, 4);
  return static_cast<const std::int32_t*>(a.data());
}

const std::int64_t* dense_i64(const Array& a, std::initializer_list<std::int64_t> shape) {
  require_i64(a);
  require_shape(a, shape);
  require_contiguous(a);
  require_aligned(a, 8);
  return static_cast<const std::int64_t*>(a.data());
}

Array input_f32(const char* fn, const char* name, nb::handle obj,
                std::initializer_list<std::int64_t> shape) {
  Array a = import_array(fn, name, obj, false);
  dense_f32(a, shape);
  return a;
}

Array input_i32(const char* fn, const char* name, nb::handle obj,
                std::initializer_list<std::int64_t> shape) {
  Array a = import_array(fn, name, obj, false);
  dense_i32(a, shape);
  return a;
}

std::optional<Array> optional_array(const char* fn, const char* name, nb::handle obj) {
  if (obj.is_none()) return std::nullopt;
  return import_array(fn, name, obj, false);
}

namespace {
// The caller's output `obj` or a new numpy array of `dtype`, imported writable.
std::pair<nb::object, Array> output_array(const char* fn, const char* name, nb::handle obj,
                                          std::initializer_list<std::int64_t> shape,
                                          const char* dtype) {
  nb::object o = obj.is_none() ? nb::module_::import_("numpy").attr("empty")(
                                     nb::cast(std::vector<std::int64_t>(shape)), dtype)
                               : nb::borrow(obj);
  Array a = import_array(fn, name, o, true);
  return {o, a};
}
}  // namespace

std::pair<nb::object, float*> output_f32(const char* fn, const char* name, nb::handle obj,
                                         std::initializer_list<std::int64_t> shape) {
  auto r = output_array(fn, name, obj, shape, "float32");
  return {r.first, dense_f32(r.second, shape)};
}

std::pair<nb::object, std::int32_t*> output_i32(const char* fn, const char* name, nb::handle obj,
                                                std::initializer_list<std::int64_t> shape) {
  auto r = output_array(fn, name, obj, shape, "int32");
  return {r.first, const_cast<std::int32_t*>(dense_i32(r.second, shape))};
}

std::vector<std::int64_t> origins_arg(const char* fn, const char* name, nb::handle obj) {
  std::vector<std::int64_t> r;
  if (obj.is_none()) return r;
  if (nb::try_cast(obj, r)) return r;
  if (nb::hasattr(obj, "tolist") && nb::try_cast(obj.attr("tolist")(), r)) return r;
  type_error(
      fn, name,
      "must be None or a sequence of integers (one origin per KV head), got " + py_type_name(obj));
}

Dtype parse_dtype(const char* fn, const char* name, nb::handle obj) {
  std::string s = text(obj);
  const auto ends = [&](const char* suffix) {
    const std::string x(suffix);
    return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (ends("bfloat16") || s == "bf16") return Dtype::bf16;
  if (ends("float16") || s == "f16" || ends("half")) return Dtype::f16;
  if (ends("float32") || s == "f32" || ends("float")) return Dtype::f32;
  type_error(fn, name, "= " + s + " is not a storage type (float32, bfloat16 or float16)");
}

nb::object view_bf16(nb::object bits) {
  try {
    nb::object ml = nb::module_::import_("ml_dtypes");
    return bits.attr("view")(ml.attr("bfloat16"));
  } catch (const nb::python_error&) {
    return bits;
  }
}

phasekv::StandardVariant make_variant(const char* fn, const Logits& o, std::int64_t q_heads,
                                      std::int64_t d_k) {
  phasekv::StandardVariant v;
  v.scale = o.scale ? *o.scale : phasekv::default_scale(d_k);
  v.softcap = o.softcap;
  v.entry_bias = o.entry_bias;
  if (!o.sinks.is_none()) {
    Array s = import_array(fn, "sinks", o.sinks, false);
    v.sinks = dense_f32(s, {q_heads});
  }
  return v;
}

phasekv::cpu::VisibilityRule make_rule(const char* fn, nb::handle geometry, std::int64_t local,
                                       std::int64_t window) {
  if (!geometry.is_none()) {
    if (!nb::isinstance<phasekv::Geometry>(geometry))
      type_error(fn, "geometry", "must be a phasekv.Geometry or None");
    if (window != 0)
      value_error(fn, "window", "must be 0 with a geometry (it is the uncompressed rule)");
    return phasekv::cpu::VisibilityRule::compressed(nb::cast<phasekv::Geometry>(geometry), local);
  }
  if (local != 0) value_error(fn, "local", "must be 0 without a geometry (uncompressed attention)");
  using phasekv::cpu::VisibilityRule;
  return window > 0 ? VisibilityRule::sliding_window(window) : VisibilityRule::causal();
}

// A block table: vLLM's dense int32 `[B, max_blocks]`, or FlashInfer's CSR form as a tuple
// `(indptr [B + 1], indices [nnz])` of int32 arrays; B = -1: any.
phasekv::BlockTable block_table(const char* fn, const TableNames& n, nb::handle obj,
                                std::int64_t B) {
  if (nb::isinstance<nb::tuple>(obj)) {
    const nb::tuple t = nb::borrow<nb::tuple>(obj);
    if (t.size() != 2)
      value_error(fn, n.table,
                  "must be an int32 array [B, max_blocks] or a tuple (indptr, indices)");
    const Array ip = input_i32(fn, n.indptr, t[0], {B < 0 ? -1 : B + 1});
    const Array ix = input_i32(fn, n.indices, t[1], {-1});
    if (ip.shape(0) < 1) value_error(fn, n.indptr, "must have B + 1 >= 1 entries");
    const auto* indptr = static_cast<const std::int32_t*>(ip.data());
    const std::int64_t batch = ip.shape(0) - 1;
    if (indptr[0] != 0) value_error(fn, n.indptr, "must start at 0");
    for (std::int64_t b = 0; b < batch; ++b)
      if (indptr[b + 1] < indptr[b]) value_error(fn, n.indptr, "must not decrease");
    if (indptr[batch] > ix.shape(0))
      value_error(fn, n.indices,
                  "has " + std::to_string(ix.shape(0)) +
                      " entries; indptr[-1] = " + std::to_string(indptr[batch]));
    return phasekv::csr_block_table(indptr, static_cast<const std::int32_t*>(ix.data()), batch);
  }
  const Array ta = input_i32(fn, n.table, obj, {B, -1});
  return phasekv::dense_block_table(static_cast<const std::int32_t*>(ta.data()), ta.shape(0),
                                    ta.shape(1));
}

void with_pool(int threads, const std::function<void(phasekv::cpu::ThreadPool&)>& f) {
  static std::mutex mu;
  static std::unique_ptr<phasekv::cpu::ThreadPool> pool;
  std::lock_guard<std::mutex> lock(mu);
  if (!pool || pool->size() != threads) {
    pool.reset();
    pool = std::make_unique<phasekv::cpu::ThreadPool>(threads, 50);
  }
  f(*pool);
}

void run_threads(int threads, const std::function<void(int, int)>& f) {
  if (threads <= 1) {
    f(0, 1);
    return;
  }
  with_pool(threads, [&](phasekv::cpu::ThreadPool& pool) { pool.run(f); });
}

void check_threads(const char* fn, int threads) {
  phasekv::detail::check_arg(threads >= 1 && threads <= 1024, fn, "threads", threads,
                             "must be in [1, 1024]");
}

}  // namespace phasekv_py
