// Per-KV-head origins over the one paged batch case (serving_case.hpp): a shape with origins
// {0, 3, 9} by default, 3 KV heads of 2 query heads each.
#pragma once

#include <cstdint>
#include <vector>

#include "phasekv/serving/batch_prefill.hpp"
#include "serving_case.hpp"

namespace sst {

struct Shape : pst::BatchShape {
  Shape() {
    kv_heads = 3, group = 2, O = 0;
    origins = {0, 3, 9};
  }
};

template <class T>
using Batch = pst::BatchCase<T>;

}  // namespace sst
