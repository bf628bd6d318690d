// Runs the evaluation tools on small inputs and checks their outputs.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "phasekv/eval/plan.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string tmp(const std::string& name) { return std::string(PHASEKV_TEST_TMP) + "/" + name; }

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

// Runs a command; returns its exit status and puts stdout/stderr in files.
int run(const std::string& cmd, const std::string& tag) {
  const std::string full = cmd + " > " + tmp(tag + ".out") + " 2> " + tmp(tag + ".err");
  const int rc = std::system(full.c_str());
  return rc == 0 ? 0 : (rc == -1 ? -1 : 1);
}

TEST(ToolReport, PositionsAndResidues) {
  // Residue 0: 3/4 correct, 1: 1/4, 2: 2/2 (one given by residue, one by position).
  write(tmp("res.jsonl"),
        "{\"position\": 0, \"correct\": true}\n"
        "{\"position\": 3, \"correct\": true}\n"
        "{\"position\": 6, \"correct\": true}\n"
        "{\"position\": 9, \"correct\": false}\n"
        "\n"
        "{\"position\": 1, \"correct\": false}\n"
        "{\"residue\": 1, \"correct\": false}\n"
        "{\"residue\": 1, \"correct\": true}\n"
        "{\"position\": 7, \"residue\": 1, \"correct\": false}\n"
        "{\"residue\": 2, \"correct\": true}\n"
        "{\"position\": 5, \"correct\": true}\n");
  const std::string cmd = std::string(PHASEKV_REPORT_EXE) + " --modulus 3 --input " +
                          tmp("res.jsonl") + " --json " + tmp("res.json") + " --csv " +
                          tmp("res.csv") + " --plot " + tmp("res.svg");
  ASSERT_EQ(run(cmd, "report"), 0) << slurp(tmp("report.err"));
  const std::string out = slurp(tmp("report.out"));
  EXPECT_NE(out.find("| 0 | 4 | 3 | 75.0 |"), std::string::npos) << out;
  EXPECT_NE(out.find("| 1 | 4 | 1 | 25.0 |"), std::string::npos) << out;
  EXPECT_NE(out.find("| 2 | 2 | 2 | 100.0 |"), std::string::npos) << out;
  const nlohmann::json j = nlohmann::json::parse(slurp(tmp("res.json")));
  EXPECT_EQ(j.at("modulus"), 3);
  ASSERT_EQ(j.at("groups").size(), 3u);
  EXPECT_EQ(j.at("groups")[1].at("n"), 4);
  EXPECT_DOUBLE_EQ(j.at("groups")[1].at("accuracy").get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(j.at("mean").get<double>(), (0.75 + 0.25 + 1.0) / 3);
  EXPECT_EQ(j.at("worst_residue"), 1);
  EXPECT_EQ(j.at("best_residue"), 2);
  EXPECT_DOUBLE_EQ(j.at("gap_pp").get<double>(), 75.0);
  for (const char* k : {"ci_low", "ci_high", "residue", "correct"})
    EXPECT_TRUE(j.at("groups")[0].contains(k)) << k;
  for (const char* k : {"worst", "best", "homogeneity_p", "period"}) EXPECT_TRUE(j.contains(k));
  const std::string csv = slurp(tmp("res.csv"));
  EXPECT_NE(csv.find("\n2,2,2,1,"), std::string::npos) << csv;
  EXPECT_EQ(slurp(tmp("res.svg")).rfind("<svg", 0), 0u);
}

TEST(ToolReport, BadLinesAreErrorsWithLineNumbers) {
  const std::map<std::string, std::string> bad = {
      {"{\"position\": 2, \"correct\": tru}", "invalid JSON"},
      {"{\"position\": 2}", "missing \"correct\""},
      {"{\"position\": 2, \"correct\": 1}", "must be true or false"},
      {"{\"correct\": true}", "needs \"position\" or \"residue\""},
      {"{\"residue\": 5, \"correct\": true}", "outside [0, 3)"},
      {"{\"residue\": 1.5, \"correct\": true}", "must be an integer"},
      {"{\"position\": 4, \"residue\": 2, \"correct\": true}", "disagrees"},
      {"[1, 2]", "expected a JSON object"},
  };
  for (const auto& kv : bad) {
    write(tmp("bad.jsonl"), "{\"position\": 0, \"correct\": true}\n\n" + kv.first + "\n" +
                                "{\"position\": 1, \"correct\": true}\n");
    const int rc = run(std::string(PHASEKV_REPORT_EXE) + " -m 3 -i " + tmp("bad.jsonl"), "bad");
    EXPECT_NE(rc, 0) << kv.first;
    const std::string err = slurp(tmp("bad.err"));
    EXPECT_NE(err.find("bad.jsonl:3:"), std::string::npos) << kv.first << " -> " << err;
    EXPECT_NE(err.find(kv.second), std::string::npos) << kv.first << " -> " << err;
    EXPECT_EQ(slurp(tmp("bad.out")), "") << "nothing printed on error";
  }
  write(tmp("bad.jsonl"),
        "{\"position\": 5, \"correct\": true}\n{\"position\": 1, \"correct\": true}\n");
  EXPECT_NE(run(std::string(PHASEKV_REPORT_EXE) + " -m 3 --origin 2 -i " + tmp("bad.jsonl"), "bad"),
            0);
  EXPECT_NE(slurp(tmp("bad.err")).find("bad.jsonl:2: \"position\" = 1 is below --origin 2"),
            std::string::npos)
      << slurp(tmp("bad.err"));
  EXPECT_NE(run(std::string(PHASEKV_REPORT_EXE) + " -m 3 -i " + tmp("missing.jsonl"), "bad"), 0);
  EXPECT_NE(run(std::string(PHASEKV_REPORT_EXE) + " -m 0 -i " + tmp("res.jsonl"), "bad"), 0);
}

TEST(ToolPlan, LinesArePositionMatched) {
  for (const char* pad : {"prefix", "in-sequence"}) {
    const std::string cmd = std::string(PHASEKV_PLAN_EXE) +
                            " --modulus 8 --query-position 2000 --count 48 --record-length 3 "
                            "--min-target 200 --max-target 1800 --seed 5 --padding " +
                            pad + " --output " + tmp("plan.jsonl");
    ASSERT_EQ(run(cmd, "plan"), 0) << slurp(tmp("plan.err"));
    std::ifstream f(tmp("plan.jsonl"));
    std::string line;
    std::map<long, double> sum, sum2;
    std::map<long, long> n;
    long lines = 0;
    while (std::getline(f, line)) {
      ++lines;
      const nlohmann::json j = nlohmann::json::parse(line);
      const long t = j.at("target").get<long>(), r = j.at("residue").get<long>();
      EXPECT_EQ(t % 8, r);
      EXPECT_GE(t, 200);
      EXPECT_LE(t, 1800);
      EXPECT_EQ(j.at("query_position"), 2000);
      EXPECT_EQ(j.at("padding"), pad);
      long pos = 0, targets = 0;
      for (const auto& s : j.at("segments")) {
        EXPECT_EQ(s.at("start").get<long>(), pos);
        if (s.at("kind") == "target") {
          ++targets;
          EXPECT_EQ(s.at("start").get<long>(), t);
        }
        pos += s.at("length").get<long>();
      }
      EXPECT_EQ(targets, 1);
      EXPECT_EQ(pos, 2001);  // up to and including the query token
      sum[r] += static_cast<double>(t);
      sum2[r] += static_cast<double>(t) * static_cast<double>(t);
      ++n[r];
    }
    EXPECT_EQ(lines, 8 * 48);
    ASSERT_EQ(n.size(), 8u);
    double vmin = 1e300, vmax = 0;
    for (const auto& kv : n) {
      EXPECT_EQ(kv.second, 48);
      EXPECT_DOUBLE_EQ(sum[kv.first], sum[0]);  // equal means
      const double m = sum[kv.first] / 48, v = sum2[kv.first] / 48 - m * m;
      vmin = std::min(vmin, v);
      vmax = std::max(vmax, v);
    }
    EXPECT_LE(vmax / vmin - 1.0, 0.01);
  }
  EXPECT_NE(run(std::string(PHASEKV_PLAN_EXE) + " -m 8 -q 100 -n 12", "plan"), 0);
  EXPECT_NE(slurp(tmp("plan.err")).find("count = 12"), std::string::npos);
}

TEST(ToolSweep, OneHotCompressorCoversOnePhase) {
  const std::string cmd = std::string(PHASEKV_SWEEP_EXE) +
                          " --task R2 --policy select -W 8 -S 8 --offsets 2 --context 256"
                          " --trials 40 --seed 3 --json " +
                          tmp("sweep.json") + " --csv " + tmp("sweep.csv") + " --plot " +
                          tmp("sweep.svg");
  ASSERT_EQ(run(cmd, "sweep"), 0) << slurp(tmp("sweep.err"));
  const nlohmann::json j = nlohmann::json::parse(slurp(tmp("sweep.json")));
  ASSERT_EQ(j.at("modulus"), 8);
  for (const auto& g : j.at("groups")) {
    EXPECT_EQ(g.at("n"), 40);
    if (g.at("residue") == 2)
      EXPECT_GT(g.at("ci_low").get<double>(), 0.85);
    else
      EXPECT_LT(g.at("ci_high").get<double>(), 0.15);
  }
  EXPECT_EQ(j.at("best_residue"), 2);
  EXPECT_EQ(j.at("period"), 8);
  EXPECT_NE(slurp(tmp("sweep.out")).find("| 2 | 40 |"), std::string::npos);
  EXPECT_EQ(slurp(tmp("sweep.svg")).rfind("<svg", 0), 0u);
  // Same seed, same result (CSV identical), reference attention included.
  ASSERT_EQ(run(cmd + " --attention reference", "sweep2"), 0) << slurp(tmp("sweep2.err"));
  EXPECT_EQ(nlohmann::json::parse(slurp(tmp("sweep.json"))), j);
}

TEST(ToolSweep, BadOptionsAreErrors) {
  const std::string exe = std::string(PHASEKV_SWEEP_EXE) + " --context 256 --trials 8";
  const std::map<std::string, std::string> bad = {
      {" --policy select --offsets 7", "boundary phase cannot be covered"},
      {" --policy uniform --offsets 1", "--offsets is only used"},
      {" --policy uniform --cycle 2", "only used by --policy gated"},
      {" --targets-per-context 3", "must be a multiple"},
      {" --policy full -W 4", "no geometry"},
      {" --policy gated --heads 2 --offsets 1", "--offsets has 1 entries"},
      {" --vocab 100", "--vocab = 100 must be >= --context = 256"},
      {" --policy nonsense", "policy"},
  };
  for (const auto& kv : bad) {
    EXPECT_NE(run(exe + kv.first, "sweepbad"), 0) << kv.first;
    EXPECT_NE(slurp(tmp("sweepbad.err")).find(kv.second), std::string::npos)
        << kv.first << " -> " << slurp(tmp("sweepbad.err"));
  }
}

// Knockout and the phase specialization map (issue 28 pt 1): three one-hot heads with key
// offsets 1, 4, 6 (head h serves phase offsets[h]); 80 trials per phase.
TEST(ToolSweep, KnockoutDropsTheHeadsPhase) {
  const std::string base = std::string(PHASEKV_SWEEP_EXE) +
                           " --task R2 --policy gated --heads 3 --offsets 1,4,6 --gamma 16"
                           " --context 256 --trials 80 --seed 5 --json " +
                           tmp("ko.json");
  ASSERT_EQ(run(base, "ko0"), 0) << slurp(tmp("ko0.err"));
  const nlohmann::json intact = nlohmann::json::parse(slurp(tmp("ko.json")));
  ASSERT_EQ(run(base + " --knockout 1", "ko1"), 0) << slurp(tmp("ko1.err"));
  EXPECT_NE(slurp(tmp("ko1.out")).find("heads knocked out: 1"), std::string::npos);
  const nlohmann::json knocked = nlohmann::json::parse(slurp(tmp("ko.json")));
  for (int r = 0; r < 8; ++r) {
    const auto& a = intact.at("groups")[static_cast<std::size_t>(r)];
    const auto& k = knocked.at("groups")[static_cast<std::size_t>(r)];
    if (r == 4) {
      EXPECT_LT(k.at("ci_high").get<double>(), a.at("ci_low").get<double>());
    } else {
      EXPECT_GE(k.at("accuracy").get<double>(), a.at("ci_low").get<double>()) << r;
      EXPECT_LE(k.at("accuracy").get<double>(), a.at("ci_high").get<double>()) << r;
    }
  }
}

TEST(ToolSweep, SpecializationMapOfOneHotAndTrainedHeads) {
  const std::string cmd = std::string(PHASEKV_SWEEP_EXE) +
                          " --task R2 --policy gated --heads 3 --offsets 1,4,4 --gamma 16"
                          " --context 256 --trials 80 --seed 6 --specialization-map --json " +
                          tmp("map.json") + " --csv " + tmp("map.csv") + " --plot " +
                          tmp("map.svg") + " --markdown " + tmp("map.md");
  ASSERT_EQ(run(cmd, "map"), 0) << slurp(tmp("map.err"));
  const nlohmann::json j = nlohmann::json::parse(slurp(tmp("map.json")));
  EXPECT_EQ(j.at("heads"), 3);
  EXPECT_EQ(j.at("modulus"), 8);
  EXPECT_EQ(j.at("knockouts")[0].at("serves"), nlohmann::json::array({1}));
  EXPECT_EQ(j.at("knockouts")[1].at("serves"), nlohmann::json::array({4}));
  EXPECT_EQ(j.at("knockouts")[2].at("serves"), nlohmann::json::array({4}));
  ASSERT_EQ(j.at("collisions").size(), 1u);
  EXPECT_EQ(j.at("collisions")[0].at("residue"), 4);
  EXPECT_GT(j.at("knockouts")[0].at("drop")[1].get<double>(), 0.9);
  const std::string out = slurp(tmp("map.out"));
  EXPECT_NE(out.find("| drop, head 0 out |"), std::string::npos) << out;
  EXPECT_NE(out.find("collisions: r=4 by heads 1, 2"), std::string::npos) << out;
  const std::string csv = slurp(tmp("map.csv"));
  EXPECT_EQ(csv.rfind("head,residue,n,", 0), 0u);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 3 * 8);
  const std::string svg = slurp(tmp("map.svg"));
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("class=\"cell\""), std::string::npos);
  EXPECT_NE(slurp(tmp("map.md")).find("| intact accuracy % |"), std::string::npos);
  // Trained gradient-flow heads (train seed 11: two heads collide on offset 2).
  const std::string trained = std::string(PHASEKV_SWEEP_EXE) +
                              " --task R2 --policy trained --heads 4 --gamma 4 --dim 64 --vocab 64"
                              " --context 64 --trials 120 --targets-per-context 3"
                              " --specialization-map --json " +
                              tmp("tmap.json");
  ASSERT_EQ(run(trained, "tmap"), 0) << slurp(tmp("tmap.err"));
  const nlohmann::json t = nlohmann::json::parse(slurp(tmp("tmap.json")));
  ASSERT_EQ(t.at("collisions").size(), 1u) << t.dump();
  EXPECT_EQ(t.at("collisions")[0].at("residue"), 2);
  EXPECT_NE(slurp(tmp("tmap.out")).find("h0 2->3"), std::string::npos);
}

