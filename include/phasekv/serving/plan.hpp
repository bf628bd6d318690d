/// @file
/// @brief The plan math of batch attention, written once for host and device: the split of
/// every sequence's visible keys into KV chunks of a fixed size (work items), and the balance
/// of the items over a number of workers. Plain functions over caller arrays (no allocation,
/// no exceptions), so a CUDA plan can run the same code; the host DecodePlan
/// (serving/batch_decode.hpp) owns the arrays.
///
/// Determinism: the items depend only on the visible totals and the chunk size, never on the
/// number of workers; each item's arithmetic is fixed and partials are merged in item order,
/// so results are the same bits for any worker count.
#pragma once

#include <cstdint>

#include "phasekv/core/config.hpp"

PHASEKV_NAMESPACE_BEGIN

/// One unit of batch attention work: visible items `[begin, end)` (prefix tokens, entries,
/// raw tokens, counted in that order) of sequence `sequence`.
struct WorkItem {
  std::int64_t sequence = 0;  ///< Sequence index b.
  std::int64_t begin = 0;     ///< First visible item.
  std::int64_t end = 0;       ///< One past the last visible item.
};

/// Fixed per-item cost, in visible items, that plan_balance adds to every item's length
/// (preparing and finishing a partial result, and merging it).
inline constexpr std::int64_t kWorkItemOverhead = 32;

/// Number of work items of a sequence with `total` visible items: `ceil(total / chunk)`
/// (0 for an empty sequence, which gets no item: its output is zeros, lse -inf, or the sink).
PHASEKV_HOST_DEVICE constexpr std::int64_t plan_chunks(std::int64_t total, std::int64_t chunk) {
  return total <= 0 ? 0 : (total + chunk - 1) / chunk;
}

/// Splits every sequence's `totals[b]` visible items into chunks of `chunk` items (the last
/// one shorter) and returns the number of items. When `items` is non-null, writes them in
/// order (sequence, then chunk); when `first_item` is non-null, writes `[batch + 1]` offsets:
/// the items of sequence b are `[first_item[b], first_item[b + 1])`. Call once with null
/// arrays to size them (two-call pattern). `chunk` >= 1.
PHASEKV_HOST_DEVICE inline std::int64_t plan_items(const std::int64_t* totals, std::int64_t batch,
                                                   std::int64_t chunk, WorkItem* items,
                                                   std::int64_t* first_item) {
  std::int64_t n = 0;
  for (std::int64_t b = 0; b < batch; ++b) {
    if (first_item != nullptr) first_item[b] = n;
    const std::int64_t c = plan_chunks(totals[b], chunk);
    if (items != nullptr) {
      for (std::int64_t i = 0; i < c; ++i) {
        const std::int64_t lo = i * chunk;
        const std::int64_t hi = lo + chunk < totals[b] ? lo + chunk : totals[b];
        items[n + i] = WorkItem{b, lo, hi};
      }
    }
    n += c;
  }
  if (first_item != nullptr) first_item[batch] = n;
  return n;
}

/// Cost of one item for balancing: its length plus kWorkItemOverhead.
PHASEKV_HOST_DEVICE constexpr std::int64_t plan_item_cost(const WorkItem& w) {
  return w.end - w.begin + kWorkItemOverhead;
}

/// Balances `count` items over `workers` (>= 1) workers as contiguous runs of items: worker w
/// takes items `[worker_first[w], worker_first[w + 1])` (`worker_first` has `workers + 1`
/// entries). An item goes to the worker whose equal share of the total cost holds the
/// item's midpoint, so no worker's run exceeds its share by more than one item.
PHASEKV_HOST_DEVICE inline void plan_balance(const WorkItem* items, std::int64_t count,
                                             std::int64_t workers, std::int64_t* worker_first) {
  std::int64_t total = 0;
  for (std::int64_t i = 0; i < count; ++i) total += plan_item_cost(items[i]);
  // boundary(w) = total * w / workers without overflow (total < 2^62, workers < 2^31)
  const std::int64_t q = total / workers, r = total % workers;
  std::int64_t i = 0, prefix = 0;
  worker_first[0] = 0;
  for (std::int64_t w = 1; w < workers; ++w) {
    const std::int64_t bound = q * w + (r * w) / workers;
    // items whose midpoint (prefix + cost / 2) lies below the bound belong to workers < w
    while (i < count && 2 * prefix + plan_item_cost(items[i]) <= 2 * bound) {
      prefix += plan_item_cost(items[i]);
      ++i;
    }
    worker_first[w] = i;
  }
  worker_first[workers] = count;
}

/// plan_balance for items given only by their costs (`cost[count]`, each >= 0).
PHASEKV_HOST_DEVICE inline void plan_balance_costs(const std::int64_t* cost, std::int64_t count,
                                                   std::int64_t workers,
                                                   std::int64_t* worker_first) {
  std::int64_t total = 0;
  for (std::int64_t i = 0; i < count; ++i) total += cost[i];
  const std::int64_t q = total / workers, r = total % workers;
  std::int64_t i = 0, prefix = 0;
  worker_first[0] = 0;
  for (std::int64_t w = 1; w < workers; ++w) {
    const std::int64_t bound = q * w + (r * w) / workers;
    while (i < count && 2 * prefix + cost[i] <= 2 * bound) {
      prefix += cost[i];
      ++i;
    }
    worker_first[w] = i;
  }
  worker_first[workers] = count;
}

PHASEKV_NAMESPACE_END
