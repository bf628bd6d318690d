"""The evaluation side of phasekv: per-residue retrieval reports and sweep plans.

``report(positions, correct, modulus=8)`` groups outcomes by target residue and returns a
:class:`Report` (per-residue accuracy with 95 % Wilson intervals, mean, worst, best, gap in
percentage points, chi-square homogeneity p-value, detected period), computed by phasekv's
C++ statistics (``phasekv/eval/stats.hpp``) and printed by its report writers
(``phasekv/eval/report.hpp``). ``Report.plot()`` draws it with matplotlib when matplotlib is
importable. ``plan(...)`` lays out a position-matched sweep (``phasekv/eval/plan.hpp``).

The idealized sweep (what ``phasekv-sweep`` runs): ``sweep(policy, task="R2", ...)`` runs the
R1/R2 retrieval tasks through a compressor policy, the compressed cache and the CPU decode
kernel and returns a :class:`SweepResult` (its ``report`` plus every trial);
``specialization_map`` knocks out each head in turn; ``dsv4_sweep`` runs a DeepSeek-V4 layer;
``train_induction`` gives the gates the idealized induction model learns. The mitigation study
(``phasekv/eval/mitigations.hpp``): ``mitigation_designs``, ``measure_design``, ``run_study``,
``design_cost``, ``study_svg``.
"""

import json
import math

import numpy as np

from ._core import eval as _ev

GroupStats = _ev.GroupStats
Summary = _ev.Summary
TargetPlan = _ev.TargetPlan
PromptSegment = _ev.PromptSegment
wilson_interval = _ev.wilson_interval
homogeneity_test = _ev.homogeneity_test
detect_period = _ev.detect_period
summarize = _ev.summarize
tally = _ev.tally
plan_targets = _ev.plan_targets
layout_prompt = _ev.layout_prompt
RunSettings = _ev.RunSettings
SpecializationMap = _ev.SpecializationMap
Dsv4Config = _ev.Dsv4Config
Dsv4Layer = _ev.Dsv4Layer
Dsv4Indexer = _ev.Dsv4Indexer
InductionConfig = _ev.InductionConfig
MitigationDesign = _ev.MitigationDesign
StudyConfig = _ev.StudyConfig
DesignCost = _ev.DesignCost
DesignResult = _ev.DesignResult
StudyResult = _ev.StudyResult
Spread = _ev.Spread
mitigation_designs = _ev.mitigation_designs
design_cost = _ev.design_cost
measure_design = _ev.measure_design
run_study = _ev.run_study
study_svg = _ev.study_svg

__all__ = [
    "DesignCost",
    "DesignResult",
    "Dsv4Config",
    "Dsv4Indexer",
    "Dsv4Layer",
    "GroupStats",
    "InductionConfig",
    "MitigationDesign",
    "PromptSegment",
    "Report",
    "RunSettings",
    "SpecializationMap",
    "Spread",
    "StudyConfig",
    "StudyResult",
    "Summary",
    "SweepResult",
    "TargetPlan",
    "design_cost",
    "detect_period",
    "dsv4_sweep",
    "homogeneity_test",
    "layout_prompt",
    "measure_design",
    "mitigation_designs",
    "plan",
    "plan_targets",
    "read_jsonl",
    "report",
    "run_study",
    "specialization_map",
    "study_svg",
    "summarize",
    "sweep",
    "tally",
    "train_induction",
    "wilson_interval",
]

_COLUMNS = ("residue", "n", "correct", "accuracy", "ci_low", "ci_high")


