/// @file
/// @brief Umbrella header of the research harness: the per-phase retrieval tasks (R1, R2) and
/// their target planning, the induction-model trainer, the statistics (Wilson intervals,
/// homogeneity, period detection) and the reports (text, CSV, JSON, SVG). Includes the engine
/// API (phasekv/phasekv.hpp) it runs on.
#pragma once

#include "phasekv/phasekv.hpp"
#include "phasekv/eval/stats.hpp"
#include "phasekv/eval/report.hpp"
#include "phasekv/eval/plan.hpp"
#include "phasekv/eval/retrieval.hpp"
#include "phasekv/eval/induction_model.hpp"
#include "phasekv/eval/specialization.hpp"
#include "phasekv/eval/mitigations.hpp"
#include "phasekv/eval/dsv4_retrieval.hpp"
