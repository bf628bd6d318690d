"""The trained-transformer phase study: pretrains tiny decoder-only transformers from scratch
with each compression design and several fixed seeds in two regimes (R1 stored records with 2
layers, R2 induction with 1 layer and no raw local window), evaluates them through phasekv's
kernels phase by phase (phasekv.eval.report), knocks out every head of every layer, and writes
docs/trained_models.md with its tables, plots and commands. Nothing in the page is typed by
hand.

    python python/examples/phase_training/study.py --out docs     # the full study
    python python/examples/phase_training/study.py --smoke --out /tmp/smoke   # < 1 minute
    python python/examples/phase_training/study.py --reuse-weights --out docs # no training

Trained weights go to --weights (default build/phase_training_weights in the repository);
--reuse-weights loads the ones that match the run's configuration instead of training them,
so the evaluation and knockouts can be rerun without retraining.

Needs torch, numpy, matplotlib and phasekv (pip install . from the repository root).
"""

import argparse
import dataclasses
import gzip
import json
import math
import multiprocessing
import os
import platform
import re
import sys
import time

# OpenMP's busy-waiting threads slow torch down several times on shared cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, HERE)

import phasekv as pk  # noqa: E402

import kernels  # noqa: E402
import model as M  # noqa: E402

MODULUS = 8


@dataclasses.dataclass(frozen=True)
class Regime:
    """A task, model shape and training length, with the designs trained in it."""

    name: str
    title: str
    cfg: M.ModelConfig
    steps: int
    designs: tuple
    about: str


REGIMES = {
    r.name: r
    for r in [
        Regime("R1", "R1 stored records, 2 layers, raw local window L = 16",
               M.ModelConfig(task="R1"), 800,
               ("full attention", "mean W8/S8", "mean W16/S8 (overlap)", "mean W8/S4 (overlap)",
                "gated W8/S8", "gated W8/S8 staggered + spread init"),
               "a record token carries its key and its value at one position, so no window "
               "boundary can split a record; two layers and a raw local window of 16 tokens "
               "leave the model free to move information between positions before it is "
               "pooled."),
        Regime("R2-1L", "R2 induction, 1 layer, no raw local window (L = 0)",
               M.ModelConfig(task="R2", layers=1, local=0), 1500,
               ("full attention", "mean W8/S8", "gated W8/S8", "gated W16/S8 (overlap)",
                "gated W8/S8 + spread init", "gated W8/S8 staggered",
                "gated W8/S8 staggered + spread init"),
               "a key token is followed by its value token, and the single attention layer "
               "sees every older token only through compressed entries, so the key and its "
               "value can be bound only inside one window: the setting of the idealized models "
               "of docs/mitigations.md (one layer, L = 0, R2). Full attention cannot solve it "
               "(one layer has no previous-token step), so its row is the chance control."),
    ]
}


def plan_targets(per_residue, lo):
    """Target (record / key) positions: `per_residue` per residue mod 8, in [lo, lo + 40),
    every residue with the same mean position lo + 20 (residue r draws its window index k from
    {0..3} for a fraction r/8 of its targets and from {1..4} otherwise). Every target (and an R2
    key's value token) lies outside the query's raw band, so it is reachable only through
    compressed entries."""
    out = []
    for r in range(MODULUS):
        n_low = round(per_residue * r / MODULUS)
        ks = [i % 4 for i in range(n_low)] + [1 + i % 4 for i in range(per_residue - n_low)]
        out += [lo + r + 8 * k for k in ks]
    return np.array(out, dtype=np.int64)


def bits(flags):
    """A list of bools as a '0'/'1' string (compact JSON)."""
    return "".join("1" if f else "0" for f in flags)


def unbits(s):
    return [c == "1" for c in s]


def evaluate(m, cfg, per_residue, seed, threads):
    """Per-target outcomes through the kernels: the intact model and, for every layer, each
    head zeroed, each head without its compressed entries, every head without entries, and
    every head but one without entries (kernels.KernelModel.outcomes); and the torch forward's
    predictions on the same prompts (a cross-check)."""
    rng = np.random.default_rng(10_000 + seed)
    targets = plan_targets(per_residue, lo=8)
    assert targets.max() + 1 < cfg.context + 1 - cfg.local, "targets must be compressed"
    tokens, keypos, qpos = M.make_batch(rng, cfg, len(targets), targets=targets)
    gold = M.answers(cfg, tokens, keypos)[:, 0].numpy()
    prompt = tokens[:, : qpos[0] + 1]
    km = kernels.KernelModel(m, threads=threads)
    layers = list(range(cfg.layers))
    base = []
    per = {li: {"zeroed": [], "knocked": [], "none": [], "alone": []} for li in layers}
    for b in range(len(targets)):
        o = km.outcomes(prompt[b], int(gold[b]), layers)
        base.append(o["base"])
        for li in layers:
            for key in per[li]:
                if o["layers"][li][key] is not None:
                    per[li][key].append(o["layers"][li][key])
    with torch.no_grad():
        torch_pred = m(prompt)[:, -1].argmax(-1).numpy()
    torch_ok = (torch_pred == gold).tolist()

    def heads(rows):  # [prompt][head] -> one bit string per head
        return [bits(r[h] for r in rows) for h in range(cfg.heads)] if rows else None

    return {"positions": targets.tolist(), "base": bits(base),
            "layers": [{"zeroed": heads(per[li]["zeroed"]), "knocked": heads(per[li]["knocked"]),
                        "alone": heads(per[li]["alone"]),
                        "none": bits(per[li]["none"]) if per[li]["none"] else None}
                       for li in layers],
            "torch_correct": bits(torch_ok),
            "kernel_torch_disagreements": int(sum(a != b for a, b in zip(base, torch_ok)))}


