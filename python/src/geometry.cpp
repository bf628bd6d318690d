// Geometry, Visibility, phases and residues (phasekv/phase/).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "common.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/phase/origins.hpp"
#include "phasekv/phase/residue.hpp"

namespace phasekv_py {

namespace {

using phasekv::Geometry;
using phasekv::kMaxLength;
using phasekv::Visibility;

void check_position(const char* where, const char* name, std::int64_t p) {
  phasekv::detail::check_arg(p >= 0 && p <= kMaxLength, where, name, p, "must be in [0, 2^62]");
}

void check_window_index(const Geometry& g, const char* where, std::int64_t j) {
  const std::int64_t top = (kMaxLength - g.origin() - g.window()) / g.stride();
  phasekv::detail::check_arg(j >= 0 && j <= top, where, "j", j,
                             "must be >= 0 and the window must end by 2^62");
}

std::string repr(const Geometry& g) {
  std::ostringstream os;
  os << "Geometry(window=" << g.window() << ", stride=" << g.stride() << ", origin=" << g.origin()
     << ")";
  return os.str();
}

std::string repr(const Visibility& v) {
  std::ostringstream os;
  os << "Visibility(prefix_end=" << v.prefix_end << ", entries=" << v.entries
     << ", raw_begin=" << v.raw_begin << ", raw_end=" << v.raw_end << ")";
  return os.str();
}

// Applies `f` to every element of an int64 array of positions, into a new int64 numpy array of
// the same shape.
template <class F>
nb::object map_positions(const char* fn, nb::handle positions, F&& f) {
  Array in = import_array(fn, "positions", positions, false);
  require_i64(in);
  require_contiguous(in);
  std::vector<std::int64_t> shape;
  for (std::int64_t i = 0; i < in.ndim(); ++i) shape.push_back(in.shape(i));
  nb::object out_obj = nb::module_::import_("numpy").attr("empty")(nb::cast(shape), "int64");
  Array out = import_array(fn, "out", out_obj, true);
  const auto* src = static_cast<const std::int64_t*>(in.data());
  auto* dst = static_cast<std::int64_t*>(out.data());
  const std::size_t count = in.a.size();
  for (std::size_t i = 0; i < count; ++i) dst[i] = f(src[i]);
  return out_obj;
}

}  // namespace

void bind_geometry(nb::module_& m) {
  nb::class_<Visibility>(m, "Visibility",
                         "What a query at position n - 1 sees: raw prefix positions "
                         "[0, prefix_end), compressed entries [0, entries), raw positions "
                         "[raw_begin, raw_end).")
      .def_ro("prefix_end", &Visibility::prefix_end, "Raw prefix positions [0, prefix_end).")
      .def_ro("entries", &Visibility::entries, "Visible compressed entries, J(n).")
      .def_ro("raw_begin", &Visibility::raw_begin, "First visible raw position after the prefix.")
      .def_ro("raw_end", &Visibility::raw_end, "One past the last visible raw position (n).")
      .def("raw_count", &Visibility::raw_count, "Raw positions visible after the prefix.")
      .def("total", &Visibility::total, "prefix + entries + raw: the attended items.")
      .def("__eq__",
           [](const Visibility& a, const Visibility& b) {
             return a.prefix_end == b.prefix_end && a.entries == b.entries &&
                    a.raw_begin == b.raw_begin && a.raw_end == b.raw_end;
           })
      .def("__repr__", [](const Visibility& v) { return repr(v); });

  nb::class_<Geometry>(m, "Geometry",
                       "Chunk geometry (W, S, O): window j covers positions "
                       "[O + j*S, O + j*S + W); positions below O are the raw prefix.")
      .def(nb::init<std::int64_t, std::int64_t, std::int64_t>(), nb::arg("window"),
           nb::arg("stride"), nb::arg("origin") = 0,
           "Raises ValueError unless window >= 1, stride >= 1, 0 <= origin, all <= 2^40.")
      .def_prop_ro("window", &Geometry::window, "Window length W.")
      .def_prop_ro("stride", &Geometry::stride, "Stride S between window starts.")
      .def_prop_ro("origin", &Geometry::origin, "Origin O: the first windowed position.")
      .def("has_gaps", &Geometry::has_gaps, "True when W < S.")
      .def("overlaps", &Geometry::overlaps, "True when W > S.")
      .def(
          "phase",
          [](const Geometry& g, std::int64_t p) {
            check_position("phasekv.Geometry.phase", "p", p);
            return g.phase(p);
          },
          nb::arg("p"), "(p - O) mod S for p >= O; -1 for prefix positions.")
      .def(
          "phases",
          [](const Geometry& g, nb::handle positions) {
            const char* fn = "phasekv.Geometry.phases";
            return map_positions(fn, positions, [&](std::int64_t p) {
              check_position(fn, "positions[i]", p);
              return g.phase(p);
            });
          },
          nb::arg("positions"),
          "phase() of every element of an int64 array (a new int64 array, -1 for the prefix).")
      .def(
          "window_begin",
          [](const Geometry& g, std::int64_t j) {
            check_window_index(g, "phasekv.Geometry.window_begin", j);
            return g.window_begin(j);
          },
          nb::arg("j"), "First position of window j: O + j*S.")
      .def(
          "window_end",
          [](const Geometry& g, std::int64_t j) {
            check_window_index(g, "phasekv.Geometry.window_end", j);
            return g.window_end(j);
          },
          nb::arg("j"), "One past the last position of window j: O + j*S + W.")
      .def(
          "offset",
          [](const Geometry& g, std::int64_t p, std::int64_t j) {
            check_position("phasekv.Geometry.offset", "p", p);
            check_window_index(g, "phasekv.Geometry.offset", j);
            return g.offset(p, j);
          },
          nb::arg("p"), nb::arg("j"), "Offset of p in window j: p - O - j*S.")
      .def(
          "covers",
          [](const Geometry& g, std::int64_t j, std::int64_t p) {
            check_position("phasekv.Geometry.covers", "p", p);
            check_window_index(g, "phasekv.Geometry.covers", j);
            return g.covers(j, p);
          },
          nb::arg("j"), nb::arg("p"), "True when window j contains position p.")
      .def(
          "cover_count",
          [](const Geometry& g, std::int64_t p) {
            check_position("phasekv.Geometry.cover_count", "p", p);
            return g.cover_count(p);
          },
          nb::arg("p"), "Number of windows that contain p (0 for prefix and gap positions).")
      .def(
          "complete_windows",
          [](const Geometry& g, std::int64_t n) {
            Geometry::check_length("phasekv.Geometry.complete_windows", "n", n);
            return g.complete_windows(n);
          },
          nb::arg("n"), "J(n): complete windows after n tokens.")
      .def(
          "raw_tail_begin",
          [](const Geometry& g, std::int64_t n) {
            Geometry::check_length("phasekv.Geometry.raw_tail_begin", "n", n);
            return g.raw_tail_begin(n);
          },
          nb::arg("n"), "First position of the raw tail after n tokens: min(n, O + J(n)*S).")
      .def(
          "visible",
          [](const Geometry& g, std::int64_t n, std::int64_t local) {
            Geometry::check_length("phasekv.Geometry.visible", "n", n);
            Geometry::check_local("phasekv.Geometry.visible", "local", local);
            return g.visible(n, local);
          },
          nb::arg("n"), nb::arg("local") = 0,
          "The Visibility of a query at position n - 1 with a local window of `local` raw "
          "tokens.")
      .def(
          "ring_capacity",
          [](const Geometry& g, std::int64_t local) {
            Geometry::check_local("phasekv.Geometry.ring_capacity", "local", local);
            return g.ring_capacity(local);
          },
          nb::arg("local"), "Raw tokens a streaming cache keeps: max(W, L).")
      .def("__eq__", [](const Geometry& a, const Geometry& b) { return a == b; })
      .def("__hash__",
           [](const Geometry& g) {
             return static_cast<std::int64_t>(g.window() * 1000003 ^ g.stride() * 10007 ^
                                              g.origin());
           })
      .def("__repr__", [](const Geometry& g) { return repr(g); });

  m.def(
      "residue",
      [](std::int64_t p, std::int64_t modulus, std::int64_t origin) {
        const char* fn = "phasekv.residue";
        phasekv::detail::check_arg(modulus >= 1, fn, "modulus", modulus, "must be >= 1");
        phasekv::detail::check_arg(p >= -kMaxLength && p <= kMaxLength, fn, "p", p,
                                   "must be in [-2^62, 2^62]");
        phasekv::detail::check_arg(origin >= 0 && origin <= kMaxLength, fn, "origin", origin,
                                   "must be in [0, 2^62]");
        return phasekv::residue(p, modulus, origin);
      },
      nb::arg("p"), nb::arg("modulus"), nb::arg("origin") = 0,
      "(p - origin) mod modulus in [0, modulus), also for p < origin.");
  m.def(
      "residues",
      [](nb::handle positions, std::int64_t modulus, std::int64_t origin) {
        const char* fn = "phasekv.residues";
        phasekv::detail::check_arg(modulus >= 1, fn, "modulus", modulus, "must be >= 1");
        phasekv::detail::check_arg(origin >= 0 && origin <= kMaxLength, fn, "origin", origin,
                                   "must be in [0, 2^62]");
        return map_positions(fn, positions, [&](std::int64_t p) {
          phasekv::detail::check_arg(p >= -kMaxLength && p <= kMaxLength, fn, "positions[i]", p,
                                     "must be in [-2^62, 2^62]");
          return phasekv::residue(p, modulus, origin);
        });
      },
      nb::arg("positions"), nb::arg("modulus"), nb::arg("origin") = 0,
      "residue() of every element of an int64 array (a new int64 array).");
  m.def("even_origins", &phasekv::even_origins, nb::arg("stride"), nb::arg("kv_heads"),
        "Per-KV-head origins O_h = h * stride // kv_heads that spread the heads evenly over one "
        "stride (with kv_heads = stride every phase is a window boundary of exactly one head); "
        "pass them as origins= of CompressedCache, compress_batch, decode_arrays or prefill.");
  m.def(
      "stride_lcm",
      [](const std::vector<std::int64_t>& strides) {
        return phasekv::stride_lcm(strides.data(), strides.size());
      },
      nb::arg("strides"),
      "Least common multiple of several strides: the period of their phases together.");
}

}  // namespace phasekv_py
