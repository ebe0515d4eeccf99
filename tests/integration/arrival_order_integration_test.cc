// Arrival order: a multi-rank scenario of the suite replayed
// three ways against one server, each under a run id of its own, raises the
// same alerts (alertname, started_step, onset_step): every rank at once,
// one rank after another rank 0 first, and one after another from the
// highest rank down to rank 0. tools/scenario_delays.py --orders does the
// same for every multi-rank scenario (docs/detectors.md); tests/unit/
// arrival_order_test.cc tries many more orders on RunPipeline in process.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "harness.h"
#include "settled_alerts.h"

namespace trainwatch::testing {
namespace {

using json = nlohmann::json;
using AlertKey = std::tuple<std::string, uint64_t, uint64_t>;

const std::string kGenerator = std::string(TW_SCENARIO_DIR) + "/generate.py";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The run's settled alerts as (alertname, started_step, onset_step), sorted;
// `error` says why not.
std::vector<AlertKey> SettledAlertKeys(const std::string& address,
                                       const std::string& run, std::string* error) {
  const std::optional<json> alerts = SettledAlerts(address, run, error);
  if (!alerts.has_value()) return {};
  std::vector<AlertKey> keys;
  for (const json& a : *alerts) {
    keys.emplace_back(a.at("alertname").get<std::string>(),
                      a.at("started_step").get<uint64_t>(),
                      a.at("onset_step").get<uint64_t>());
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::string Describe(const std::vector<AlertKey>& keys) {
  std::string out;
  for (const auto& [name, started, onset] : keys) {
    out += (out.empty() ? "" : ", ") + name + "@" + std::to_string(started) + "/" +
           std::to_string(onset);
  }
  return out.empty() ? "none" : out;
}

class ArrivalOrderIntegrationTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ArrivalOrderIntegrationTest, SameAlertsWhateverOrderTheRanksArriveIn) {
  const std::string& name = GetParam();
  TempDir dir;
  CommandResult gen = RunCommand({"python3", kGenerator, "--out", dir.path(), name});
  ASSERT_EQ(gen.exit_code, 0) << "generate.py: " << gen.out << gen.err;
  const json scenario = json::parse(ReadFile(dir.File("expected.json")))["scenarios"][0];
  const std::string run_id = scenario.at("run_id");
  std::vector<std::string> files;  // rank r's file at index r
  for (const json& stage : scenario.at("replay")) {
    for (const json& f : stage) files.push_back(dir.File(f.get<std::string>()));
  }
  ASSERT_EQ(files.size(), scenario.at("world_size").get<size_t>());

  // The defaults: HostSuspect takes the three replays of one scenario (the
  // same hosts named at the same steps) for one run, not three.
  ServerProcess server(dir.File("tw.db"), 0);
  ASSERT_GT(server.grpc_port(), 0);
  const std::string ctl = BinDir() + "/trainwatchctl";
  auto replay = [&](const std::string& run, size_t rank) {
    return RunCommand({ctl, "--server", server.grpc_address(), "replay", files[rank],
                       "--run", run, "--rank", std::to_string(rank)});
  };

  // Every rank at once.
  std::vector<std::string> argv = {
      "/bin/sh", "-c",
      "ctl=\"$1\"; addr=\"$2\"; run=\"$3\"; shift 3; pids=''; rank=0; "
      "for f in \"$@\"; do \"$ctl\" --server \"$addr\" replay \"$f\" --run \"$run\" "
      "--rank $rank & pids=\"$pids $!\"; rank=$((rank + 1)); done; rc=0; "
      "for p in $pids; do wait \"$p\" || rc=1; done; exit $rc",
      "sh", ctl, server.grpc_address(), run_id + "/at-once"};
  argv.insert(argv.end(), files.begin(), files.end());
  CommandResult at_once = RunCommand(argv);
  ASSERT_EQ(at_once.exit_code, 0) << at_once.out << at_once.err;
  for (size_t rank = 0; rank < files.size(); ++rank) {
    CommandResult r = replay(run_id + "/rank0-first", rank);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  for (size_t rank = files.size(); rank-- > 0;) {
    CommandResult r = replay(run_id + "/rank0-last", rank);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }

  std::string error;
  const std::vector<AlertKey> first = SettledAlertKeys(server.grpc_address(),
                                                    run_id + "/rank0-first", &error);
  ASSERT_EQ(error, "");
  for (const json& e : scenario.at("expected")) {
    const std::string expected = e.at("alertname");
    EXPECT_TRUE(std::any_of(first.begin(), first.end(), [&](const AlertKey& k) {
      return std::get<0>(k) == expected;
    })) << expected << " did not fire (rank 0 first): " << Describe(first);
  }
  for (const std::string order : {"at-once", "rank0-last"}) {
    const std::vector<AlertKey> got =
        SettledAlertKeys(server.grpc_address(), run_id + "/" + order, &error);
    ASSERT_EQ(error, "") << order;
    EXPECT_EQ(Describe(got), Describe(first)) << order << " vs rank0-first";
  }
}

INSTANTIATE_TEST_SUITE_P(Scenarios, ArrivalOrderIntegrationTest,
                         ::testing::Values("rank-norm-mismatch", "shard-norm-mismatch",
                                           "rank-straggler"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace trainwatch::testing