def rep(positions, correct):
    return pk.eval.report(positions, unbits(correct) if isinstance(correct, str) else correct,
                          modulus=MODULUS)


def served(base, knocked):
    """Residues where the knockout's 95 % Wilson interval lies wholly below the intact
    model's (phasekv::eval::SpecializationMap::needed)."""
    return [r for r in range(MODULUS)
            if knocked.table[r]["ci_high"] < base.table[r]["ci_low"]]


def slug(text):
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def weights_path(folder, regime, design, seed):
    return os.path.join(folder, f"{slug(regime)}__{slug(design)}__seed{seed}.pt")


def train_or_load(job):
    """Trains one model (or loads its saved weights when job['reuse'] and the saved
    configuration matches); saves the weights; returns (model, history, train_s, loaded)."""
    regime, design, seed = REGIMES[job["regime"]], M.DESIGNS[job["design"]], job["seed"]
    cfg, tcfg = regime.cfg, M.TrainConfig(steps=job["steps"], batch=job["batch"])
    meta = {"cfg": dataclasses.asdict(cfg), "design": dataclasses.asdict(design),
            "train": dataclasses.asdict(tcfg), "seed": seed}
    path = weights_path(job["weights"], regime.name, design.name, seed) if job["weights"] else None
    if job["reuse"] and path and os.path.exists(path):
        saved = torch.load(path, weights_only=False)
        if saved["meta"] == meta:
            m = M.Model(cfg, design)
            m.load_state_dict(saved["state"])
            m.eval()
            return m, saved["history"], saved["train_s"], True
    t0 = time.time()
    m, hist = M.train(cfg, design, tcfg, seed)
    train_s = time.time() - t0
    if path:
        os.makedirs(job["weights"], exist_ok=True)
        torch.save({"meta": meta, "state": m.state_dict(), "history": hist, "train_s": train_s},
                   path)
    return m, hist, train_s, False


def run_job(job):
    """One (regime, design, seed): train (or load), evaluate; returns the run's record."""
    torch.set_num_threads(job["threads"])
    m, hist, train_s, loaded = train_or_load(job)
    t1 = time.time()
    ev = evaluate(m, REGIMES[job["regime"]].cfg, job["per_residue"], job["seed"], job["threads"])
    return {"regime": job["regime"], "design": job["design"], "seed": job["seed"],
            "history": hist, "train_s": train_s, "loaded": loaded,
            "eval_s": time.time() - t1, **ev}


def run(args):
    regimes = [REGIMES[n] for n in args.regimes]
    seeds = list(range(1, args.seeds + 1))
    results = {"regimes": {r.name: {"config": dataclasses.asdict(r.cfg),
                                    "train": dataclasses.asdict(M.TrainConfig(
                                        steps=args.steps or r.steps, batch=args.batch)),
                                    "designs": [d for d in r.designs
                                                if not args.designs or d in args.designs]}
                           for r in regimes},
               "seeds": seeds, "per_residue": args.per_residue, "runs": [],
               "argv": args.argv, "threads": args.threads, "jobs": args.jobs,
               "smoke": args.smoke}
    jobs = [{"regime": r.name, "design": d, "seed": s, "steps": args.steps or r.steps,
             "batch": args.batch, "per_residue": args.per_residue, "threads": args.threads,
             "weights": args.weights, "reuse": args.reuse_weights}
            for r in regimes for d in results["regimes"][r.name]["designs"] for s in seeds]
    jobs.sort(key=lambda j: -j["steps"])  # the longest first: the workers finish together
    t_start = time.time()
    order = {(j["regime"], j["design"], j["seed"]): i for i, j in enumerate(jobs)}

    def done(rec):
        r = rep(rec["positions"], rec["base"])
        how = "loaded" if rec["loaded"] else "train"
        print(f"[{time.time() - t_start:7.1f} s] {rec['regime']:6s} {rec['design']:36s} seed "
              f"{rec['seed']}: {how} {rec['train_s']:5.1f} s (final loss "
              f"{rec['history'][-1][1]:.3f}), eval {rec['eval_s']:4.1f} s | {r.summary_line()}",
              flush=True)
        results["runs"].append(rec)
        results["runs"].sort(key=lambda x: order[(x["regime"], x["design"], x["seed"])])
        results["total_s"] = time.time() - t_start
        if args.out:  # partial results survive an interrupted run (--page-from)
            save_results(results, args.out)

    if args.jobs > 1:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(args.jobs) as pool:
            for rec in pool.imap_unordered(run_job, jobs):
                done(rec)
    else:
        for job in jobs:
            done(run_job(job))
    results["total_s"] = time.time() - t_start
    return results


