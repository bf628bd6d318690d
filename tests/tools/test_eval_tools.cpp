// Runs the evaluation tools on small inputs and checks their outputs.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

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
  write(tmp("bad.jsonl"), "{\"position\": 5, \"correct\": true}\n{\"position\": 1, \"correct\": true}\n");
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
                          " --trials 40 --seed 3 --json " + tmp("sweep.json") + " --csv " +
                          tmp("sweep.csv") + " --plot " + tmp("sweep.svg");
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
      {" --vocab 100", "vocab = 100"},
      {" --policy nonsense", "policy"},
  };
  for (const auto& kv : bad) {
    EXPECT_NE(run(exe + kv.first, "sweepbad"), 0) << kv.first;
    EXPECT_NE(slurp(tmp("sweepbad.err")).find(kv.second), std::string::npos)
        << kv.first << " -> " << slurp(tmp("sweepbad.err"));
  }
}

}  // namespace
