"""Paged serving on the CPU: an engine's paged KV storage in its own arrays and the plan/run
life cycle of a serving step.

- ``PagedKV(raw_pool, raw_table, lengths, *, entry_pool, entry_table, geometry, local, window,
  ring_slots, layout)`` describes a batch over the caller's arrays (nothing is copied: the
  plans and runs read and write them in place). Pools are tuples ``(keys, values)`` of
  ``[pages, page_size, heads, d]`` arrays (``layout="NHD"``; ``"HND"``: ``[pages, heads,
  page_size, d]``) of one storage dtype (float32 or bfloat16), dense inside a page
  with any page stride. Block tables are vLLM's dense int32 ``[B, max_blocks]`` arrays or
  FlashInfer's CSR form as a tuple ``(indptr [B + 1], indices)`` of int32 arrays; ``lengths``
  is an int64 ``[B]`` array the engine updates in place.
- ``AppendPlan`` writes a step's new tokens (raw pages, and for a compressed layer the entries
  of every window that completes, with the compressor policies) into the pools.
- ``DecodePlan`` and ``PrefillPlan`` run batch attention over the pages.

A plan is made once per step (``plan(...)`` again for the next step) and serves every layer
with the same lengths and tables; ``run(...)`` releases the GIL, never allocates, and first
compares its arguments with the plan: a difference (lengths, tables, ``new_indptr``,
``qo_indptr``, pool shapes, policies) raises ``ValueError`` naming the field, before anything
is written. Queries, outputs and log-sum-exps are float32; outputs given by the caller are
written in place. See docs/python.md.
"""

from ._core import serving as _serving

AppendPlan = _serving.AppendPlan
DecodePlan = _serving.DecodePlan
PagedKV = _serving.PagedKV
PrefillPlan = _serving.PrefillPlan
count_page_readers = _serving.count_page_readers
page_needs = _serving.page_needs
paged_append = _serving.paged_append
writable_from = _serving.writable_from

__all__ = [
    "AppendPlan",
    "DecodePlan",
    "PagedKV",
    "PrefillPlan",
    "count_page_readers",
    "page_needs",
    "paged_append",
    "writable_from",
]