RESULTS = "trained_models_results.json.gz"


def save_results(results, out):
    """Every outcome of the run, gzipped JSON (the input of --page-from)."""
    os.makedirs(out, exist_ok=True)
    data = json.dumps(results, separators=(",", ":")).encode()
    with gzip.GzipFile(os.path.join(out, RESULTS), "wb", compresslevel=9, mtime=0) as f:
        f.write(data)  # mtime 0: the same results give the same bytes


def load_results(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def pct(x):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def fmt_p(p):
    return f"{p:.2e}" if p < 1e-3 else f"{p:.3f}"


def layer_spec(run, base, li):
    """What layer li's knockouts show for one run: the residues each head serves under
    zeroing, under the specialization map (its entries excluded drops r, or it alone retrieves
    r better than no head's entries), and the accuracy with every head's entries excluded."""
    pos, lay = run["positions"], run["layers"][li]
    heads = len(lay["zeroed"])
    zero = [served(base, rep(pos, lay["zeroed"][h])) for h in range(heads)]
    out = {"layer": li, "zeroed": zero, "map": None, "none_mean": None}
    if lay["knocked"] is not None:
        none = rep(pos, lay["none"])
        out["none_mean"] = none.mean
        out["map"] = []
        for h in range(heads):
            knocked = served(base, rep(pos, lay["knocked"][h]))
            alone = rep(pos, lay["alone"][h])
            sufficient = [q for q in range(MODULUS)
                          if none.table[q]["ci_high"] < alone.table[q]["ci_low"]]
            out["map"].append(sorted(set(knocked) | set(sufficient)))
    return out


def summarize(results):
    """Per regime and design: pooled reports, per-seed reports, per-layer knockout maps."""
    out = {}
    for regime in results["regimes"]:
        out[regime] = {}
        runs_r = [r for r in results["runs"] if r["regime"] == regime]
        for name in dict.fromkeys(r["design"] for r in runs_r):
            runs = [r for r in runs_r if r["design"] == name]
            pooled = rep(sum((r["positions"] for r in runs), []),
                         "".join(r["base"] for r in runs))
            per_seed = [rep(r["positions"], r["base"]) for r in runs]
            spec = [{"seed": r["seed"],
                     "layers": [layer_spec(r, b, li) for li in range(len(r["layers"]))]}
                    for r, b in zip(runs, per_seed)]
            out[regime][name] = {"pooled": pooled, "per_seed": per_seed, "spec": spec,
                                 "runs": runs}
    return out


def coverage(serves):
    """(residues served by some head, residues served by two or more heads)."""
    residues = set(q for h in serves for q in h)
    collisions = sum(1 for q in range(MODULUS) if sum(q in h for h in serves) >= 2)
    return len(residues), collisions


def memory(name):
    d = M.DESIGNS[name]
    if not d.compressed:
        return "all raw"
    e = M.entries_per_token(d)
    return f"1/{round(1 / e)}" + ("" if e == 1 / 8 else f" ({e * 8:g}x)")


def table(summary):
    rows = ["| design | entries / token / head | mean % | worst % [95 % CI] (r) | best % (r) | "
            "gap pp | homogeneity p | period | seed mean % | seed worst % | seed gap pp | "
            "kernel vs torch |",
            "|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for name, s in summary.items():
        p = s["pooled"]
        w = p.table[p.worst_residue]

        def spread(f):
            v = np.array([f(x) for x in s["per_seed"]]) * 100
            return f"{v.mean():.1f} [{v.min():.1f}, {v.max():.1f}]"

        dis = sum(r["kernel_torch_disagreements"] for r in s["runs"])
        n = sum(len(r["base"]) for r in s["runs"])
        rows.append(
            f"| {name} | {memory(name)} | {pct(p.mean)} | {pct(p.worst)} [{pct(w['ci_low'])}, "
            f"{pct(w['ci_high'])}] (r={p.worst_residue}) | {pct(p.best)} (r={p.best_residue}) | "
            f"{p.gap_pp:.1f} | {fmt_p(p.homogeneity_p)} | {p.period} | "
            f"{spread(lambda x: x.mean)} | {spread(lambda x: x.worst)} | "
            f"{spread(lambda x: x.gap_pp / 100)} | {dis} of {n} |")
    return "\n".join(rows)


def head_map(serves):
    parts = [f"h{h}: {','.join(str(q) for q in v)}" for h, v in enumerate(serves) if v]
    return "; ".join(parts) or "none"


def knockout_table(summary):
    rows = ["| design | seed | layer | heads serving residues (map: entries excluded, or alone) "
            "| residues served / collisions | heads serving residues (output zeroed) | "
            "accuracy with every head's entries excluded % |",
            "|:--|--:|--:|:--|--:|:--|--:|"]
    for name, s in summary.items():
        if not M.DESIGNS[name].compressed:
            continue
        for sp in s["spec"]:
            for ls in sp["layers"]:
                res, col = coverage(ls["map"])
                rows.append(f"| {name} | {sp['seed']} | {ls['layer']} | {head_map(ls['map'])} | "
                            f"{res} / {col} | {head_map(ls['zeroed'])} | "
                            f"{pct(ls['none_mean'])} |")
    return "\n".join(rows)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(summary, path):
    """Accuracy by residue per design: pooled (points with Wilson intervals), seeds (lines)."""
    plt = _pyplot()
    panels = [(reg, name) for reg, s in summary.items() for name in s]
    cols = 4
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.6 * rows), squeeze=False,
                             sharey=True)
    for ax, (reg, name) in zip(axes.flat, panels):
        s = summary[reg][name]
        s["pooled"].plot(ax=ax)
        ax.set_title(f"{reg}: {name}\ngap {s['pooled'].gap_pp:.0f} pp", fontsize=8)
        for r in s["per_seed"]:
            ax.plot(r.column("residue"), 100 * r.column("accuracy"), lw=0.8, alpha=0.5)
        ax.xaxis.label.set_size(7)
        ax.yaxis.label.set_size(7)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_knockout(summary, path):
    """Per compressed design and layer (first seed): accuracy by residue with only head h's
    compressed entries kept in that layer (every other head's excluded), and with none kept."""
    plt = _pyplot()
    panels = [(reg, name, li) for reg, ss in summary.items() for name, s in ss.items()
              if M.DESIGNS[name].compressed
              for li in range(len(s["runs"][0]["layers"]))]
    if not panels:
        return
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.9 * rows), squeeze=False,
                             constrained_layout=True)
    im = None
    for ax, (reg, name, li) in zip(axes.flat, panels):
        run = summary[reg][name]["runs"][0]
        lay = run["layers"][li]
        grid = [rep(run["positions"], a).column("accuracy") for a in lay["alone"]]
        grid.append(rep(run["positions"], lay["none"]).column("accuracy"))
        im = ax.imshow(100 * np.array(grid), vmin=0, vmax=100, cmap="viridis", aspect="auto")
        ax.set_title(f"{reg}: {name}\nlayer {li}, seed {run['seed']}", fontsize=7)
        ax.set_xlabel("target residue (mod 8)", fontsize=6)
        ax.set_ylabel("entries kept: head", fontsize=6)
        ax.set_xticks(range(MODULUS))
        ax.set_yticks(range(len(grid)))
        ax.set_yticklabels([str(h) for h in range(len(grid) - 1)] + ["none"])
        ax.tick_params(labelsize=5)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    fig.colorbar(im, ax=axes.ravel().tolist(), label="accuracy (%)")
    fig.savefig(path)
    plt.close(fig)


