"""The trained-transformer phase study: pretrains tiny decoder-only transformers from scratch
with each compression design and several fixed seeds, evaluates them through phasekv's kernels
phase by phase (phasekv.eval.report), knocks out heads, and writes docs/trained_models.md with
its table, plots and commands. Nothing in the page is typed by hand.

    python python/examples/phase_training/study.py --out docs     # the full study
    python python/examples/phase_training/study.py --smoke --out /tmp/smoke   # < 1 minute

Needs torch, numpy, matplotlib and phasekv (pip install . from the repository root).
"""

import argparse
import dataclasses
import gzip
import json
import math
import os
import platform
import sys
import time

# OpenMP's busy-waiting threads slow torch down several times on shared cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import phasekv as pk  # noqa: E402

import kernels  # noqa: E402
import model as M  # noqa: E402

MODULUS = 8


def plan_targets(cfg, per_residue, lo):
    """Target (record) positions: `per_residue` per residue mod 8, in [lo, lo + 40), every
    residue with the same mean position lo + 20 (residue r draws its window index k from
    {0..3} for a fraction r/8 of its targets and from {1..4} otherwise). Every target lies
    outside the query's raw band, so it is reachable only through compressed entries."""
    out = []
    for r in range(MODULUS):
        n_low = round(per_residue * r / MODULUS)
        ks = [i % 4 for i in range(n_low)] + [1 + i % 4 for i in range(per_residue - n_low)]
        out += [lo + r + 8 * k for k in ks]
    return np.array(out, dtype=np.int64)


def evaluate(m, cfg, per_residue, seed, threads):
    """Per-target outcomes through the kernels (intact, each last-layer head zeroed, each
    last-layer head without its compressed entries, all heads without entries), and the
    torch forward's predictions on the same prompts (a cross-check)."""
    rng = np.random.default_rng(10_000 + seed)
    targets = plan_targets(cfg, per_residue, lo=8)
    assert targets.max() + 1 < cfg.context + 1 - cfg.local, "targets must be compressed"
    tokens, keypos, _ = M.make_batch(rng, cfg, len(targets), targets=targets)
    gold = M.answers(cfg, tokens, keypos)[:, 0].numpy()
    prompt = tokens[:, : cfg.context + 1]
    km = kernels.KernelModel(m, threads=threads)
    res = {"positions": targets.tolist(), "base": [], "zeroed": [], "knocked": [], "none": [],
           "alone": []}
    for b in range(len(targets)):
        o = km.last_layer_outcomes(prompt[b], int(gold[b]))
        res["base"].append(bool(o["base"]))
        res["zeroed"].append([bool(x) for x in o["zeroed"]])
        if o["knocked"] is not None:
            res["knocked"].append([bool(x) for x in o["knocked"]])
            res["none"].append(bool(o["none"]))
            res["alone"].append([bool(x) for x in o["alone"]])
    with torch.no_grad():
        torch_pred = m(prompt)[:, cfg.context].argmax(-1).numpy()
    res["torch_correct"] = (torch_pred == gold).tolist()
    res["kernel_torch_disagreements"] = int(
        sum(bool(a) != bool(b) for a, b in zip(res["base"], res["torch_correct"])))
    return res


def rep(positions, correct):
    return pk.eval.report(positions, correct, modulus=MODULUS)


def served(base, knocked):
    """Residues where the knockout's 95 % Wilson interval lies wholly below the intact
    model's (phasekv::eval::SpecializationMap::needed)."""
    return [r for r in range(MODULUS)
            if knocked.table[r]["ci_high"] < base.table[r]["ci_low"]]


