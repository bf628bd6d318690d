/// @file
/// @brief The idealized retrieval tasks R1/R2 through a DeepSeek-V4 attention layer: the
/// model's compressor (phasekv::dsv4::compress), an idealized indexer run through
/// phasekv::dsv4::indexer_top_k, and phasekv::dsv4::sparse_attention over the sliding window
/// plus the selected entries.
///
/// The layer has one latent row per token that is both key and value (K = V). The harness
/// builds it from the task's embeddings as `[value | key]` (2d channels): R1 stores
/// `[E_V(y_t) | E_K(x_t)]`, R2 `[E(x_t) | E(x_t)]`. The query is `[0 | gamma E_K(x_p)]`, so
/// logits come from the key half only, and the attention's value is the leading d channels
/// (`dim_v = d`); the prediction is `argmax_y <o, E_V(y)>` (R1) or `argmax_y <o, E(y)>` (R2), as
/// in phasekv::eval::run_retrieval.
///
/// **Compressor (idealized inputs).** Ratio S, `coff` = 2 for CSA (window of 2S tokens: entry
/// j pools `[(j - 1) S, (j + 1) S)`, entry 0 only its current half) or 1 for HCA (entry j pools
/// block j). A token at window offset `o` (0 .. coff S - 1; offset o is half `o / S`, slot
/// `o mod S`) gets the per-channel score `ape[o mod S][half, c] + z(t, c)`: `ape` is
/// `sharpness` on the key channels at each key offset and on the value channels at each value
/// offset (the key offset for R1, key offset + 1 for R2: the successor), 0 elsewhere; `z` is
/// `content_scale` times N(0, 1) per token and channel (content-dependent scores). With no
/// offsets the pooling is uniform over the window (up to `z`). This is the one-hot gate of the
/// idealized model expressed through the model's own score/ape interface: with a large
/// sharpness the key half of entry j is (nearly) the key at the key offset and its value half
/// the value at the value offset.
///
/// **Indexer (CSA only; HCA attends to every visible entry).** Per query the selected entries
/// are the top-k of an idealized index score, computed by phasekv::dsv4::indexer_top_k (one
/// head, weight 1, ReLU, ties to the lower index, -1 padding) over `floor(n / S)` visible
/// entries:
/// - `Dsv4Indexer::all`: no selection, every visible entry (as HCA).
/// - `Dsv4Indexer::exact`: score `ReLU(<E_K(x_p), key half of e_j> + noise z_j)`, the
///   attention's own logit of entry j (up to gamma): the indexer the model's training aims at
///   (it is fitted to the attention's distribution); perfect at `index_noise` = 0.
/// - `Dsv4Indexer::oracle`: score `ReLU(h_j + noise z_j)`, `h_j` = 1 when window j holds the
///   target token and 0 otherwise: it knows where the target is but not how the compressor
///   pooled it (with CSA's overlap both windows of the target tie).
/// - `Dsv4Indexer::lightning`: the indexer's own keys are the dsv4 compressor's pooling of
///   `E_K(x_t)` (ratio S, coff 2, its own `ape`: `index_sharpness` at `index_offset`, 0
///   elsewhere, so uniform pooling at 0); score `ReLU(<E_K(x_p), k_j> + noise z_j)`.
///
/// `z_j` is N(0, 1), drawn afresh per query. Targets lie at depths (query position minus target
/// position) in `[min_depth, max_depth]`; by default beyond the sliding window
/// (`min_depth = window + 2 coff S`), where the raw rows no longer hold the target.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/dsv4/compressor.hpp"
#include "phasekv/dsv4/indexer.hpp"
#include "phasekv/dsv4/sparse_attention.hpp"
#include "phasekv/eval/retrieval.hpp"
#include "phasekv/eval/stats.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/phase/residue.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace eval {

/// Which DeepSeek-V4 compressed layer the harness runs.
enum class Dsv4Layer : std::uint8_t {
  csa,  ///< Compressed sparse attention: ratio 4, overlapping window (coff = 2), indexer.
  hca,  ///< Heavily compressed attention: ratio 128, coff = 1, every entry attended.
};

/// The idealized indexer of a CSA layer.
enum class Dsv4Indexer : std::uint8_t {
  all,        ///< No selection: every visible entry.
  exact,      ///< Scores entries by the attention's own logit (plus noise).
  oracle,     ///< Knows which windows hold the target (plus noise).
  lightning,  ///< Scores its own compressed keys against the query (plus noise).
};