class Report:
    """A per-residue report. Attributes mirror phasekv's ``Summary``: ``modulus``, ``mean``,
    ``worst``/``worst_residue``, ``best``/``best_residue``, ``gap_pp``, ``homogeneity_p``,
    ``period``, ``empty_groups``; ``table`` is one dict per residue with the columns
    residue, n, correct, accuracy, ci_low, ci_high (accuracies are fractions)."""

    def __init__(self, summary):
        self.summary = summary
        for name in ("modulus", "mean", "worst", "worst_residue", "best", "best_residue",
                     "gap_pp", "homogeneity_p", "period", "empty_groups"):
            setattr(self, name, getattr(summary, name))
        self.table = [{c: getattr(g, c) for c in _COLUMNS} for g in summary.groups]

    def column(self, name):
        """One column of the table as a numpy array."""
        if name not in _COLUMNS:
            raise ValueError(f"phasekv.eval.Report.column: name = {name!r} is invalid "
                             f"(must be one of {', '.join(_COLUMNS)})")
        return np.array([row[name] for row in self.table])

    def summary_line(self):
        """mean | worst | best | gap | homogeneity p | period, as one line."""
        return self.summary.summary_line()

    def to_markdown(self):
        """The table and summary as Markdown."""
        return self.summary.to_markdown()

    def to_csv(self):
        """The table as CSV."""
        return self.summary.to_csv()

    def to_json(self):
        """The table and summary as a JSON string."""
        return self.summary.to_json()

    def to_dict(self):
        """The table and summary as Python objects (json.loads of to_json)."""
        return json.loads(self.to_json())

    def to_svg(self, title="Accuracy by residue"):
        """An SVG plot of accuracy by residue with the Wilson intervals (no dependency)."""
        return self.summary.to_svg(title)

    def plot(self, ax=None, title="Accuracy by residue"):
        """Draws accuracy by residue with 95 % Wilson intervals and the mean on a matplotlib
        Axes (a new figure when ``ax`` is None); returns the Axes. Raises ImportError naming
        matplotlib when it is not installed (``pip install matplotlib``; ``to_svg`` needs
        nothing)."""
        try:
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise ImportError("phasekv.eval.Report.plot needs matplotlib (pip install "
                              "matplotlib); Report.to_svg() draws the same plot without it") from e
        new = ax is None
        if new:
            _, ax = plt.subplots(figsize=(max(4.0, 0.5 * self.modulus + 2.0), 3.0))
        r = self.column("residue")
        acc = self.column("accuracy")
        lo = self.column("ci_low")
        hi = self.column("ci_high")
        ok = ~np.isnan(acc)
        ax.errorbar(r[ok], 100 * acc[ok], yerr=[100 * (acc[ok] - lo[ok]), 100 * (hi[ok] - acc[ok])],
                    fmt="o", capsize=3)
        if not math.isnan(self.mean):
            ax.axhline(100 * self.mean, linestyle="--", color="gray", label="mean")
        ax.set_xlabel(f"target residue (mod {self.modulus})")
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(0, 100)
        ax.set_xticks(list(r))
        ax.set_title(f"{title}: gap {self.gap_pp:.1f} pp, period {self.period}")
        if new:
            ax.figure.tight_layout()
        return ax

    def __repr__(self):
        return self.summary_line() + "\n" + self.to_markdown()

    def _repr_markdown_(self):
        return self.to_markdown()


def report(positions, correct, modulus=8, origin=0, period_alpha=0.01):
    """The per-residue report of retrieval outcomes.

    positions: target positions (anything numpy turns into integers, e.g. a list or an int64
    array); correct: outcomes (bools or 0/1), as many as positions; modulus: M, the number of
    residue groups ((position - origin) mod M); period_alpha: the level of the period test.
    Returns a :class:`Report`.
    """
    pos = np.ascontiguousarray(np.asarray(positions), dtype=np.int64)
    ok = np.asarray(correct)
    if ok.dtype != np.bool_:
        ok = ok.astype(np.int64)
    ok = np.ascontiguousarray(ok)
    if pos.ndim != 1:
        raise ValueError(f"phasekv.eval.report: positions has shape {pos.shape}; expected 1-D")
    c, n = tally(pos, ok, modulus, origin)
    return Report(summarize(c, n, period_alpha))


def read_jsonl(path):
    """(positions, correct) from a results file of JSON lines {"position": int, "correct":
    bool}, the input of phasekv-report. Raises ValueError naming the line on a bad record."""
    positions, correct = [], []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                p, c = rec["position"], rec["correct"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"phasekv.eval.read_jsonl: {path}:{i}: needs \"position\" and "
                                 f"\"correct\" ({e})") from None
            if not isinstance(p, int) or isinstance(p, bool) or not isinstance(c, bool):
                raise ValueError(f"phasekv.eval.read_jsonl: {path}:{i}: \"position\" must be an "
                                 "integer and \"correct\" true or false")
            positions.append(p)
            correct.append(c)
    return np.array(positions, dtype=np.int64), np.array(correct, dtype=bool)