def run(args):
    torch.set_num_threads(args.threads)
    cfg = M.ModelConfig(task=args.task)
    tcfg = M.TrainConfig(steps=args.steps, batch=args.batch)
    designs = [M.DESIGNS[n] for n in args.designs]
    seeds = list(range(1, args.seeds + 1))
    results = {"config": dataclasses.asdict(cfg), "train": dataclasses.asdict(tcfg),
               "seeds": seeds, "per_residue": args.per_residue, "runs": [],
               "argv": args.argv, "threads": args.threads, "smoke": args.smoke,
               "planned": [d.name for d in designs]}
    t_start = time.time()
    for d in designs:
        for seed in seeds:
            t0 = time.time()
            m, hist = M.train(cfg, d, tcfg, seed)
            t1 = time.time()
            ev = evaluate(m, cfg, args.per_residue, seed, args.threads)
            t2 = time.time()
            r = rep(ev["positions"], ev["base"])
            print(f"[{time.time() - t_start:7.1f} s] {d.name:40s} seed {seed}: train "
                  f"{t1 - t0:5.1f} s (final loss {hist[-1][1]:.3f}), eval {t2 - t1:4.1f} s | "
                  f"{r.summary_line()}", flush=True)
            results["runs"].append({"design": d.name, "seed": seed, "history": hist,
                                    "train_s": t1 - t0, "eval_s": t2 - t1, **ev})
            results["total_s"] = time.time() - t_start
            if args.out:  # partial results survive an interrupted run (--page-from)
                save_results(results, args.out)
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


def summarize(results):
    """Per design: pooled reports, per-seed spread, knockout coverage."""
    out = {}
    names = list(dict.fromkeys(r["design"] for r in results["runs"]))
    for name in names:
        runs = [r for r in results["runs"] if r["design"] == name]
        pos = sum((r["positions"] for r in runs), [])
        base = sum((r["base"] for r in runs), [])
        pooled = rep(pos, base)
        per_seed = [rep(r["positions"], r["base"]) for r in runs]
        heads = len(runs[0]["zeroed"][0])
        spec = []
        for r, b in zip(runs, per_seed):
            zero = [served(b, rep(r["positions"], [z[h] for z in r["zeroed"]]))
                    for h in range(heads)]
            knock = ([served(b, rep(r["positions"], [k[h] for k in r["knocked"]]))
                      for h in range(heads)] if r["knocked"] else None)
            drops = [[b.table[q]["accuracy"] - rep(r["positions"], [z[h] for z in r["zeroed"]])
                      .table[q]["accuracy"] for q in range(MODULUS)] for h in range(heads)]
            none = rep(r["positions"], r["none"]) if r["none"] else None
            map_serves = None
            if none is not None and r.get("alone"):
                map_serves = []
                for h in range(heads):
                    alone = rep(r["positions"], [a[h] for a in r["alone"]])
                    suff = [q for q in range(MODULUS)
                            if none.table[q]["ci_high"] < alone.table[q]["ci_low"]]
                    map_serves.append(sorted(set(knock[h]) | set(suff)))
            spec.append({"seed": r["seed"], "zeroed_serves": zero, "knocked_serves": knock,
                         "map_serves": map_serves, "zero_drops": drops,
                         "none_mean": None if none is None else none.mean})
        out[name] = {"pooled": pooled, "per_seed": per_seed, "spec": spec, "runs": runs}
    return out


def coverage(spec_entry, key):
    s = spec_entry[key]
    if s is None:
        return None, None
    residues = set(q for h in s for q in h)
    collisions = sum(1 for q in range(MODULUS) if sum(q in h for h in s) >= 2)
    return len(residues), collisions


def fmt_p(p):
    return f"{p:.2e}" if p < 1e-3 else f"{p:.3f}"


def table(summary):
    rows = ["| design | mean % | worst % [95 % CI] (r) | best % (r) | gap pp | homogeneity p | "
            "period | seed mean % | seed worst % | seed gap pp | per seed: residues served "
            "(zeroing / map), collisions, all entries out | kernel vs torch |",
            "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|:--|--:|"]
    for name, s in summary.items():
        p = s["pooled"]
        w = p.table[p.worst_residue]
        seeds = s["per_seed"]

        def spread(f):
            v = np.array([f(x) for x in seeds]) * 100
            return f"{v.mean():.1f} [{v.min():.1f}, {v.max():.1f}]"

        cov = []
        for sp in s["spec"]:
            z, _ = coverage(sp, "zeroed_serves")
            mp, mc = coverage(sp, "map_serves")
            nm = "" if sp["none_mean"] is None else f", none {pct(sp['none_mean'])} %"
            cov.append(f"{z}" + ("" if mp is None else f"/{mp} c{mc}") + nm)
        dis = sum(r["kernel_torch_disagreements"] for r in s["runs"])
        n = sum(len(r["base"]) for r in s["runs"])
        rows.append(
            f"| {name} | {pct(p.mean)} | {pct(p.worst)} [{pct(w['ci_low'])}, {pct(w['ci_high'])}]"
            f" (r={p.worst_residue}) | {pct(p.best)} (r={p.best_residue}) | {p.gap_pp:.1f} | "
            f"{fmt_p(p.homogeneity_p)} | {p.period} | {spread(lambda x: x.mean)} | "
            f"{spread(lambda x: x.worst)} | {spread(lambda x: x.gap_pp / 100)} | "
            f"{'; '.join(cov)} | {dis} of {n} |")
    return "\n".join(rows)