/// "all", "exact", "oracle" or "lightning".
inline const char* to_string(Dsv4Indexer i) {
  switch (i) {
    case Dsv4Indexer::all: return "all";
    case Dsv4Indexer::exact: return "exact";
    case Dsv4Indexer::oracle: return "oracle";
    default: return "lightning";
  }
}

/// Parameters of the DeepSeek-V4 layer of a retrieval run (see the file comment).
struct Dsv4Config {
  Dsv4Layer layer = Dsv4Layer::csa;  ///< CSA or HCA.
  std::int64_t ratio = 0;            ///< S; 0 = the model's (4 for CSA, 128 for HCA).
  std::int64_t window = 128;         ///< Sliding window of raw rows (0: none).
  /// Key offsets in the compressor window, each in `[0, coff * S)` (R2: key offset + 1 must
  /// be < coff * S too); empty = no position preference (uniform pooling).
  std::vector<std::int64_t> offsets;
  double sharpness = 30.0;                       ///< ape bias at the key / value offsets.
  double content_scale = 0.0;                    ///< Std of the random per-token scores z.
  Dsv4Indexer indexer = Dsv4Indexer::lightning;  ///< CSA's selection.
  std::int64_t top_k = 16;                       ///< Entries kept per query (CSA).
  double index_sharpness = 0.0;                  ///< Lightning indexer: ape bias at index_offset.
  std::int64_t index_offset = 0;                 ///< Lightning indexer: offset in `[0, 2 S)`.
  double index_noise = 0.0;                      ///< Std of the noise added to every index score.
  std::int64_t min_depth = 0;  ///< Targets at depth >= this; 0 = window + 2 coff S.
  std::int64_t max_depth = 0;  ///< Targets at depth <= this; 0 = as deep as the context.

  /// coff: 2 for CSA, 1 for HCA.
  std::int64_t coff() const { return layer == Dsv4Layer::csa ? 2 : 1; }
  /// S, with the model's default for 0.
  std::int64_t stride() const { return ratio > 0 ? ratio : (layer == Dsv4Layer::csa ? 4 : 128); }
  /// The default or given minimum depth.
  std::int64_t first_depth() const {
    return min_depth > 0 ? min_depth : window + 2 * coff() * stride();
  }
};

/// Outcome of a DeepSeek-V4 retrieval run: the per-residue tally and trials, plus how often
/// the selection kept an entry whose window holds the target.
struct Dsv4RetrievalResult {
  RetrievalResult retrieval;  ///< Per-residue accuracy and every trial.
  /// Per residue: trials in which at least one selected (attended) entry's window holds the
  /// target (always for HCA and Dsv4Indexer::all, when such an entry is visible).
  PhaseTally selected{1};
};