TEST(ToolSweep, BadKnockoutsAreRefused) {
  const std::string exe =
      std::string(PHASEKV_SWEEP_EXE) + " --policy gated --heads 3 --context 256 --trials 8";
  const std::map<std::string, std::string> bad = {
      {" --knockout 3", "--knockout 3 is not a head: heads are 0 .. 2"},
      {" --knockout 0,2,0", "--knockout lists head 0 twice"},
      {" --knockout x", "--knockout: x is not an integer in [0, 63]"},
      {" --knockout -1", "--knockout: -1 is not an integer in [0, 63]"},
      {" --knockout 1 --specialization-map", "drop --knockout"},
      {" --specialization-map --bars", "--bars is not used"},
      {" --train-steps 5", "only used by --policy trained"},
  };
  for (const auto& kv : bad) {
    EXPECT_NE(run(exe + kv.first, "kobad"), 0) << kv.first;
    EXPECT_NE(slurp(tmp("kobad.err")).find(kv.second), std::string::npos)
        << kv.first << " -> " << slurp(tmp("kobad.err"));
  }
  EXPECT_NE(
      run(std::string(PHASEKV_SWEEP_EXE) + " --policy full --knockout 0 --trials 8", "kofull"), 0);
  EXPECT_NE(slurp(tmp("kofull.err")).find("--knockout needs a compressor"), std::string::npos)
      << slurp(tmp("kofull.err"));
  EXPECT_NE(run(std::string(PHASEKV_SWEEP_EXE) + " --policy trained -W 8 -S 4 --trials 8", "kotr"),
            0);
  EXPECT_NE(slurp(tmp("kotr.err")).find("--window = --stride"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// What the tools refuse (issue 29, point 5): every case checks the exit status (2: the command
// line was refused before anything ran, 1: the run failed), a substring of the message that
// names the flag, the value as typed and the range --help shows, that nothing went to stdout,
// and, where a range is quoted, that --help shows the same range.

#if defined(__SANITIZE_ADDRESS__)
#define PHASEKV_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PHASEKV_TEST_ASAN 1
#endif
#endif

// A scratch directory of the running test (CTest runs the test cases in parallel).
std::string here(const std::string& name) {
  const std::string dir = tmp(std::string("refusals.") +
                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

// Runs a command through the shell; returns its exit status (128 + signal when killed).
int status(const std::string& cmd, const std::string& tag) {
  const std::string full = cmd + " > " + here(tag + ".out") + " 2> " + here(tag + ".err");
  const int rc = std::system(full.c_str());
  if (rc == -1) return -1;
  if (WIFEXITED(rc)) return WEXITSTATUS(rc);
  if (WIFSIGNALED(rc)) return 128 + WTERMSIG(rc);
  return -1;
}

// A small valid results file in the test's directory.
std::string results() {
  const std::string path = here("res.jsonl");
  write(path, "{\"position\": 0, \"correct\": true}\n{\"position\": 4, \"correct\": false}\n");
  return path;
}

struct Refusal {
  std::string exe;                   // tool
  std::string args;                  // its flags
  int exit;                          // expected exit status
  std::vector<std::string> message;  // substrings of stderr
  std::string help;                  // substring of --help (the range quoted), or empty
};

void expect_refusal(const Refusal& c) {
  const std::string cmd = c.exe + " " + c.args;
  EXPECT_EQ(status(cmd, "refusal"), c.exit) << cmd << "\n" << slurp(here("refusal.err"));
  const std::string err = slurp(here("refusal.err"));
  for (const std::string& m : c.message)
    EXPECT_NE(err.find(m), std::string::npos) << cmd << "\n  wants: " << m << "\n  got:   " << err;
  EXPECT_EQ(err.find("bad_alloc"), std::string::npos) << cmd << ": " << err;
  EXPECT_LT(err.size(), 1000u) << cmd << ": " << err;
  const std::string out = slurp(here("refusal.out"));
  EXPECT_TRUE(out.empty()) << cmd << ": nothing runs, got " << out.substr(0, 200);
  if (!c.help.empty()) {
    ASSERT_EQ(status(c.exe + " --help", "help"), 0);
    EXPECT_NE(slurp(here("help.out")).find(c.help), std::string::npos)
        << c.exe << " --help does not show " << c.help;
  }
}

const std::string kSweep = PHASEKV_SWEEP_EXE, kPlan = PHASEKV_PLAN_EXE,
                  kReport = PHASEKV_REPORT_EXE, kMap = PHASEKV_PHASE_MAP_EXE;

TEST(ToolRefusals, OutOfMemoryIsRefusedBeforeRunning) {
  // The run (inside the flag ranges, about 28 GiB) against a stated limit.
  expect_refusal({kSweep,
                  "--context 16777216 --vocab 16777216 --max-memory 16G",
                  2,
                  {"phasekv-sweep: this run needs about 28.3 GiB of memory",
                   "raw keys and values of --context 16777216", "embeddings of --vocab 16777216",
                   "more than the 16.0 GiB available (--max-memory)"},
                  "--max-memory SIZE in [1M, 1E]"});
  expect_refusal({kPlan,
                  "-m 8 -q 100000000 -n 67108864 --max-memory 1G -o " + here("oom.jsonl"),
                  2,
                  {"phasekv-plan: this run needs about", "--modulus 8 x --count 67108864"},
                  ""});
  EXPECT_FALSE(std::filesystem::exists(here("oom.jsonl")));
  expect_refusal({kReport,
                  "-m 1048576 --max-memory 100M -i " + results(),
                  2,
                  {"phasekv-report: this run needs about", "--modulus 1048576 residues"},
                  ""});
  expect_refusal({kSweep,
                  "--context 256 --max-memory 5X",
                  2,
                  {"--max-memory: 5X is not a size in [1M, 1E]"},
                  ""});
}

TEST(ToolRefusals, MemoryLimitsOfTheProcessAreRead) {
#if defined(PHASEKV_TEST_ASAN)
  GTEST_SKIP() << "AddressSanitizer reserves more address space than ulimit -v allows";
#else
  // No --max-memory: the address-space limit is the memory available.
  expect_refusal({"ulimit -v 1000000; " + kSweep,
                  "--context 16777216 --vocab 16777216",
                  2,
                  {"this run needs about 28.3 GiB", "(the address-space limit (ulimit -v))"},
                  ""});
  // Overridden: the allocation fails and the message says what ran out, not std::bad_alloc.
  EXPECT_EQ(status("ulimit -v 1000000; " + kSweep +
                       " --context 4194304 --vocab 4194304 --max-memory 1T -q",
                   "oom"),
            1);
  const std::string err = slurp(here("oom.err"));
  EXPECT_NE(err.find("phasekv-sweep: out of memory (the run was estimated to need"),
            std::string::npos)
      << err;
  EXPECT_EQ(slurp(here("oom.out")), "");
#endif
}

TEST(ToolRefusals, OverflowAndPartialFiles) {
  // -q near 5e18 used to overflow plan_targets and leave a truncated -o file.
  write(here("kept.jsonl"), "keep\n");
  expect_refusal({kPlan,
                  "-m 8 -q 5000000000000000000 -n 32 -o " + here("kept.jsonl"),
                  2,
                  {"--query-position: 5000000000000000000 is not an integer in [1, "
                   "1099511627776]"},
                  "--query-position INT in [1, 1099511627776]"});
  EXPECT_EQ(slurp(here("kept.jsonl")), "keep\n");
  // The largest accepted values plan without overflow.
  ASSERT_EQ(status(kPlan + " -m 8 -q 1099511627776 -n 32 -o " + here("big.jsonl"), "big"), 0)
      << slurp(here("big.err"));
  std::ifstream f(here("big.jsonl"));
  std::string line;
  long lines = 0;
  while (std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_GE(j.at("target").get<long long>(), 0);
    EXPECT_LT(j.at("target").get<long long>(), 1099511627776LL);
    ++lines;
  }
  EXPECT_EQ(lines, 8 * 32);
  // A refused or failed run leaves no file and keeps an existing one; no temporary files.
  write(here("bad.jsonl"), "{\"position\": 1, \"correct\": true}\n{\"position\": 2}\n");
  write(here("kept.json"), "keep\n");
  EXPECT_EQ(status(kReport + " -m 3 -i " + here("bad.jsonl") + " --json " + here("kept.json") +
                       " --csv " + here("new.csv"),
                   "partial"),
            1);
  EXPECT_EQ(slurp(here("kept.json")), "keep\n");
  EXPECT_FALSE(std::filesystem::exists(here("new.csv")));
  for (const auto& e : std::filesystem::directory_iterator(here("")))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST(ToolRefusals, OutOfRangeIntegersAreNamedAsTyped) {
  write(here("big1.jsonl"), "{\"position\": 9223372036854775808, \"correct\": true}\n");
  expect_refusal({kReport,
                  "-m 8 -i " + here("big1.jsonl"),
                  1,
                  {"big1.jsonl:1: \"position\" = 9223372036854775808 is out of range "
                   "(positions are integers in [--origin, 9223372036854775807]"},
                  ""});
  write(here("big2.jsonl"), "{\"position\": 100000000000000000000, \"correct\": true}\n");
  expect_refusal({kReport,
                  "-m 8 -i " + here("big2.jsonl"),
                  1,
                  {"big2.jsonl:1: \"position\" = 100000000000000000000 is out of range"},
                  ""});
  write(here("big3.jsonl"), "{\"residue\": 18446744073709551615, \"correct\": true}\n");
  expect_refusal({kReport,
                  "-m 8 -i " + here("big3.jsonl"),
                  1,
                  {"\"residue\" = 18446744073709551615 is out of range (residues are integers "
                   "in [0, --modulus) = [0, 8))"},
                  ""});
  write(here("big4.jsonl"), "{\"position\": 2.50, \"correct\": true}\n");
  expect_refusal({kReport,
                  "-m 8 -i " + here("big4.jsonl"),
                  1,
                  {"\"position\" must be an integer, got 2.50"},
                  ""});
  expect_refusal({kReport,
                  "-m 8 -i " + results() + " --origin 99999999999999999999",
                  2,
                  {"phasekv-report: --origin: 99999999999999999999 is not an integer in [0, "
                   "1099511627776]"},
                  "--origin INT in [0, 1099511627776]"});
  expect_refusal({kSweep,
                  "--policy gated --cycle 99999999999999999999",
                  2,
                  {"--cycle: 99999999999999999999 is not an integer in [-1048576, 1048576]"},
                  "--cycle INT in [-1048576, 1048576]"});
  expect_refusal({kSweep,
                  "--seed -1",
                  2,
                  {"--seed: -1 is not an integer in [0, 18446744073709551615]"},
                  "--seed UINT in [0, 18446744073709551615]"});
  expect_refusal({kMap,
                  "-W 99999999999999999999",
                  2,
                  {"phasekv-phase-map: --window: 99999999999999999999 is not an integer in [1, "
                   "1099511627776]"},
                  "--window INT in [1, 1099511627776]"});
  // Decimal as typed: 010 is ten (CLI11 alone reads it as octal eight).
  ASSERT_EQ(status(kMap + " -W 010 -S 010", "map010"), 0);
  EXPECT_NE(slurp(here("map010.out")).find("W=10 S=10"), std::string::npos)
      << slurp(here("map010.out"));
}

TEST(ToolRefusals, MessagesNameFlagValueAndRange) {
  const std::string res = " -i " + results();
  const std::vector<Refusal> cases = {
      {kSweep,
       "-O 99999999999",
       2,
       {"--origin: 99999999999 is not an integer in [0, 16777216]"},
       "--origin INT in [0, 16777216]"},
      {kSweep, "-O 1000", 2, {"no room for targets", "= [1000, 495]", "lower --origin (1000)"}, ""},
      {kSweep,
       "--trials 0",
       2,
       {"--trials: 0 is not an integer in [1, 1048576]"},
       "--trials INT in [1, 1048576]"},
      {kSweep,
       "--alpha 0",
       2,
       {"--alpha: 0 is not a number in [1e-12, 0.5]"},
       "--alpha FLOAT in [1e-12, 0.5]"},
      {kSweep,
       "--gamma nan",
       2,
       {"--gamma: nan is not a number in [1e-6, 1e6]"},
       "--gamma FLOAT in [1e-6, 1e6]"},
      {kSweep,
       "--heads 0x10",
       2,
       {"--heads: 0x10 is not an integer in [1, 64]"},
       "--heads INT in [1, 64]"},
      {kSweep,
       "--offsets 1,-2 --policy gated --heads 2",
       2,
       {"--offsets: -2 is not an integer in [0, 1048575]"},
       ""},
      {kPlan,
       "-m 8 -q 0 -n 8",
       2,
       {"--query-position: 0 is not an integer in [1, 1099511627776]"},
       ""},
      {kPlan,
       "-m 8 -q 1000 -n 8 --min-target -5",
       2,
       {"--min-target: -5 is not an integer in [0, 1099511627776]"},
       "--min-target INT in [0, 1099511627776]"},
      {kPlan,
       "-m 8 -q 1000 -n 0",
       2,
       {"--count: 0 is not an integer in [1, 1073741824]"},
       "--count INT in [1, 1073741824]"},
      {kPlan, "-m 8 -q 1000 -n 12", 2, {"--count = 12 must be a multiple of --modulus = 8"}, ""},
      {kPlan,
       "-m 8 -q 1000 -n 8 -r 0",
       2,
       {"--record-length: 0 is not an integer in [1, 1099511627776]"},
       ""},
      {kPlan, "-m 8 -q 1000 -n 8 -r 1000", 2, {"--record-length = 1000 leaves no room"}, ""},
      {kPlan,
       "-m 8 -q 1000 -n 8 --max-target 5000",
       2,
       {"--max-target = 5000 is invalid", "must be at most 999"},
       ""},
      {kPlan,
       "-m 8 -q 1000 -n 8 --origin 5 --min-target 3",
       2,
       {"--min-target = 3 is below --origin = 5"},
       ""},
      {kPlan,
       "-m 8 -q 1000 -n 8 --min-target 900 --max-target 100",
       2,
       {"the target range [900, 100] (--min-target to --max-target) is too short"},
       ""},
      {kPlan,
       "-m 8 -q 1000 -n 8 --max-variance-spread 0.001",
       2,
       {"target variances differ by 0.52 %", "more than --max-variance-spread = 0.001"},
       ""},
      {kPlan,
       "-m 8 -q 1000 -n 8 --max-variance-spread nan",
       2,
       {"--max-variance-spread: nan is not a number in [0, 1]"},
       ""},
      {kReport,
       "-m 8 --origin -3" + res,
       2,
       {"--origin: -3 is not an integer in [0, 1099511627776]"},
       ""},
      {kReport,
       "-m 0" + res,
       2,
       {"--modulus: 0 is not an integer in [1, 1048576]"},
       "--modulus INT in [1, 1048576]"},
      {kReport, "-m 8 -i " + here(""), 2, {"--input '" + here("") + "' is a directory"}, ""},
      {kReport,
       "-m 8 -i " + here("missing.jsonl"),
       2,
       {"cannot open --input '" + here("missing.jsonl") + "': No such file"},
       ""},
      {kMap, "-q -5", 2, {"--query: -5 is not an integer in [0, 4611686018427387903]"}, ""},
      // ulimit -f: a tool that printed this map would write about 6 TB.
      {"ulimit -f 10000; " + kMap,
       "-W 1048576 -S 1 -p 1048576",
       2,
       {"lists more than 16777216 (position, window) pairs"},
       ""},
  };
  for (const Refusal& c : cases) expect_refusal(c);
  write(here("empty.jsonl"), "\n  \n");
  expect_refusal({kReport,
                  "-m 8 -i " + here("empty.jsonl"),
                  1,
                  {"--input '" + here("empty.jsonl") + "' has no results"},
                  ""});
  write(here("long.jsonl"), "{\"position\": 1, \"correct\": true}\n" +
                                std::string((std::size_t{16} << 20) + 1, ' ') + "\n");
  expect_refusal({kReport,
                  "-m 8 -i " + here("long.jsonl"),
                  1,
                  {"long.jsonl:2: the line is longer than 16 MiB"},
                  ""});
  std::filesystem::remove(here("long.jsonl"));
}

TEST(ToolRefusals, UnwritableOutputsAreRefusedBeforeRunning) {
  const std::string nodir = here("no-such-dir") + "/x.json";
  const std::string dir = here("sub");
  std::filesystem::create_directories(dir);
  const std::vector<Refusal> cases = {
      {kSweep,
       "--context 256 --trials 8 --json " + nodir,
       2,
       {"cannot write --json '" + nodir + "': No such file or directory"},
       ""},
      {kSweep,
       "--context 256 --trials 8 --plot " + dir,
       2,
       {"--plot '" + dir + "' is a directory"},
       ""},
      {kSweep,
       "--context 256 --trials 8 --json " + here("same") + " --csv " + here("same"),
       2,
       {"--csv '" + here("same") + "' is also given to --json"},
       ""},
      {"cd " + here("") + " && " + kSweep,
       "--context 256 --trials 8 --json same --csv ./same",
       2,
       {"--csv './same' is also given to --json"},
       ""},
      {kReport,
       "-m 3 -i " + results() + " --markdown " + nodir,
       2,
       {"cannot write --markdown '" + nodir + "'"},
       ""},
      {kPlan, "-m 8 -q 1000 -n 8 -o " + nodir, 2, {"cannot write --output '" + nodir + "'"}, ""},
      {kPlan, "-m 8 -q 1000 -n 8 -o " + dir, 2, {"--output '" + dir + "' is a directory"}, ""},
      {kSweep, "--context 256 --trials 8 --json ''", 2, {"--json: '' is not a file name"}, ""},
  };
  for (const Refusal& c : cases) expect_refusal(c);
  EXPECT_FALSE(std::filesystem::exists(here("same")));
  // Devices are written directly (never renamed over).
  ASSERT_EQ(status(kReport + " -m 3 -i " + results() + " --json /dev/null", "devnull"), 0)
      << slurp(here("devnull.err"));
}

// The library side of phasekv-plan's overflow: a range of 2^62 positions with 2^23 targets
// (k * (blocks - 1) is about 2^85) plans without wrapping, and layout_prompt refuses a record
// whose end does not fit instead of overflowing (UBSan checks both).
TEST(ToolRefusals, PlanTargetsOverLongRangesDoNotOverflow) {
  const std::int64_t count = std::int64_t{1} << 23;
  const phasekv::eval::TargetPlan plan =
      phasekv::eval::plan_targets(1, count, 0, phasekv::kMaxLength);
  ASSERT_EQ(plan.positions.size(), 1u);
  const std::vector<std::int64_t>& p = plan.positions[0];
  ASSERT_EQ(p.size(), static_cast<std::size_t>(count));
  EXPECT_GE(p.front(), 1);
  EXPECT_LE(p.back(), phasekv::kMaxLength);
  for (std::size_t i = 1; i < p.size(); ++i) ASSERT_LT(p[i - 1], p[i]) << i;
  EXPECT_THROW(phasekv::eval::plan_targets(1, (std::int64_t{1} << 31) + 1, 0, 100),
               phasekv::invalid_argument);
  EXPECT_THROW(phasekv::eval::plan_targets(8, 8, 0, phasekv::kMaxLength + 1),
               phasekv::invalid_argument);
  EXPECT_THROW(phasekv::eval::layout_prompt(phasekv::kMaxLength, phasekv::kMaxLength + 5,
                                            std::numeric_limits<std::int64_t>::max(),
                                            phasekv::eval::Padding::prefix),
               phasekv::invalid_argument);
}

}  // namespace