def plan(modulus, count, query_position, record_length=1, lo=None, hi=None, origin=0,
         padding="prefix", max_variance_spread=0.01):
    """A position-matched sweep as a list of prompt plans, residue by residue: ``count``
    targets per residue group modulo ``modulus`` in [lo, hi] (defaults: origin and
    query_position - record_length) with equal mean positions, each with the layout of its
    prompt (``segments``: filler, records, target, query spans) under ``padding`` ('prefix'
    or 'in_sequence'). The fields match phasekv-plan's lines, without its seeds and shuffle."""
    lo = origin if lo is None else lo
    hi = query_position - record_length if hi is None else hi
    tp = plan_targets(modulus, count, lo, hi, origin, max_variance_spread)
    items = []
    for r, targets in enumerate(tp.positions):
        for t in targets:
            segs = []
            for s in layout_prompt(t, query_position, record_length, padding):
                e = {"kind": s.kind, "start": s.start, "length": s.length}
                if s.records > 0:
                    e["first_record"] = s.first_record
                    e["records"] = s.records
                segs.append(e)
            items.append({"id": len(items), "residue": r, "modulus": modulus, "target": t,
                          "query_position": query_position, "record_length": record_length,
                          "padding": padding, "segments": segs})
    return items


def _settings(task, dim, vocab, context, heads, gamma, local, modulus, trials,
              targets_per_context, min_depth, max_depth, seed, knockout, attention, period_alpha,
              fn):
    if trials % targets_per_context != 0:
        raise ValueError(f"phasekv.eval.{fn}: trials = {trials} must be a multiple of "
                         f"targets_per_context = {targets_per_context}")
    s = RunSettings()
    s.task, s.dim, s.vocab, s.context, s.heads = task, dim, vocab, context, heads
    s.gamma, s.local, s.modulus, s.seed = gamma, local, modulus, seed
    s.contexts, s.targets_per_group = trials // targets_per_context, targets_per_context
    s.min_depth, s.max_depth, s.knockout = min_depth, max_depth, list(knockout)
    s.attention, s.period_alpha = attention, period_alpha
    return s


class SweepResult:
    """One idealized retrieval run: ``report`` (a :class:`Report` by target residue) and every
    trial in order, ``positions`` (int64), ``predictions`` (int64 tokens) and ``correct``
    (bool) numpy arrays."""

    def __init__(self, summary, positions, predictions, correct):
        self.report = Report(summary)
        self.positions, self.predictions, self.correct = positions, predictions, correct

    def __repr__(self):
        return repr(self.report)

    def _repr_markdown_(self):
        return self.report._repr_markdown_()


def sweep(policy=None, value_policy=None, *, task="R2", dim=128, vocab=1024, context=512,
          heads=1, gamma=64.0, local=0, modulus=0, trials=320, targets_per_context=4,
          min_depth=0, max_depth=0, seed=1, knockout=(), attention="kernel",
          period_alpha=0.01):
    """The idealized retrieval sweep (``phasekv-sweep``; ``phasekv/eval/retrieval.hpp``): random
    contexts of ``context`` distinct tokens with embeddings of ``dim``; task R1 retrieves a
    stored record's value, R2 (induction) the successor of the query's earlier occurrence. Keys
    are compressed by ``policy`` and values by ``value_policy`` (default: ``policy``; the same
    policy type, e.g. ``OffsetSelect(g, d, r)`` and ``OffsetSelect(g, d, r + 1)`` for R2); the
    query at position ``context - 1`` sees the prefix, the entries and the raw tail plus a local
    window of ``local`` tokens, through the CPU decode kernel (``attention="reference"``: the
    float64 reference). ``policy=None`` is uncompressed attention. ``trials`` per residue group
    (``targets_per_context`` of them per context), targets position-matched across residues
    ``mod modulus`` (0: the policy's stride), ``knockout`` heads' entries excluded. Returns a
    :class:`SweepResult`. The GIL is released while it runs."""
    if value_policy is None:
        value_policy = policy
    s = _settings(task, dim, vocab, context, heads, gamma, local, modulus, trials,
                  targets_per_context, min_depth, max_depth, seed, knockout, attention,
                  period_alpha, "sweep")
    return SweepResult(*_ev._sweep(policy, value_policy, s))


