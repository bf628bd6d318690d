// Built with PHASEKV_NO_ISA_NAMESPACE: everything lives directly in namespace phasekv.
#include <gtest/gtest.h>

#include <string>
#include <typeinfo>

#include "phasekv/eval.hpp"
#include "phasekv/phasekv.hpp"

namespace {

TEST(NoIsaNamespace, EverythingIsDirectlyInPhasekv) {
  EXPECT_STREQ(phasekv::isa_namespace(), "");
#if defined(__GNUC__)
  // Itanium mangling: no inline namespace between phasekv and the class.
  EXPECT_EQ(std::string(typeid(phasekv::Geometry).name()), "N7phasekv8GeometryE");
#endif
  const phasekv::Geometry g(8, 4);
  EXPECT_EQ(g.visible(100, 16).entries, phasekv::Geometry(8, 4).visible(100, 16).entries);
}

}  // namespace
