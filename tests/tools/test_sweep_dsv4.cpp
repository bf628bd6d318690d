// phasekv-sweep --policy dsv4-csa / dsv4-hca: the report of a DeepSeek-V4 layer, and the
// refusals of the flags that do not fit it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
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

// Runs a command with stdout and stderr in files; 0 when it exited with status 0.
int run(const std::string& cmd, const std::string& tag) {
  const std::string full = cmd + " > " + tmp(tag + ".out") + " 2> " + tmp(tag + ".err");
  const int rc = std::system(full.c_str());
  return rc == 0 ? 0 : 1;
}

const std::string kSweep = PHASEKV_SWEEP_EXE;

TEST(ToolSweepDsv4, CsaGateAtOffset3ServesResidues3And7) {
  const std::string cmd = kSweep +
                          " --policy dsv4-csa --task R1 --offsets 3 --indexer exact --top-k 1"
                          " --dim 64 --trials 40 --seed 5 --json " +
                          tmp("dsv4.json");
  ASSERT_EQ(run(cmd, "dsv4"), 0) << slurp(tmp("dsv4.err"));
  const nlohmann::json j = nlohmann::json::parse(slurp(tmp("dsv4.json")));
  ASSERT_EQ(j.at("modulus"), 8);  // CSA's default modulus
  for (const auto& g : j.at("groups")) {
    EXPECT_EQ(g.at("n"), 40);
    const int r = g.at("residue").get<int>();
    if (r == 3 || r == 7)
      EXPECT_GT(g.at("ci_low").get<double>(), 0.85) << r;  // 40/40 gives [91.2, 100]
    else
      EXPECT_LT(g.at("ci_high").get<double>(), 0.15) << r;
  }
  EXPECT_EQ(j.at("period"), 4);
  const std::string out = slurp(tmp("dsv4.out"));
  EXPECT_NE(out.find("policy dsv4-csa, S=4 W=8, window 128"), std::string::npos) << out;
  EXPECT_NE(out.find("attended entries hold the target"), std::string::npos) << out;
  // Same seed, same report.
  ASSERT_EQ(run(cmd, "dsv4b"), 0);
  EXPECT_EQ(nlohmann::json::parse(slurp(tmp("dsv4.json"))), j);
}

TEST(ToolSweepDsv4, HcaModulusIsTheRatio) {
  const std::string cmd = kSweep +
                          " --policy dsv4-hca --task R1 -S 16 --offsets 5 --dim 64 --trials 40"
                          " --json " +
                          tmp("hca.json");
  ASSERT_EQ(run(cmd, "hca"), 0) << slurp(tmp("hca.err"));
  const nlohmann::json j = nlohmann::json::parse(slurp(tmp("hca.json")));
  ASSERT_EQ(j.at("modulus"), 16);
  EXPECT_EQ(j.at("best_residue"), 5);
  EXPECT_GT(j.at("groups")[5].at("ci_low").get<double>(), 0.85);
  EXPECT_EQ(j.at("period"), 16);
}

TEST(ToolSweepDsv4, BadOptionsAreErrors) {
  const std::string exe = kSweep + " --trials 8 --json " + tmp("dsv4bad.json");
  const std::map<std::string, std::string> bad = {
      {" --policy dsv4-hca --top-k 2", "--top-k is only used by --policy dsv4-csa"},
      {" --policy dsv4-csa -W 8", "--window is not used by --policy dsv4-csa"},
      {" --policy dsv4-csa --heads 2", "--heads is not used by --policy dsv4-csa"},
      {" --policy dsv4-csa --task R2 --offsets 7", "must lie in [0, 8)"},
      {" --policy uniform --raw-window 64", "only used by --policy dsv4-csa or dsv4-hca"},
      {" --policy dsv4-csa --indexer all --top-k 2", "not used by --indexer all"},
      {" --policy dsv4-csa --indexer exact --index-offset 1", "only used by --indexer lightning"},
      {" --policy dsv4-csa --sharpness 3", "--sharpness needs --offsets"},
      {" --policy dsv4-csa --index-offset 8", "--index-offset 8 must be < 2S = 8"},
      {" --policy dsv4-csa --min-depth 600", "no room for targets"},
      {" --policy dsv4-csa --max-depth 100", "--max-depth 100 is below the minimum depth 144"},
      {" --policy dsv4-csa --indexer nonsense", "--indexer"},
  };
  for (const auto& kv : bad) {
    std::filesystem::remove(tmp("dsv4bad.json"));
    EXPECT_NE(run(exe + kv.first, "dsv4bad"), 0) << kv.first;
    EXPECT_NE(slurp(tmp("dsv4bad.err")).find(kv.second), std::string::npos)
        << kv.first << " -> " << slurp(tmp("dsv4bad.err"));
    EXPECT_TRUE(slurp(tmp("dsv4bad.out")).empty()) << kv.first;
    EXPECT_FALSE(std::filesystem::exists(tmp("dsv4bad.json"))) << kv.first;
  }
}

}  // namespace
