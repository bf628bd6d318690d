// phasekv._core: the nanobind module over the phasekv headers. Python's phasekv package
// re-exports it (python/phasekv/__init__.py).
#include <cstdint>

#include "common.hpp"
#include "phasekv/core/error.hpp"

NB_MODULE(_core, m) {
  namespace nb = phasekv_py::nb;
  m.doc() = "phasekv's C++ kernels and types (use the phasekv package, which re-exports them).";
  m.attr("__version__") = PHASEKV_VERSION_STRING;
  // phasekv's exceptions, most derived first in the hierarchy: ShapeError and CapacityError
  // are ValueErrors; the remaining phasekv::invalid_argument (and std::invalid_argument)
  // become ValueError through nanobind's built-in translation.
  static nb::exception<phasekv::shape_error> shape_error(m, "ShapeError", PyExc_ValueError);
  static nb::exception<phasekv::capacity_error> capacity_error(m, "CapacityError",
                                                               PyExc_ValueError);
  m.def(
      "_data_pointer",
      [](nb::handle x, bool writable) {
        return reinterpret_cast<std::uintptr_t>(
            phasekv_py::import_array("phasekv._data_pointer", "array", x, writable).data());
      },
      nb::arg("array"), nb::arg("writable") = false,
      "The address every kernel reads (or, writable, writes) for this array: the caller's "
      "own memory, as the tests check (arrays are never copied).");
  phasekv_py::bind_geometry(m);
  phasekv_py::bind_compress(m);
  phasekv_py::bind_attention(m);
  phasekv_py::bind_eval(m);
  phasekv_py::bind_dsv4(m);
  phasekv_py::bind_sweep(m);
  phasekv_py::bind_serving(m);  // after bind_eval: extends phasekv._core.eval
}