def specialization_map(policy, value_policy=None, *, task="R2", dim=128, vocab=1024,
                       context=512, heads=1, gamma=64.0, local=0, modulus=0, trials=320,
                       targets_per_context=4, min_depth=0, max_depth=0, seed=1,
                       attention="kernel", period_alpha=0.01):
    """``phasekv-sweep --specialization-map``: the sweep with each head knocked out in turn and
    with each head kept alone (same contexts and targets). Returns a ``SpecializationMap``
    (``drop(h, r)``, ``needed``, ``suffices``, ``findings()``, ``to_markdown()``, ``to_svg()``)."""
    if value_policy is None:
        value_policy = policy
    s = _settings(task, dim, vocab, context, heads, gamma, local, modulus, trials,
                  targets_per_context, min_depth, max_depth, seed, (), attention, period_alpha,
                  "specialization_map")
    return _ev._specialization_map(policy, value_policy, s)


def dsv4_sweep(layer="csa", *, task="R2", ratio=0, window=128, offsets=(), sharpness=30.0,
               content_scale=0.0, indexer="lightning", top_k=16, index_sharpness=0.0,
               index_offset=0, index_noise=0.0, dim=128, vocab=1024, context=512, gamma=64.0,
               modulus=0, trials=320, targets_per_context=4, min_depth=0, max_depth=0, seed=1,
               period_alpha=0.01):
    """``phasekv-sweep --policy dsv4-csa / dsv4-hca``: the tasks through a DeepSeek-V4 layer (the
    dsv4 compressor with idealized scores, an idealized indexer for CSA, the sparse attention
    over the raw ``window`` and the selected entries). Returns ``(SweepResult, selected)``:
    ``selected`` is a :class:`Report` of how often an attended entry's window held the target,
    per residue (modulus 0: 8 for CSA, S for HCA)."""
    c = Dsv4Config()
    c.layer = Dsv4Layer.csa if layer == "csa" else Dsv4Layer.hca
    if layer not in ("csa", "hca"):
        raise ValueError(f"phasekv.eval.dsv4_sweep: layer = {layer!r} must be 'csa' or 'hca'")
    if indexer not in ("all", "exact", "oracle", "lightning"):
        raise ValueError(f"phasekv.eval.dsv4_sweep: indexer = {indexer!r} must be 'all', "
                         "'exact', 'oracle' or 'lightning'")
    c.ratio, c.window, c.offsets, c.sharpness = ratio, window, list(offsets), sharpness
    c.content_scale, c.indexer, c.top_k = content_scale, getattr(Dsv4Indexer, indexer), top_k
    c.index_sharpness, c.index_offset, c.index_noise = index_sharpness, index_offset, index_noise
    c.min_depth, c.max_depth = min_depth, max_depth
    s = _settings(task, dim, vocab, context, 1, gamma, 0, modulus, trials, targets_per_context,
                  0, 0, seed, (), "kernel", period_alpha, "dsv4_sweep")
    summary, (sel_ok, sel_n), pos, pred, ok = _ev._dsv4_sweep(s, c)
    return SweepResult(summary, pos, pred, ok), Report(summarize(sel_ok, sel_n, period_alpha))


def train_induction(window=8, heads=4, steps=4000, seed=11, *, windows=8, gain=4.0,
                    learning_rate=2.0):
    """Gates of the paper's idealized induction model (W = S = ``window``, ``heads`` heads,
    ``windows`` windows, orthonormal limit, gamma = tau = ``gain``) after ``steps`` steps of
    gradient descent from the initialization of ``seed`` (``phasekv-sweep --policy trained``).
    Returns ``(key, value, key_offsets, value_offsets)``: float32 ``[heads, window]`` gate
    weights for ``FixedGates`` and each head's argmax offsets."""
    c = InductionConfig()
    c.window, c.heads, c.windows, c.vocab, c.dim = window, heads, windows, windows * window, 1
    c.gamma = c.tau = gain
    c.learning_rate, c.seed = learning_rate, seed
    return _ev._train_induction(c, steps)
