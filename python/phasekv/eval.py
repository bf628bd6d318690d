"""The evaluation side of phasekv: per-residue retrieval reports and sweep plans.

``report(positions, correct, modulus=8)`` groups outcomes by target residue and returns a
:class:`Report` (per-residue accuracy with 95 % Wilson intervals, mean, worst, best, gap in
percentage points, chi-square homogeneity p-value, detected period), computed by phasekv's
C++ statistics (``phasekv/eval/stats.hpp``) and printed by its report writers
(``phasekv/eval/report.hpp``). ``Report.plot()`` draws it with matplotlib when matplotlib is
importable. ``plan(...)`` lays out a position-matched sweep (``phasekv/eval/plan.hpp``).
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

__all__ = [
    "GroupStats",
    "PromptSegment",
    "Report",
    "Summary",
    "TargetPlan",
    "detect_period",
    "homogeneity_test",
    "layout_prompt",
    "plan",
    "plan_targets",
    "read_jsonl",
    "report",
    "summarize",
    "tally",
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