def worst_ci(s):
    w = s["pooled"].table[s["pooled"].worst_residue]
    return w["ci_low"], w["ci_high"]


def compare_worst(a, b):
    """'above' / 'below' / 'overlapping': a's worst residue against b's (95 % Wilson)."""
    lo_a, hi_a = worst_ci(a)
    lo_b, hi_b = worst_ci(b)
    return "above" if lo_a > hi_b else "below" if hi_a < lo_b else "overlapping"


def row_line(name, s):
    p = s["pooled"]
    lo, hi = worst_ci(s)
    return (f"{name}: mean {pct(p.mean)} %, worst {pct(p.worst)} % [{pct(lo)}, {pct(hi)}] "
            f"(r={p.worst_residue}), gap {p.gap_pp:.1f} pp, homogeneity p = "
            f"{fmt_p(p.homogeneity_p)}")


def findings(regime, summary, results):
    """Plain statements computed from one regime's numbers (each names the test it rests on)."""
    lines = []
    get = summary.get
    full = get("full attention")
    comp = {n: s for n, s in summary.items() if M.DESIGNS[n].compressed}
    chance = 1 / results["regimes"][regime]["config"]["fillers"]
    if full is not None:
        p = full["pooled"]
        state = ("retrieves every residue" if p.worst > 0.9 else
                 f"fails the task (chance {pct(chance)} %)" if p.mean < 0.2 else
                 "retrieves part of the targets")
        lines.append(
            f"- **Full attention** (the control): mean {pct(p.mean)} %, gap {p.gap_pp:.1f} pp, "
            f"homogeneity p = {fmt_p(p.homogeneity_p)}: {state}"
            + (", no detectable phase structure (p >= 0.01)." if p.homogeneity_p >= 0.01
               else ", with phase structure (p < 0.01)."))
    sens = [n for n, s in comp.items() if s["pooled"].homogeneity_p < 0.01]
    flat = [n for n, s in comp.items() if s["pooled"].homogeneity_p >= 0.01]
    lines.append(
        f"- **Phase sensitivity** (chi-square homogeneity p < 0.01 over residues): "
        f"{len(sens)} of {len(comp)} compressed designs"
        + (f" ({', '.join(sens)})" if sens else "")
        + (f"; no detectable structure in {', '.join(flat)}" if flat else "") + ".")
    if comp:
        name, s = max(comp.items(), key=lambda kv: kv[1]["pooled"].gap_pp)
        lines.append(f"- **Largest gap**: {row_line(name, s)}.")
    pairs = [("mean W8/S8", "gated W8/S8", "Gated vs mean pooling (W8/S8, equal memory)"),
             ("mean W8/S8", "mean W16/S8 (overlap)",
              "Overlap at equal memory, mean pooling (W16/S8 vs W8/S8, both 1/8 entry per token)"),
             ("gated W8/S8", "gated W16/S8 (overlap)",
              "Overlap at equal memory, gated pooling (W16/S8 vs W8/S8, both 1/8 entry per "
              "token)"),
             ("mean W8/S8", "mean W8/S4 (overlap)",
              "Overlap at twice the memory (W8/S4, 1/4 entry per token, vs W8/S8)"),
             ("gated W8/S8", "gated W8/S8 + spread init",
              "Spread initialization alone (uniform origins)"),
             ("gated W8/S8", "gated W8/S8 staggered",
              "Staggered origins alone (no spread init; equal entries per token)"),
             ("gated W8/S8", "gated W8/S8 staggered + spread init",
              "Staggered origins + spread init, the mitigation of docs/mitigations.md")]
    for ref, alt, title in pairs:
        a, b = get(alt), get(ref)
        if not (a and b):
            continue
        verdict = {"above": "worst residue higher (disjoint 95 % intervals)",
                   "below": "worst residue lower (disjoint 95 % intervals)",
                   "overlapping": "worst residues not distinguishable (overlapping 95 % "
                                  "intervals)"}[compare_worst(a, b)]
        lines.append(f"- **{title}**: {row_line(alt, a)}; against {row_line(ref, b)}: "
                     f"{verdict}.")
    g, mit = get("gated W8/S8"), get("gated W8/S8 staggered + spread init")
    if g and mit:
        if g["pooled"].homogeneity_p >= 0.01:
            v = ("**nothing to mitigate here**: uniform gated pooling shows no detectable phase "
                 "structure, so this regime does not test whether the mitigation survives "
                 "training")
        else:
            c = compare_worst(mit, g)
            closes = mit["pooled"].homogeneity_p >= 0.01
            v = {"above": "**the mitigation survives real training**: its worst residue lies "
                          "above uniform gated pooling's (disjoint 95 % intervals)"
                          + (" and no phase structure remains (p >= 0.01)" if closes else
                             ", though phase structure remains (p < 0.01)"),
                 "below": "**the mitigation does not survive real training; it is worse**: its "
                          "worst residue lies below uniform gated pooling's",
                 "overlapping": "**the mitigation does not measurably survive real "
                                "training**: the worst residues' 95 % intervals overlap"}[c]
        lines.append(f"- **Does the mitigation survive training?** {v}.")
    bad = [f"{r['design']} seed {r['seed']} ({r['history'][-1][1]:.2f})"
           for r in results["runs"] if r["regime"] == regime and r["history"][-1][1] > 0.5]
    lines.append(
        f"- **Training outcome**: runs whose final training loss is above 0.5 (chance: ln "
        f"{results['regimes'][regime]['config']['fillers']} = {-math.log(chance):.2f}): "
        + (", ".join(bad) if bad else "none") + ". A pooled row mixes its seeds; the seed "
        "columns show the spread.")
    if comp:
        lines.append("- **Knockout** (SpecializationMap's rule: head h serves residue r when "
                     "excluding its entries drops r, or when it alone retrieves r better than no "
                     "head, disjoint 95 % Wilson intervals; per seed; the heads are in the "
                     "knockout table):")
    for name, s in comp.items():
        layers = len(s["spec"][0]["layers"])
        lines.append(
            f"  - {name}: "
            + " | ".join(f"layer {li}: {specialization(s, li)}; every head's entries excluded: "
                         + "/".join(pct(sp['layers'][li]['none_mean']) for sp in s["spec"])
                         + " %" for li in range(layers)) + ".")
    return "\n".join(lines)