def plot(summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    cols = 4
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.6 * rows), squeeze=False,
                             sharey=True)
    for ax, name in zip(axes.flat, names):
        s = summary[name]
        s["pooled"].plot(ax=ax, title=name)
        ax.set_title(f"{name}\ngap {s['pooled'].gap_pp:.0f} pp", fontsize=8)
        for r in s["per_seed"]:
            ax.plot(r.column("residue"), 100 * r.column("accuracy"), lw=0.8, alpha=0.5)
        ax.xaxis.label.set_size(7)
        ax.yaxis.label.set_size(7)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_knockout(summary, path):
    """Per compressed design (first seed): accuracy by residue with only head h's compressed
    entries kept in the last layer (every other head's excluded), and with none kept."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, s in summary.items() if s["runs"][0].get("alone")]
    if not names:
        return
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.4 * rows), squeeze=False,
                             constrained_layout=True)
    im = None
    for ax, name in zip(axes.flat, names):
        run = summary[name]["runs"][0]
        heads = len(run["alone"][0])
        grid = [rep(run["positions"], [a[h] for a in run["alone"]]).column("accuracy")
                for h in range(heads)]
        grid.append(rep(run["positions"], run["none"]).column("accuracy"))
        im = ax.imshow(100 * np.array(grid), vmin=0, vmax=100, cmap="viridis", aspect="auto")
        ax.set_title(f"{name}\n(seed {run['seed']})", fontsize=8)
        ax.set_xlabel("target residue (mod 8)", fontsize=7)
        ax.set_ylabel("entries kept: last-layer head", fontsize=7)
        ax.set_xticks(range(MODULUS))
        ax.set_yticks(range(heads + 1))
        ax.set_yticklabels([str(h) for h in range(heads)] + ["none"])
        ax.tick_params(labelsize=6)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    fig.colorbar(im, ax=axes.ravel().tolist(), label="accuracy (%)")
    fig.savefig(path)
    plt.close(fig)


def findings(summary, results):
    """Plain statements computed from the numbers (each names the test it rests on)."""
    lines = []

    def get(name):
        return summary.get(name)

    def ci(s):
        w = s["pooled"].table[s["pooled"].worst_residue]
        return w["ci_low"], w["ci_high"]

    full = get("full attention")
    comp = {n: s for n, s in summary.items() if n != "full attention"}
    sens = [n for n, s in comp.items() if s["pooled"].homogeneity_p < 0.01]
    flat = [n for n, s in comp.items() if s["pooled"].homogeneity_p >= 0.01]
    if full is not None:
        p = full["pooled"]
        lines.append(
            f"- **Full attention** (no compression): mean {pct(p.mean)} %, gap {p.gap_pp:.1f} pp, "
            f"homogeneity p = {fmt_p(p.homogeneity_p)}: "
            + ("no detectable phase structure (p >= 0.01), as the paper reports for full "
               "attention." if p.homogeneity_p >= 0.01 else
               "phase structure even without compression (p < 0.01); the compressed rows "
               "below should be read against it."))
    lines.append(
        f"- **Phase sensitivity under compression** (chi-square homogeneity p < 0.01 over "
        f"residues): {len(sens)} of {len(comp)} compressed designs"
        + (f" ({', '.join(sens)})" if sens else "")
        + (f"; no detectable structure in {', '.join(flat)}" if flat else "")
        + ". The paper reports phase sensitivity in every from-scratch variant; the idealized "
          "models (docs/mitigations.md) predict it wherever heads cannot cover all residues.")
    worst_gap = max(comp.items(), key=lambda kv: kv[1]["pooled"].gap_pp) if comp else None
    if worst_gap:
        lines.append(f"- **Largest gap**: {worst_gap[0]}, {worst_gap[1]['pooled'].gap_pp:.1f} pp "
                     f"(worst residue {worst_gap[1]['pooled'].worst_residue}); the paper's "
                     "from-scratch models reach 78 pp.")
    g = get("gated W8/S8")
    m8 = get("mean W8/S8")
    if g and m8:
        a, b = g["pooled"], m8["pooled"]
        lines.append(
            f"- **Gated vs mean pooling** (W8/S8): mean {pct(a.mean)} vs {pct(b.mean)} %, worst "
            f"{pct(a.worst)} vs {pct(b.worst)} %, gap {a.gap_pp:.1f} vs {b.gap_pp:.1f} pp.")
    ov = get("mean W8/S4 (overlap)")
    if ov and m8:
        a, b = ov["pooled"], m8["pooled"]
        lines.append(
            f"- **Overlap W8/S4 vs tiling W8/S8** (mean pooling; W8/S4 stores twice the entries): "
            f"mean {pct(a.mean)} vs {pct(b.mean)} %, worst {pct(a.worst)} vs {pct(b.worst)} %, "
            f"gap {a.gap_pp:.1f} vs {b.gap_pp:.1f} pp.")
    st = get("gated W8/S8 staggered")
    sts = get("gated W8/S8 staggered + spread init")
    if g and sts:
        lo_s, hi_s = ci(sts)
        lo_g, hi_g = ci(g)
        base_p = g["pooled"].homogeneity_p
        if base_p >= 0.01:
            verdict = ("**nothing to mitigate in these models**: uniform gated pooling shows no "
                       f"detectable phase structure (homogeneity p = {fmt_p(base_p)}), so "
                       "whether the mitigation survives training is not tested by them"
                       + ("; the mitigation row is not worse (overlapping worst-residue "
                          "intervals)" if not hi_s < lo_g else
                          "; the mitigation row is worse (disjoint worst-residue intervals "
                          "below)"))
        elif lo_s > hi_g:
            verdict = ("**the mitigation survives real training**: the worst residue of "
                       "staggered origins + spread init is above uniform gated pooling's, with "
                       "disjoint 95 % Wilson intervals")
        elif hi_s < lo_g:
            verdict = ("**the mitigation does not survive; it is worse**: the worst residue "
                       "of staggered + spread init lies below uniform gated pooling's (disjoint "
                       "95 % intervals)")
        else:
            verdict = ("**the mitigation does not measurably survive real training**: the "
                       "worst residues' 95 % Wilson intervals overlap")
        lines.append(
            f"- **Mitigation** (docs/mitigations.md: staggered origins + phase-spread init raise "
            f"the idealized worst residue from 0.1 % to 78.9 %): here worst "
            f"{pct(sts['pooled'].worst)} % [{pct(lo_s)}, {pct(hi_s)}] vs gated W8/S8 "
            f"{pct(g['pooled'].worst)} % [{pct(lo_g)}, {pct(hi_g)}], gap "
            f"{sts['pooled'].gap_pp:.1f} vs {g['pooled'].gap_pp:.1f} pp, mean "
            f"{pct(sts['pooled'].mean)} vs {pct(g['pooled'].mean)} %: {verdict}."
            + (f" Staggered origins without the spread init: worst {pct(st['pooled'].worst)} %, "
               f"gap {st['pooled'].gap_pp:.1f} pp." if st else ""))
    unconverged = [f"{r['design']} seed {r['seed']} ({r['history'][-1][1]:.2f})"
                   for r in results["runs"] if r["history"][-1][1] > 0.5]
    lines.append(
        "- **Training outcome varies by seed**: runs whose final training loss is above 0.5 "
        "(chance is ln " + str(results["config"]["fillers"]) + f" = "
        f"{math.log(results['config']['fillers']):.2f}): "
        + (", ".join(unconverged) if unconverged else "none") + ". A design's pooled row "
        "mixes converged and unconverged seeds; the seed columns show the spread.")
    lines.append(
        "- **Against the idealized models**: docs/mitigations.md's hand-set R1 with a head "
        "per phase retrieves every residue (uniform W8/S8: worst 100 %), its trained rows are "
        "R2 only. The idealized models assume query-independent compressors that key one "
        "offset per head; learned gates here see the token content (s_i = z_i . x_i + b_i) "
        "and records differ from fillers in content, so a gate can pick the record wherever "
        "it sits in the window. Where a trained row shows no phase structure, that is the "
        "agreement with hand-set R1; where knockout finds single heads serving single "
        "residues, that is the idealized models' one-phase-per-head picture.")
    specs, silent = [], []
    for name, s in comp.items():
        key = "map_serves" if s["spec"][0]["map_serves"] is not None else "zeroed_serves"
        parts = []
        for sp in s["spec"]:
            heads_used = sum(1 for h in sp[key] if h)
            res, col = coverage(sp, key)
            if res:
                parts.append(f"seed {sp['seed']}: {res} residues by {heads_used} heads, {col} "
                             "collisions")
        if parts:
            specs.append(f"{name}: {'; '.join(parts)}")
        else:
            silent.append(name)
    lines.append(
        "- **Phase specialization in the last layer** (phasekv::eval::SpecializationMap's rule: "
        "head h serves residue r when excluding its entries drops r, or when it alone retrieves "
        "r better than no head, disjoint 95 % Wilson intervals in both cases): "
        + (" | ".join(specs) + ". " if specs else "")
        + (f"no last-layer head serves any residue in any seed of {', '.join(silent)}. "
           if silent else "")
        + "The idealized models predict one phase per head (docs/mitigations.md).")
    bypass = []
    for name, s in comp.items():
        nm = [sp["none_mean"] for sp in s["spec"] if sp["none_mean"] is not None]
        if nm and np.mean(nm) >= 0.5 * s["pooled"].mean and s["pooled"].mean > 0.5:
            bypass.append(f"{name} ({pct(float(np.mean(nm)))} % of {pct(s['pooled'].mean)} %)")
    if bypass:
        lines.append(
            "- **Retrieval does not run through the last layer's entries**: with every "
            "last-layer head's compressed entries excluded the models still retrieve most "
            "targets: " + ", ".join(bypass) + ". Every target lies outside the query's raw "
            "band, so the value must travel through the first layer's compressed entries (read "
            "at the query position, or at the raw positions the last layer still sees), and "
            "the last-layer knockout cannot show which heads serve which phases. Knocking out "
            "first-layer heads is the missing measurement (not run).")
    return "\n".join(lines)


def write_page(results, out, args, elapsed):
    summary = summarize(results)
    os.makedirs(out, exist_ok=True)
    plot(summary, os.path.join(out, "trained_models.svg"))
    plot_knockout(summary, os.path.join(out, "trained_models_knockout.svg"))
    cfg, tcfg = results["config"], results["train"]
    cmd = " ".join(["python python/examples/phase_training/study.py"] + args.argv)
    header = ""
    if args.smoke:
        header = ("> **SMOKE RUN**: a few training steps per model, meant to check that the "
                  "program runs, not to measure anything. The study's numbers come from the "
                  "full run (see the command below).\n\n")
    elif args.reduced_note:
        header = f"> **REDUCED RUN**: {args.reduced_note}\n\n"
    per_seed_n = results["per_residue"]
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
        f"This run: {len(results['runs'])} models in {elapsed / 60:.1f} min "
        f"(training and evaluation {results['total_s'] / 60:.1f} min) with "
        f"torch.set_num_threads({args.threads}), torch {torch.__version__}, "
        f"phasekv {pk.__version__}, Python {platform.python_version()}, on {platform.machine()} "
        f"({os.cpu_count()} cores visible; shared with other work while it ran). The smoke "
        "version: `scripts/test-training-smoke.sh` (a venv with torch from PyPI, then "
        "`study.py --smoke` and the tests `python/tests/test_phase_training.py` and "
        "`python/tests/test_torch.py`).",
        "",
        "## What was measured",
        "",
        f"- **Task** ({cfg['task']}, the paper's "
        + ("R1, stored records" if cfg["task"] == "R1" else "R2, induction")
        + f"): a context of {cfg['context']} tokens: fillers (a value from {cfg['fillers']}, no "
        f"key) and {cfg['queries']} records (a key from {cfg['keys']} and a value; factorized "
        "embeddings, key table + value table, summed) at random positions; then one query "
        "token per record (its key, no value), in random order. The model predicts the value "
        "at each query position (cross-entropy there only). Chance: "
        f"{100 / cfg['fillers']:.1f} %.",
        f"- **Model**: {cfg['layers']} pre-norm layers, d = {cfg['d_model']}, {cfg['heads']} "
        f"heads of {cfg['head_dim']} dims (as many heads as phases: the idealized study's "
        f"condition for closing the gap), MLP {cfg['mlp']}, learned absolute positions, "
        f"raw local window L = {cfg['local']} (the paper's small models use 16). Every layer's "
        "keys and values are seen only through the design's cache: the raw prefix below the "
        "head's origin, the compressed entries of complete windows and the raw tail / local "
        "window, exactly DESIGN.md's visibility (the torch masks are tested against "
        "`phasekv.Geometry.visible`).",
        f"- **Training**: AdamW (lr {tcfg['lr']}, betas 0.9/0.98, weight decay "
        f"{tcfg['weight_decay']}), {tcfg['steps']} steps of batch {tcfg['batch']}, "
        f"{tcfg['warmup']} warmup steps then cosine decay, gradient clipping at 1; seeds "
        f"{', '.join(str(s) for s in results['seeds'])} (torch and the corpus).",
        "- **Designs** (`model.DESIGNS`): full attention (no compression, the control); mean "
        "pooling W8/S8 (phasekv.UniformMean); mean W8/S4 (overlap, twice the entries per "
        "token); mean W16/S8 (overlap at equal entries per token); gated pooling W8/S8 "
        "(phasekv.GatedPool, learned scalar gates per head and offset s_i = z_i . x_i + b_i, "
        "identity payload, separate key and value gates); gated W8/S8 with the phase-spread "
        "initialization (docs/mitigations.md: +0.5 on head h's key gate logit at the offset of "
        "phase h S/H and on its value gate logit one offset later); gated W8/S8 with staggered "
        "origins O_h = h S/H per KV head, without and with the spread initialization. Entries "
        "per token are 1/S per head in every compressed design but W8/S4 (2/S); staggered "
        "heads keep O_h extra raw prefix tokens. **This run trained**: "
        + ", ".join(results.get("planned", [])) + "; the others are not in it (`--designs`).",
        f"- **Evaluation**: {per_seed_n} targets per residue (mod 8) per seed ("
        f"{per_seed_n * len(results['seeds'])} pooled), record positions 8 .. 47, every "
        "residue with the same mean position (28), all outside the query's raw band, so a "
        "target is reachable only through compressed entries; the query sits at position "
        f"{cfg['context']} (fixed). Reports are `phasekv.eval.report` (95 % Wilson intervals, "
        "chi-square homogeneity p, detected period). A per-head-origin model is evaluated "
        "with one single-head `CompressedCache` per KV head, each with its origin in its "
        "policy's geometry (no Staggered* type). The last column counts prompts where the "
        "kernels' prediction differs from the torch forward's.",
        "- **Head knockout** (last layer, at the query position): (a) the head's output "
        "zeroed; (b) the head's compressed entries excluded from its softmax (`entry_bias = "
        "-inf` through `phasekv.decode_arrays`), the knockout of "
        "`phasekv/eval/specialization.hpp` (the C++ tool `phasekv-sweep --specialization-map` "
        "drives the idealized models only, so the rule is applied here in Python). A head "
        "*serves* residue r when the knocked-out model's 95 % Wilson interval lies wholly "
        "below the intact model's (`SpecializationMap::needed`); two serving heads on one "
        "residue are a collision.",
        "",
        "## Findings",
        "",
        findings(summary, results),
        "",
        "## Results",
        "",
        "Pooled over seeds; seed columns are mean [min, max] over seeds; residues served: per "
        "seed, the residues with a serving head under (a) zeroing one head / the specialization "
        "map (entries excluded, or the head alone), `cN` the map's collisions (residues served "
        "by two or more heads), and the accuracy with every last-layer head's entries "
        "excluded (`none`).",
        "",
        table(summary),
        "",
        "![accuracy by target residue, pooled (points, 95 % Wilson intervals) and per seed "
        "(lines)](trained_models.svg)",
        "",
        "![accuracy by residue with only one last-layer head's compressed entries kept (each "
        "row a head; last row: none kept), first seed of each compressed "
        "design](trained_models_knockout.svg)",
        "",
        "### Per-design reports (pooled over seeds)",
        "",
    ]
    for name, s in summary.items():
        lines += [f"**{name}**: {s['pooled'].summary_line()}", "", s["pooled"].to_markdown(), ""]
        for sp in s["spec"]:
            z = ", ".join(f"h{h}: {v}" for h, v in enumerate(sp["zeroed_serves"]) if v)
            k = ("" if sp["knocked_serves"] is None else "; entries knocked out: " + (", ".join(
                f"h{h}: {v}" for h, v in enumerate(sp["knocked_serves"]) if v) or "none"))
            mp = ("" if sp["map_serves"] is None else "; map (knocked or alone): " + (", ".join(
                f"h{h}: {v}" for h, v in enumerate(sp["map_serves"]) if v) or "none"))
            lines.append(f"- seed {sp['seed']}: heads serving residues, zeroed: {z or 'none'}{k}"
                         f"{mp}")
        lines.append("")
    lines += [
        "## Limits",
        "",
        "- One small task (R1 stored records), one context length, one model size, "
        f"{len(results['seeds'])} seeds and a short training budget sized for 2 CPU cores; the "
        "paper's models are larger and trained on more varied data.",
        "- The induction task R2 (`--task R2`: a key token, then its value token in the next "
        "position) is implemented but not part of this run: in a development probe (full "
        "attention, 500 steps) this model size stayed at chance on it, and a budget in which "
        "it would learn does not fit 2 cores. So the boundary-phase question of R2 (a key "
        "whose successor lies in the next window, the weak phase of every idealized design) "
        "is not answered here; R1 has no such boundary.",
        "- Knockout covers the last layer's heads at the query position; the first layer's "
        "heads are not knocked out.",
        "",
    ]
    with open(os.path.join(out, "trained_models.md"), "w") as f:
        f.write("\n".join(lines))
    save_results(results, out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs", help="folder for trained_models.md and figures")
    ap.add_argument("--smoke", action="store_true", help="a few steps per model (CI)")
    ap.add_argument("--task", default="R1", choices=["R1", "R2"])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--per-residue", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--designs", nargs="*", default=M.STUDY,
                    help=f"design names (default: {', '.join(M.STUDY)}; all: "
                         f"{', '.join(M.DESIGNS)})")
    ap.add_argument("--page-from", help="rewrite the page from a results JSON of this program "
                    "(no training); the command line shown is the one that made the JSON")
    ap.add_argument("--reduced-note", default="", help="a header line for a reduced run")
    args = ap.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    if args.smoke:
        args.seeds, args.steps, args.per_residue = 1, 3, 8
        args.designs = list(M.DESIGNS)
    t0 = time.time()
    if args.page_from:
        results = load_results(args.page_from)
        args.argv, args.threads, args.smoke = results["argv"], results["threads"], results["smoke"]
        planned = len(results["planned"]) * len(results["seeds"])
        if len(results["runs"]) < planned and not args.reduced_note:
            args.reduced_note = (f"the run stopped after {len(results['runs'])} of {planned} "
                                 "models; the page shows those (rewritten from its partial "
                                 "results with --page-from).")
        write_page(results, args.out, args, results.get("elapsed_s", results["total_s"]))
        print(f"rewrote {os.path.join(args.out, 'trained_models.md')} from {args.page_from}")
        return
    results = run(args)
    results["argv"], results["threads"] = args.argv, args.threads
    results["elapsed_s"] = time.time() - t0
    write_page(results, args.out, args, time.time() - t0)
    print(f"wrote {os.path.join(args.out, 'trained_models.md')} in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
