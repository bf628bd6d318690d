/// @file
/// @brief Umbrella header of the engine API: everything an engine vendors to store, compress
/// and attend over chunked KV caches on the host (core types, phase geometry, the compressors
/// and compressed caches, the reference and CPU attention). Not the CUDA .cuh files, and not
/// the research harness (retrieval tasks, trainer, statistics, reports): see phasekv/eval.hpp.
#pragma once

#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/phase/residue.hpp"
#include "phasekv/attention/params.hpp"
#include "phasekv/attention/softmax_state.hpp"
#include "phasekv/attention/head_dims.hpp"
#include "phasekv/attention/visible_set.hpp"
#include "phasekv/attention/reference.hpp"
#include "phasekv/compress/policy.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/offset_select.hpp"
#include "phasekv/compress/max_pool.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/fixed_gates.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/attention/cpu/cpu_features.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/attention/cpu/thread_driver.hpp"
#include "phasekv/phase/origins.hpp"
#include "phasekv/serving/paged.hpp"
#include "phasekv/serving/paged_check.hpp"
#include "phasekv/serving/plan.hpp"
#include "phasekv/serving/paged_append.hpp"
#include "phasekv/serving/append_run.hpp"
#include "phasekv/serving/sharing.hpp"
#include "phasekv/serving/batch_decode.hpp"
#include "phasekv/serving/batch_prefill.hpp"