namespace detail {

// The entries whose window holds position p: CSA windows floor(p/S) and floor(p/S) + 1, HCA
// window floor(p/S); only those below J.
inline bool dsv4_window_holds(const Dsv4Config& c, std::int64_t j, std::int64_t p) {
  const std::int64_t S = c.stride(), b = p / S;
  return j == b || (c.coff() == 2 && j == b + 1);
}

inline void check_dsv4(const char* where, const RetrievalConfig& cfg, const Dsv4Config& c) {
  using phasekv::detail::check_arg;
  check_arg(cfg.dim >= 1 && cfg.dim <= 65536, where, "dim", cfg.dim, "must be in [1, 65536]");
  check_arg(cfg.heads == 1, where, "heads", cfg.heads,
            "must be 1 (one latent, one query head; more identical heads add nothing)");
  check_arg(cfg.context >= 2, where, "context", cfg.context, "must be >= 2");
  check_arg(cfg.vocab >= cfg.context, where, "vocab", cfg.vocab,
            "must be >= context (tokens of a context are distinct)");
  check_arg(cfg.contexts >= 1, where, "contexts", cfg.contexts, "must be >= 1");
  check_arg(cfg.targets_per_group >= 1, where, "targets_per_group", cfg.targets_per_group,
            "must be >= 1");
  check_arg(std::isfinite(cfg.gamma) && cfg.gamma > 0.0, where, "gamma", cfg.gamma,
            "must be finite and > 0");
  check_arg(cfg.knockout.empty(), where, "knockout.size()",
            static_cast<std::int64_t>(cfg.knockout.size()), "must be 0 (no KV heads to knock out)");
  check_arg(cfg.origins.empty(), where, "origins.size()",
            static_cast<std::int64_t>(cfg.origins.size()), "must be 0 (the model has one origin)");
  const std::int64_t S = c.stride(), W = c.coff() * S;
  check_arg(c.ratio >= 0 && c.ratio <= (std::int64_t{1} << 20), where, "dsv4.ratio", c.ratio,
            "must be in [0, 2^20] (0: the model's)");
  check_arg(c.window >= 0 && c.window <= (std::int64_t{1} << 24), where, "dsv4.window", c.window,
            "must be in [0, 2^24]");
  const std::int64_t shift = cfg.task == Task::R2 ? 1 : 0;
  for (std::int64_t o : c.offsets)
    check_arg(o >= 0 && o + shift < W, where, "dsv4.offsets[]", o,
              cfg.task == Task::R2 ? "must be in [0, coff * S - 1) (the value offset is o + 1)"
                                   : "must be in [0, coff * S)");
  check_arg(std::isfinite(c.sharpness), where, "dsv4.sharpness", c.sharpness, "must be finite");
  check_arg(std::isfinite(c.content_scale) && c.content_scale >= 0.0, where, "dsv4.content_scale",
            c.content_scale, "must be finite and >= 0");
  check_arg(c.top_k >= 1 && c.top_k <= (std::int64_t{1} << 30), where, "dsv4.top_k", c.top_k,
            "must be in [1, 2^30]");
  check_arg(std::isfinite(c.index_sharpness), where, "dsv4.index_sharpness", c.index_sharpness,
            "must be finite");
  check_arg(c.index_offset >= 0 && c.index_offset < 2 * S, where, "dsv4.index_offset",
            c.index_offset, "must be in [0, 2 S)");
  check_arg(std::isfinite(c.index_noise) && c.index_noise >= 0.0, where, "dsv4.index_noise",
            c.index_noise, "must be finite and >= 0");
  check_arg(c.min_depth >= 0 && c.max_depth >= 0, where, "dsv4.min_depth",
            std::min(c.min_depth, c.max_depth), "depths must be >= 0");
  check_arg(c.first_depth() >= 2, where, "dsv4.min_depth", c.first_depth(),
            "must be >= 2 (the successor of an R2 target must precede the query)");
  check_arg(c.max_depth == 0 || c.max_depth >= c.first_depth(), where, "dsv4.max_depth",
            c.max_depth, "must be 0 or >= min_depth");
}

}  // namespace detail

/// Where the targets of a DeepSeek-V4 run lie: whole residue blocks of `modulus` positions at
/// depths `[min_depth, max_depth]` below the query at `context - 1`. Throws
/// phasekv::invalid_argument naming `dsv4.min_depth` when no block fits.
inline detail::TargetRange dsv4_targets(const RetrievalConfig& cfg, const Dsv4Config& c) {
  const char* where = "phasekv::eval::run_dsv4_retrieval";
  detail::TargetRange r;
  r.modulus = cfg.modulus > 0 ? cfg.modulus : (c.layer == Dsv4Layer::csa ? 8 : c.stride());
  phasekv::detail::check_arg(r.modulus <= (std::int64_t{1} << 20), where, "modulus", r.modulus,
                             "must be <= 2^20");
  const std::int64_t t_query = cfg.context - 1;
  const std::int64_t hi = t_query - c.first_depth();
  r.lo = c.max_depth > 0 ? std::max<std::int64_t>(0, t_query - c.max_depth) : 0;
  r.blocks = hi >= r.lo ? (hi - r.lo + 1) / r.modulus : 0;
  phasekv::detail::check_arg(r.blocks >= 1, where, "dsv4.min_depth", c.first_depth(),
                             "leaves no room for targets (the depths must span at least one "
                             "block of modulus positions inside the context)");
  return r;
}