def none_by_layer(s):
    """Per layer: the mean over seeds of the accuracy with every head's entries excluded."""
    layers = len(s["spec"][0]["layers"])
    return [float(np.mean([sp["layers"][li]["none_mean"] for sp in s["spec"]]))
            for li in range(layers)]


def specialization(s, li):
    """'seed k: R residues by N heads, C collisions' per seed for layer li."""
    parts = []
    for sp in s["spec"]:
        serves = sp["layers"][li]["map"]
        res, col = coverage(serves)
        heads = sum(1 for h in serves if h)
        parts.append(f"seed {sp['seed']}: {res} residue{'s' * (res != 1)} by {heads} "
                     f"head{'s' * (heads != 1)}, {col} collision{'s' * (col != 1)}")
    return "; ".join(parts)


def agreement(summary):
    """Where the trained models agree with the idealized models (docs/mitigations.md) and where
    not, stated from the numbers of both regimes."""
    lines = []
    r1, r2 = summary.get("R1", {}), summary.get("R2-1L", {})
    g1 = r1.get("gated W8/S8")
    if g1:
        none = none_by_layer(g1)
        needed = [li for li, x in enumerate(none) if x < 0.5 * g1["pooled"].mean]
        lines.append(
            "- **R1 (records, no window boundary can split one)**: the idealized models retrieve "
            "every residue of R1 with uniform tiling. The trained 2-layer models "
            + ("agree: uniform gated pooling shows no phase structure"
               if g1["pooled"].homogeneity_p >= 0.01 else
               "disagree: uniform gated pooling shows phase structure")
            + f" ({row_line('gated W8/S8', g1)}). With every head's entries excluded in one "
            "layer they retrieve "
            + ", ".join(f"{pct(x)} % (layer {li})" for li, x in enumerate(none))
            + "; the retrieval "
            + (f"runs through the entries of layer {', '.join(str(li) for li in needed)} "
               "(excluding them at least halves the accuracy)" if needed else
               "survives the loss of either layer's entries")
            + ". Which heads serve which residues there is in the knockout table.")
    g2 = r2.get("gated W8/S8")
    if g2:
        p = g2["pooled"]
        agree = p.worst_residue == MODULUS - 1 and p.homogeneity_p < 0.01
        lines.append(
            "- **R2 with one layer and L = 0 (the idealized setting)**: the idealized models "
            "predict that uniform W8/S8 leaves the boundary phase 7 (a key whose value token "
            "opens the next window) unserved while heads serve the other phases. The trained "
            "models " + ("agree" if agree else "do not show this")
            + f": {row_line('gated W8/S8', g2)}. Heads serving residues (knockout map): "
            + specialization(g2, 0) + ".")
    mit = r2.get("gated W8/S8 staggered + spread init")
    if g2 and mit:
        others = [(n, r2.get(n)) for n in ("gated W8/S8 staggered", "gated W8/S8 + spread init",
                                            "gated W16/S8 (overlap)")]
        lines.append(
            "- **The mitigation after real training** (idealized models: staggered origins + "
            "spread init serve the boundary phase after training; staggering without the spread "
            "init, and the spread init alone with uniform tiling, do not): worst residue "
            "against uniform gated W8/S8 (95 % Wilson intervals; 'above' = disjoint and "
            f"higher): staggered + spread init {compare_worst(mit, g2)} "
            f"({row_line('staggered + spread init', mit)}; "
            + specialization(mit, 0) + ")"
            + "".join(f"; {n}: {compare_worst(o, g2)} (worst {pct(o['pooled'].worst)} %, mean "
                      f"{pct(o['pooled'].mean)} %)" for n, o in others if o)
            + ".")
    return "\n".join(lines)


