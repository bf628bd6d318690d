// Differential fuzz target: Geometry, residue() and cpu::VisibilityRule against a brute-force
// enumeration of windows and positions (small shapes), and the documented limits and refusals
// (extents up to 2^40, lengths up to 2^62; UBSan flags any int64 overflow on the way).
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_input.hpp"
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/phase/residue.hpp"

namespace {

using i64 = std::int64_t;
using phasekv::Geometry;
using pkv_fuzz::FuzzInput;

// Brute force over window indices: J(n) = number of j with O + j*S + W <= n.
i64 brute_complete(i64 W, i64 S, i64 O, i64 n) {
  i64 j = 0;
  while (O + j * S + W <= n) ++j;
  return j;
}

void small_case(FuzzInput& in) {
  const i64 W = in.range(1, 20), S = in.range(1, 20), O = in.range(0, 20);
  const i64 L = in.range(0, 40), n = in.range(0, 160);
  const Geometry g(W, S, O);
  PKV_FUZZ_CHECK(g.window() == W && g.stride() == S && g.origin() == O, "fields");
  PKV_FUZZ_CHECK(g.has_gaps() == (W < S) && g.overlaps() == (W > S), "W %lld S %lld", (long long)W,
                 (long long)S);
  const i64 J = brute_complete(W, S, O, n);
  PKV_FUZZ_CHECK(g.complete_windows(n) == J, "J(%lld) = %lld, brute force %lld (W%lld S%lld O%lld)",
                 (long long)n, (long long)g.complete_windows(n), (long long)J, (long long)W,
                 (long long)S, (long long)O);
  // The first incomplete window starts the raw tail.
  const i64 tail = O + J * S < n ? O + J * S : n;
  PKV_FUZZ_CHECK(g.raw_tail_begin(n) == tail, "raw_tail_begin(%lld) = %lld, brute force %lld",
                 (long long)n, (long long)g.raw_tail_begin(n), (long long)tail);
  for (i64 j = 0; j < J + 3; ++j) {
    // completes_at(j) is the smallest length with J > j.
    i64 m = 0;
    while (brute_complete(W, S, O, m) <= j) ++m;
    PKV_FUZZ_CHECK(g.completes_at(j) == m, "completes_at(%lld) = %lld, brute force %lld",
                   (long long)j, (long long)g.completes_at(j), (long long)m);
  }
  // Per position: phase, cell, covering windows, offsets.
  for (i64 p = 0; p < n + 4; ++p) {
    i64 count = 0, first = -1, last = -1;
    for (i64 j = 0; O + j * S <= p; ++j)
      if (p < O + j * S + W) {
        ++count;
        if (first < 0) first = j;
        last = j;
        PKV_FUZZ_CHECK(g.covers(j, p) && g.offset(p, j) >= 0 && g.offset(p, j) < W,
                       "window %lld covers %lld", (long long)j, (long long)p);
      } else {
        PKV_FUZZ_CHECK(!g.covers(j, p), "window %lld does not cover %lld", (long long)j,
                       (long long)p);
      }
    PKV_FUZZ_CHECK(g.cover_count(p) == count, "cover_count(%lld) = %lld, brute force %lld",
                   (long long)p, (long long)g.cover_count(p), (long long)count);
    if (count > 0) {
      PKV_FUZZ_CHECK(g.first_covering_window(p) == first && g.last_covering_window(p) == last,
                     "covering windows of %lld: [%lld, %lld], brute force [%lld, %lld]",
                     (long long)p, (long long)g.first_covering_window(p),
                     (long long)g.last_covering_window(p), (long long)first, (long long)last);
    }
    i64 cell = -1, phase = -1;
    if (p >= O) {
      cell = 0;
      while (O + (cell + 1) * S <= p) ++cell;
      phase = p - O - cell * S;
    }
    PKV_FUZZ_CHECK(g.in_prefix(p) == (p < O) && g.cell(p) == cell && g.phase(p) == phase,
                   "p %lld: cell %lld phase %lld, brute force %lld %lld", (long long)p,
                   (long long)g.cell(p), (long long)g.phase(p), (long long)cell, (long long)phase);
  }
  // Visibility: prefix raw, entries j < J, raw positions that are in the tail or the band.
  const phasekv::Visibility v = g.visible(n, L);
  const i64 prefix = n < O ? n : O;
  PKV_FUZZ_CHECK(v.prefix_end == prefix && v.entries == J && v.raw_end == n,
                 "visible(%lld, %lld): prefix %lld entries %lld raw_end %lld", (long long)n,
                 (long long)L, (long long)v.prefix_end, (long long)v.entries, (long long)v.raw_end);
  for (i64 p = prefix; p < n; ++p) {
    const bool want = p >= tail || p >= n - L;
    const bool got = p >= v.raw_begin && p < v.raw_end;
    PKV_FUZZ_CHECK(want == got, "raw position %lld: visible %d, brute force %d (n %lld L %lld)",
                   (long long)p, got, want, (long long)n, (long long)L);
    // Nothing is lost: a position some window holds is in a complete window or raw-visible.
    bool in_complete = false;
    for (i64 j = 0; j < J; ++j) in_complete = in_complete || g.covers(j, p);
    PKV_FUZZ_CHECK(g.cover_count(p) == 0 || in_complete || got,
                   "position %lld (n %lld) is in no complete window and not raw", (long long)p,
                   (long long)n);
  }
  PKV_FUZZ_CHECK(v.total() == prefix + J + v.raw_count(), "total");
  // The streaming ring of max(W, L) tokens holds every visible raw token after the prefix.
  PKV_FUZZ_CHECK(v.raw_count() <= g.ring_capacity(L), "raw_count %lld > ring %lld",
                 (long long)v.raw_count(), (long long)g.ring_capacity(L));

  // VisibilityRule::visible_kv hands the kernels exactly these positions: token t of the raw
  // buffer holds the value t, entry j holds j.
  const i64 nb = n > 0 ? n : 1, jb = J > 0 ? J : 1;
  std::vector<float> raw(static_cast<std::size_t>(nb)), ent(static_cast<std::size_t>(jb));
  for (i64 t = 0; t < nb; ++t) raw[static_cast<std::size_t>(t)] = static_cast<float>(t);
  for (i64 j = 0; j < jb; ++j) ent[static_cast<std::size_t>(j)] = static_cast<float>(j);
  const auto rv = phasekv::make_view<const float>(raw.data(), n, 1, 1);
  const auto ev = phasekv::make_view<const float>(ent.data(), J, 1, 1);
  auto check_kv = [&](const phasekv::VisibleKV<float>& kv, i64 pre, i64 ents, i64 rb) {
    std::vector<float> want;
    for (i64 t = 0; t < pre; ++t) want.push_back(static_cast<float>(t));
    for (i64 j = 0; j < ents; ++j) want.push_back(static_cast<float>(j));
    for (i64 t = rb; t < n; ++t) want.push_back(static_cast<float>(t));
    std::vector<float> got;
    for (int s = 0; s < kv.count; ++s)
      for (i64 t = 0; t < kv.segments[s].size(); ++t) {
        got.push_back(*kv.segments[s].keys.ptr(t, 0));
        PKV_FUZZ_CHECK(*kv.segments[s].values.ptr(t, 0) == got.back(), "values follow keys");
      }
    PKV_FUZZ_CHECK(got == want, "visible_kv hands %zu items, brute force %zu", got.size(),
                   want.size());
  };
  check_kv(phasekv::cpu::VisibilityRule::compressed(g, L).visible_kv<float>(n, rv, rv, ev, ev),
           prefix, J, v.raw_begin);
  check_kv(phasekv::cpu::VisibilityRule::causal().visible_kv<float>(n, rv, rv), 0, 0, 0);
  const i64 sw = in.range(1, 50);
  check_kv(phasekv::cpu::VisibilityRule::sliding_window(sw).visible_kv<float>(n, rv, rv), 0, 0,
           n > sw ? n - sw : 0);

  // residue(p, m, O) for p on both sides of the origin.
  const i64 m = in.range(1, 30);
  for (i64 p = 0; p < n + 4; ++p) {
    i64 r = p - O;
    while (r < 0) r += m;
    while (r >= m) r -= m;
    PKV_FUZZ_CHECK(phasekv::residue(p, m, O) == r, "residue(%lld, %lld, %lld) = %lld, want %lld",
                   (long long)p, (long long)m, (long long)O, (long long)phasekv::residue(p, m, O),
                   (long long)r);
  }
}

// A value biased towards the edges of [lo, hi] (and just outside them).
i64 edgy(FuzzInput& in, i64 lo, i64 hi) {
  switch (in.range(0, 5)) {
    case 0: return lo + in.range(0, 3);
    case 1: return hi - in.range(0, 3);
    case 2: return lo - in.range(0, 2);
    case 3: return hi + in.range(0, 2);
    default: return in.range(lo, hi);
  }
}

struct Named {
  const char* name;
  i64 value;
};

// Calls f(); it must throw phasekv::invalid_argument exactly when one of `bad` is out of
// range, with a message naming one of them as `name = value`.
template <class F>
void expect_refusal(const std::vector<Named>& bad, F&& f) {
  try {
    f();
    PKV_FUZZ_CHECK(bad.empty(), "%s = %lld was accepted", bad[0].name, (long long)bad[0].value);
  } catch (const phasekv::invalid_argument& e) {
    PKV_FUZZ_CHECK(!bad.empty(), "valid arguments were refused: %s", e.what());
    const std::string msg = e.what();
    bool named = false;
    for (const Named& b : bad)
      named = named ||
              msg.find(std::string(b.name) + " = " + std::to_string(b.value)) != std::string::npos;
    PKV_FUZZ_CHECK(named, "message '%s' names no bad argument", e.what());
  }
}

void huge_case(FuzzInput& in) {
  constexpr i64 E = phasekv::kMaxGeometryExtent, N = phasekv::kMaxLength;
  const i64 W = edgy(in, 1, E), S = edgy(in, 1, E), O = edgy(in, 0, E);
  const i64 L = edgy(in, 0, E), n = edgy(in, 0, N);
  std::vector<Named> bad_g, bad_l, bad_n;
  if (W < 1 || W > E) bad_g.push_back({"window", W});
  if (S < 1 || S > E) bad_g.push_back({"stride", S});
  if (O < 0 || O > E) bad_g.push_back({"origin", O});
  if (L < 0 || L > E) bad_l.push_back({"local", L});
  if (n < 0 || n > N) bad_n.push_back({"n", n});
  expect_refusal(bad_g, [&] { (void)Geometry(W, S, O); });
  expect_refusal(bad_l, [&] { Geometry::check_local("fuzz", "local", L); });
  expect_refusal(bad_n, [&] { Geometry::check_length("fuzz", "n", n); });
  const bool valid = bad_g.empty();
  if (!valid || L < 0 || L > E || n < 0 || n > N) return;
  // In range: every query is defined and consistent (no int64 overflow: UBSan).
  const Geometry g(W, S, O);
  const i64 J = g.complete_windows(n);
  PKV_FUZZ_CHECK(J >= 0 && J <= n, "J(%lld) = %lld", (long long)n, (long long)J);
  if (J > 0) PKV_FUZZ_CHECK(g.completes_at(J - 1) <= n, "window J-1 is complete");
  PKV_FUZZ_CHECK(g.completes_at(J) > n, "window J = %lld completes after n = %lld", (long long)J,
                 (long long)n);
  const phasekv::Visibility v = g.visible(n, L);
  PKV_FUZZ_CHECK(0 <= v.prefix_end && v.prefix_end <= v.raw_begin && v.raw_begin <= v.raw_end &&
                     v.raw_end == n,
                 "visible(%lld, %lld) out of order", (long long)n, (long long)L);
  PKV_FUZZ_CHECK(v.raw_count() <= g.ring_capacity(L), "ring");
  if (n > 0) {
    const i64 p = n - 1;
    PKV_FUZZ_CHECK(p < O ? g.phase(p) == -1 : (g.phase(p) >= 0 && g.phase(p) < S), "phase");
    const i64 c = g.cover_count(p);
    PKV_FUZZ_CHECK(c >= 0 && c <= W / S + 1, "cover_count %lld", (long long)c);
    PKV_FUZZ_CHECK(phasekv::residue(p, S, O) == (p < O ? phasekv::residue(p, S, O) : g.phase(p)),
                   "residue and phase agree");
  }
  const auto vc = phasekv::cpu::VisibilityRule::compressed(g, L).at(n);
  PKV_FUZZ_CHECK(vc.entries == J && vc.raw_begin == v.raw_begin, "rule agrees with geometry");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzInput in(data, size);
  if (in.range(0, 3) == 0)
    huge_case(in);
  else
    small_case(in);
  return 0;
}