/// Runs R1 or R2 (cfg.task) through one DeepSeek-V4 layer (see the file comment): per context,
/// the latent rows, the compressor's entries (phasekv::dsv4::compress) and, for the lightning
/// indexer, its keys; per target, the selection (phasekv::dsv4::indexer_top_k) and
/// phasekv::dsv4::sparse_attention of the query at `context - 1`. Uses cfg's task, dim, vocab,
/// context, gamma, modulus (0: 8 for CSA, S for HCA), contexts, targets_per_group and seed;
/// cfg.heads must be 1 and knockout and origins empty (cfg.local is not used: the layer's
/// window is dsv4.window). Residues are positions modulo the modulus. `progress(done, total)`
/// is called after each context when set. Throws phasekv::invalid_argument naming a bad
/// setting before running anything.
inline Dsv4RetrievalResult run_dsv4_retrieval(
    const RetrievalConfig& cfg, const Dsv4Config& c,
    const std::function<void(std::int64_t, std::int64_t)>& progress = {}) {
  detail::check_dsv4("phasekv::eval::run_dsv4_retrieval", cfg, c);
  const detail::TargetRange tr = dsv4_targets(cfg, c);
  const std::int64_t T = cfg.context, d = cfg.dim, d2 = 2 * d, S = c.stride(), coff = c.coff();
  const std::int64_t rw = coff * d2, J = T / S, m = tr.modulus;
  const bool csa = c.layer == Dsv4Layer::csa;
  const bool select = csa && c.indexer != Dsv4Indexer::all;
  const std::int64_t shift = cfg.task == Task::R2 ? 1 : 0;

  // The compressor's ape: window offset o is half o / S, slot o mod S.
  std::vector<float> ape(static_cast<std::size_t>(S * rw), 0.0f);
  for (std::int64_t o : c.offsets) {
    const std::int64_t ko = o, vo = o + shift;
    for (std::int64_t i = 0; i < d; ++i) {
      ape[static_cast<std::size_t>((ko % S) * rw + (ko / S) * d2 + d + i)] =
          static_cast<float>(c.sharpness);
      ape[static_cast<std::size_t>((vo % S) * rw + (vo / S) * d2 + i)] =
          static_cast<float>(c.sharpness);
    }
  }
  dsv4::CompressorParams cp{S, coff, d2, ape.data()};
  // The lightning indexer's compressor (always coff 2, as CSA's), keys d wide.
  std::vector<float> iape(static_cast<std::size_t>(S * 2 * d), 0.0f);
  for (std::int64_t i = 0; i < d; ++i)
    iape[static_cast<std::size_t>((c.index_offset % S) * 2 * d + (c.index_offset / S) * d + i)] =
        static_cast<float>(c.index_sharpness);
  dsv4::CompressorParams ip{S, 2, d, iape.data()};

  Rng rng(cfg.seed);
  detail::RetrievalContexts ctx(cfg, rng);
  Rng noise(cfg.seed ^ 0x6a09e667f3bcc909ULL);  // scores z and index noise
  const Embeddings& out_table = cfg.task == Task::R1 ? ctx.values() : ctx.keys();

  std::vector<float> raw(static_cast<std::size_t>(T * d2)), kv(static_cast<std::size_t>(T * rw)),
      score(kv.size(), 0.0f), entries(static_cast<std::size_t>(std::max<std::int64_t>(J, 1) * d2));
  std::vector<float> ikv, iscore, ikeys, ibuf;
  const std::int64_t idim = c.indexer == Dsv4Indexer::oracle ? 2 : d + 1;  // + the noise channel
  if (select) {
    ibuf.resize(static_cast<std::size_t>(std::max<std::int64_t>(J, 1) * idim));
    if (c.indexer == Dsv4Indexer::lightning) {
      ikv.resize(static_cast<std::size_t>(T * 2 * d));
      iscore.assign(ikv.size(), 0.0f);
      ikeys.resize(static_cast<std::size_t>(std::max<std::int64_t>(J, 1) * d));
    }
  }
  dsv4::IndexerParams xp;
  xp.heads = 1;
  xp.dim = idim;
  xp.top_k = c.top_k;
  xp.geometry = Geometry(S, S);
  dsv4::SparseAttentionParams ap;
  ap.heads = 1;
  ap.dim = d2;
  ap.dim_v = d;
  ap.window = c.window;
  ap.scale = 1.0f;
  std::vector<float> q(static_cast<std::size_t>(d2), 0.0f), iq(static_cast<std::size_t>(idim)),
      out(static_cast<std::size_t>(d));
  std::vector<std::int32_t> idx(static_cast<std::size_t>(select ? c.top_k : 0));
  const float one = 1.0f;
  std::vector<double> o(static_cast<std::size_t>(d));
  float lse = 0.0f;

  Dsv4RetrievalResult res;
  res.retrieval.tally = PhaseTally(m);
  res.selected = PhaseTally(m);
  for (std::int64_t cidx = 0; cidx < cfg.contexts; ++cidx) {
    ctx.draw(rng);
    for (std::int64_t t = 0; t < T; ++t) {
      const float* ek = ctx.keys()[ctx.token(t)];
      const float* ev = cfg.task == Task::R1 ? ctx.values()[ctx.value_token(t)] : ek;
      float* row = raw.data() + t * d2;
      std::copy(ev, ev + d, row);
      std::copy(ek, ek + d, row + d);
      for (std::int64_t h = 0; h < coff; ++h) std::copy(row, row + d2, kv.data() + t * rw + h * d2);
      if (select && c.indexer == Dsv4Indexer::lightning) {
        std::copy(ek, ek + d, ikv.data() + t * 2 * d);
        std::copy(ek, ek + d, ikv.data() + t * 2 * d + d);
      }
    }
    if (c.content_scale > 0.0)
      for (float& z : score) z = static_cast<float>(c.content_scale * noise.normal());
    if (J > 0) dsv4::compress<float>(cp, kv.data(), score.data(), T, entries.data());
    if (select && c.indexer == Dsv4Indexer::lightning && J > 0) {
      dsv4::compress<float>(ip, ikv.data(), iscore.data(), T, ikeys.data());
      for (std::int64_t j = 0; j < J; ++j)
        std::copy(ikeys.data() + j * d, ikeys.data() + (j + 1) * d, ibuf.data() + j * idim);
    }
    if (select && c.indexer == Dsv4Indexer::exact)
      for (std::int64_t j = 0; j < J; ++j)
        std::copy(entries.data() + j * d2 + d, entries.data() + (j + 1) * d2,
                  ibuf.data() + j * idim);
    const dsv4::LatentRows<float> raw_rows{raw.data(), 0, T, d2, 1.0f};
    const dsv4::LatentRows<float> entry_rows{entries.data(), 0, J, d2, 1.0f};
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t k = 0; k < cfg.targets_per_group; ++k) {
        const std::int64_t p = tr.lo + m * rng.below(tr.blocks) + residue(r - tr.lo, m);
        const float* ek = ctx.keys()[ctx.token(p)];
        for (std::int64_t i = 0; i < d; ++i)
          q[static_cast<std::size_t>(d + i)] = static_cast<float>(cfg.gamma * ek[i]);
        bool held = false;
        const std::int32_t* sel = nullptr;
        std::int64_t count = J;
        if (select) {
          for (std::int64_t j = 0; j < J; ++j) {
            float* key = ibuf.data() + j * idim;
            if (c.indexer == Dsv4Indexer::oracle)
              key[0] = detail::dsv4_window_holds(c, j, p) ? 1.0f : 0.0f;
            key[idim - 1] = static_cast<float>(c.index_noise * noise.normal());
          }
          if (c.indexer == Dsv4Indexer::oracle) {
            iq[0] = 1.0f;
          } else {
            std::copy(ek, ek + d, iq.begin());
          }
          iq[static_cast<std::size_t>(idim - 1)] = 1.0f;
          dsv4::indexer_decode<float>(xp, iq.data(), &one, ibuf.data(), J, idim, T, idx.data());
          sel = idx.data();
          count = c.top_k;
          for (std::int32_t j : idx) held = held || (j >= 0 && detail::dsv4_window_holds(c, j, p));
        } else {
          for (std::int64_t j = 0; j < J && !held; ++j) held = detail::dsv4_window_holds(c, j, p);
        }
        dsv4::sparse_attention<float>(ap, q.data(), raw_rows, entry_rows, sel, count, T - 1, 1,
                                      out.data(), &lse);
        for (std::int64_t i = 0; i < d; ++i)
          o[static_cast<std::size_t>(i)] = out[static_cast<std::size_t>(i)];
        const std::int64_t pred = out_table.argmax(o.data());
        const std::int64_t want = cfg.task == Task::R1 ? ctx.value_token(p) : ctx.token(p + 1);
        const bool ok = pred == want;
        res.retrieval.tally.add_position(p, ok);
        res.retrieval.positions.push_back(p);
        res.retrieval.predictions.push_back(pred);
        res.retrieval.correct.push_back(ok ? 1 : 0);
        res.selected.add_position(p, held);
      }
    if (progress) progress(cidx + 1, cfg.contexts);
  }
  return res;
}

}  // namespace eval
PHASEKV_NAMESPACE_END