def write_page(results, out, args, elapsed):
    summary = summarize(results)
    os.makedirs(out, exist_ok=True)
    plot(summary, os.path.join(out, "trained_models.svg"))
    plot_knockout(summary, os.path.join(out, "trained_models_knockout.svg"))
    cmd = " ".join(["python python/examples/phase_training/study.py"] + results["argv"])
    header = ""
    if results["smoke"]:
        header = ("> **SMOKE RUN**: a few training steps per model, meant to check that the "
                  "program runs, not to measure anything. The study's numbers come from the "
                  "full run (see the command below).\n\n")
    elif args.reduced_note:
        header = f"> **REDUCED RUN**: {args.reduced_note}\n\n"
    loaded = sum(r.get("loaded", False) for r in results["runs"])
    n = results["per_residue"]
    lines = [
        "# Phase sensitivity in trained transformers {#trained_models}",
        "",
        header + "Tiny decoder-only transformers pretrained from scratch with a chunked-compressed "
        "KV cache in every layer, one model per compression design and seed, then evaluated "
        "phase by phase **through phasekv's kernels** (every attention layer runs through "
        "`phasekv.CompressedCache` streaming, `phasekv.prefill` and `phasekv.decode`). This "
        "page is the output of one command; nothing in it is typed by hand.",
        "",
        "```",
        f"{cmd}",
        "```",
        "",
        f"This run: {len(results['runs'])} models"
        + (f" ({loaded} loaded from saved weights, not trained)" if loaded else "")
        + f" in {elapsed / 60:.1f} min with {results['jobs']} worker process(es) of "
        f"torch.set_num_threads({results['threads']}), torch {torch.__version__}, "
        f"phasekv {pk.__version__}, Python {platform.python_version()}, on {platform.machine()} "
        f"({os.cpu_count()} cores visible, loaded: shared with other work while it ran). The "
        "trained weights are saved under `--weights` (default `build/phase_training_weights`); "
        "`--reuse-weights` reruns the evaluation and knockouts from them without training. The "
        "smoke version: `scripts/test-training-smoke.sh` (a venv with torch from PyPI, then "
        "`study.py --smoke` and the tests `python/tests/test_phase_training.py` and "
        "`python/tests/test_torch.py`).",
        "",
        "## In short",
        "",
        agreement(summary),
        "",
        "## What was measured",
        "",
        "- **Tasks**: R1 (the paper's stored records): a context of 64 tokens: fillers (a value, "
        "no key) and records (a key and a value; factorized embeddings, key table + value table, "
        "summed) at random positions; then one query token per record (its key, no value), in "
        "random order; the model predicts the value at each query position. R2 (the paper's "
        "induction task): 64 filler tokens hold key tokens (distinct, never adjacent), each "
        "followed by its value token (a filler); then each key is queried (the key token, then "
        "its value, predicted at the key). Cross-entropy at the query positions only; chance is "
        "one in the number of values.",
        "- **Regimes**:",
    ]
    for name in results["regimes"]:
        reg, rc = REGIMES[name], results["regimes"][name]
        c, t = rc["config"], rc["train"]
        lines.append(
            f"  - **{name}** ({reg.title}): {reg.about} {c['layers']} pre-norm layer(s), d = "
            f"{c['d_model']}, {c['heads']} heads of {c['head_dim']} dims (as many heads as "
            f"phases), MLP {c['mlp']}, learned absolute positions, raw local window L = "
            f"{c['local']}; {c['queries']} records of {c['keys']} keys, {c['fillers']} values "
            f"(chance {100 / c['fillers']:.1f} %). AdamW (lr {t['lr']}, betas 0.9/0.98, weight "
            f"decay {t['weight_decay']}), {t['steps']} steps of batch {t['batch']}, "
            f"{t['warmup']} warmup steps then cosine decay, gradient clipping at 1. Designs: "
            + ", ".join(rc["designs"]) + ".")
    lines += [
        f"- **Seeds** {', '.join(str(s) for s in results['seeds'])} (torch and the corpus) for "
        "every design.",
        "- **Visibility**: every layer's keys and values are seen only through the design's "
        "cache: the raw prefix below the head's origin, the compressed entries of complete "
        "windows and the raw tail / local window, exactly DESIGN.md's visibility (the torch "
        "masks are tested against `phasekv.Geometry.visible`).",
        "- **Designs** (`model.DESIGNS`): full attention (no compression); mean pooling "
        "(phasekv.UniformMean); gated pooling (phasekv.GatedPool, learned scalar gates per head "
        "and offset s_i = z_i . x_i + b_i, identity payload, separate key and value gates); W8/S8 "
        "tiles, W16/S8 and W8/S4 overlap; the phase-spread initialization (docs/mitigations.md: "
        "+0.5 on head h's key gate logit at the offset of phase h S/H and on its value gate "
        "logit one offset later); staggered origins O_h = h S/H per KV head.",
        "- **Memory per token**: a compressed design stores 1/S entries (one key and one value "
        "of d dims each) per token of context per KV head; its raw ring (max(W, L) tokens) and a "
        "staggered head's raw prefix (O_h < S tokens) are constant, not per token. So W8/S8, "
        "W16/S8 and the staggered and spread-init rows are at **equal memory per token** (1/8, "
        "the column `entries / token / head`); W8/S4 stores twice as much (1/4, marked 2x) and "
        "is compared against W8/S8 as an overlap at twice the memory, not as an equal-memory "
        "design. Full attention keeps every token.",
        f"- **Evaluation**: {n} targets per residue (mod 8) per seed "
        f"({n * len(results['seeds'])} pooled): record (R1) or key (R2) positions 8 .. 47, every "
        "residue with the same mean position (28), all outside the query's raw band, so a "
        "target is reachable only through compressed entries; the query sits at position 64. "
        "Reports are `phasekv.eval.report` (95 % Wilson intervals, chi-square homogeneity p, "
        "detected period). A per-head-origin model is evaluated with one single-head "
        "`CompressedCache` per KV head, each with its origin in its policy's geometry. The "
        "column `kernel vs torch` counts prompts where the kernels' prediction differs from the "
        "torch forward's.",
        "- **Head knockout**, every head of every layer, applied at every position of the "
        "layer and propagated through the later layers (all through the kernels): (a) the "
        "head's output zeroed; (b) the head's compressed entries excluded from its softmax "
        "(`entry_bias = -inf` in `phasekv.prefill`), the knockout of "
        "`phasekv/eval/specialization.hpp`; (c) every head's entries excluded but one. A head "
        "*serves* residue r when (b) drops r or (c) retrieves r better than all heads excluded, "
        "with disjoint 95 % Wilson intervals (`SpecializationMap`'s rule; the C++ tool "
        "`phasekv-sweep --specialization-map` drives the idealized models only, so the rule is "
        "applied here in Python); two serving heads on one residue are a collision.",
        "",
    ]
    for name in results["regimes"]:
        s = summary.get(name, {})
        if not s:
            continue
        lines += [
            f"## {name}: {REGIMES[name].title}",
            "",
            "### Findings",
            "",
            findings(name, s, results),
            "",
            "### Results",
            "",
            "Pooled over seeds; seed columns are mean [min, max] over seeds.",
            "",
            table(s),
            "",
            "### Knockout",
            "",
            "Per seed and layer: the residues each head serves (head: residues), how many "
            "residues some head serves and how many two or more serve, the residues lost when "
            "a head's output is zeroed, and the accuracy with every head's entries excluded.",
            "",
            knockout_table(s),
            "",
        ]
    lines += [
        "## Figures",
        "",
        "![accuracy by target residue, pooled (points, 95 % Wilson intervals) and per seed "
        "(lines)](trained_models.svg)",
        "",
        "![accuracy by residue with only one head's compressed entries kept in one layer (each "
        "row a head; last row: none kept), first seed of each compressed "
        "design](trained_models_knockout.svg)",
        "",
        "## Per-design reports (pooled over seeds)",
        "",
    ]
    for reg, ss in summary.items():
        for name, s in ss.items():
            lines += [f"**{reg}, {name}**: {s['pooled'].summary_line()}", "",
                      s["pooled"].to_markdown(), ""]
    lines += [
        "## Limits",
        "",
        f"- Two small tasks, one context length, one model size per regime, "
        f"{len(results['seeds'])} seeds and short training budgets sized for 2 CPU cores; the "
        "paper's models are larger and trained on more varied data.",
        "- R2 is run with one layer and no raw local window, where only the compressor can bind "
        "a key to its value token. R2 with two layers and a raw local window (where a "
        "previous-token head can bind them before pooling, as R1's records are bound by "
        "construction) needs an induction circuit and a longer training budget; it is not "
        "measured here.",
        "- Knockouts are measured at the query position of the planned targets only.",
        "",
    ]
    with open(os.path.join(out, "trained_models.md"), "w") as f:
        f.write("\n".join(lines))
    save_results(results, out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs", help="folder for trained_models.md and figures")
    ap.add_argument("--smoke", action="store_true", help="a few steps per model (CI)")
    ap.add_argument("--regimes", nargs="*", default=list(REGIMES), choices=list(REGIMES))
    ap.add_argument("--designs", nargs="*", default=None, choices=list(M.DESIGNS),
                    help="only these designs of each regime (default: the regime's own list)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=0, help="training steps (0: the regime's)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--per-residue", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--weights", default=os.path.join(REPO, "build", "phase_training_weights"),
                    help="folder for the trained weights ('' to not save them)")
    ap.add_argument("--reuse-weights", action="store_true",
                    help="load saved weights whose configuration matches instead of training")
    ap.add_argument("--page-from", help="rewrite the page from a results JSON of this program "
                    "(no training); the command line shown is the one that made the JSON")
    ap.add_argument("--reduced-note", default="", help="a header line for a reduced run")
    args = ap.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    if args.smoke:
        args.seeds, args.steps, args.per_residue = 1, 3, 4
        args.weights = ""
    t0 = time.time()
    if args.page_from:
        results = load_results(args.page_from)
        planned = sum(len(r["designs"]) for r in results["regimes"].values()) * len(
            results["seeds"])
        if len(results["runs"]) < planned and not args.reduced_note:
            args.reduced_note = (f"the run stopped after {len(results['runs'])} of {planned} "
                                 "models; the page shows those (rewritten from its partial "
                                 "results with --page-from).")
        write_page(results, args.out, args, results.get("elapsed_s", results["total_s"]))
        print(f"rewrote {os.path.join(args.out, 'trained_models.md')} from {args.page_from}")
        return
    results = run(args)
    results["elapsed_s"] = time.time() - t0
    write_page(results, args.out, args, time.time() - t0)
    print(f"wrote {os.path.join(args.out, 'trained_models.md')} in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
