// trainwatchctl replay through a real server: every field of a step log's
// run_start and step lines is what the server stores (the lines filled by
// reflection, so a field added to the proto is checked too), and a
// mixture-of-experts run's routing (top_k, ep_size) reaches its detectors,
// and a loss's hard batch is listed apart from its spikes.
#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fill_fields.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "eventually.h"
#include "harness.h"
#include "stored_data.h"

namespace trainwatch::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

std::string JsonOf(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string out;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(message, &out, options).ok());
  return out;
}

void Replay(const ServerProcess& server, const std::string& path) {
  CommandResult r = RunCommand(
      {BinDir() + "/trainwatchctl", "--server", server.grpc_address(), "replay", path});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
}

// What MessageDifferencer finds between `given` and `stored`, "" if nothing.
std::string Differences(const google::protobuf::Message& given,
                        const google::protobuf::Message& stored) {
  google::protobuf::util::MessageDifferencer differ;
  std::string report;
  differ.ReportDifferencesToString(&report);
  differ.Compare(given, stored);
  return report;
}

TEST(ReplayIntegration, StoresEveryFieldOfTheLogsRunStartAndSteps) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  // Every field filled, then the few the server validates made valid.
  v1::RunStart start = FilledMessage<v1::RunStart>();
  start.set_run_id("replay/every-field");
  start.set_rank(0);
  start.set_world_size(1);
  start.set_adam_beta2(0.95);
  start.clear_labels();
  (*start.mutable_labels())["model"] = "tiny";
  (*start.mutable_labels())["owner"] = "ana";
  start.mutable_moe()->set_num_experts(2);  // the records' tokens_per_expert
  start.mutable_moe()->set_top_k(1);
  start.mutable_moe()->set_ep_size(2);
  // A host stream of its one rank: local_ranks and each record's rank say
  // which stream a record is of, and are not stored (host_stream_test).
  start.clear_local_ranks();
  start.add_local_ranks(0);
  std::vector<v1::StepRecord> records;
  for (uint64_t step = 1; step <= 50; ++step) {
    v1::StepRecord r = FilledMessage<v1::StepRecord>();
    r.set_step(step);
    r.set_time_unix_nanos(1'700'000'000'000'000'000 + static_cast<int64_t>(step) * 1'000'000'000);
    r.set_clip_coef(0.5);
    r.set_rank(0);
    for (auto& [tensor, stats] : *r.mutable_fp8()) {
      stats.set_overflow_fraction(0.001);
      stats.set_underflow_fraction(0.01);
    }
    records.push_back(r);
  }
  const std::string log = dir.File("every-field.jsonl");
  {
    std::ofstream out(log);
    out << "{\"run_start\": " << JsonOf(start) << "}\n";
    for (const v1::StepRecord& r : records) out << JsonOf(r) << "\n";
  }
  Replay(server, log);

  const RunRank stream{"replay/every-field", 0};
  start.clear_local_ranks();
  for (v1::StepRecord& r : records) r.clear_rank();
  std::map<RunRank, v1::RunStart> starts = ReadStoredStarts(dir.File("tw.db"));
  ASSERT_EQ(starts.count(stream), 1u);
  EXPECT_EQ(Differences(start, starts[stream]), "")
      << "the stored RunStart lost or changed (above) of the log's run_start "
      << start.ShortDebugString();
  std::map<RunRank, std::vector<v1::StepRecord>> stored =
      ReadStoredRecords(dir.File("tw.db"));
  ASSERT_EQ(stored[stream].size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    ASSERT_EQ(Differences(records[i], stored[stream][i]), "")
        << "the stored record lost or changed (above) of the log's step line "
        << records[i].ShortDebugString();
  }
}

// A router whose load sits on 6 of 16 experts, the first two EP ranks'.
// With top_k 4 that is a collapse (6 <= 2 x top_k effective experts) and
// one EP rank carries 2.7x the mean rank's tokens; a run_start without its
// moe block leaves the server top_k 1 and no EP layout, and neither alert.
void WriteMoeLog(const std::string& path, const std::string& run, bool with_moe) {
  std::ofstream out(path);
  json start = {{"run_id", run}, {"precision", "BF16"}, {"max_norm", 1.0},
                {"warmup_steps", 0}};
  if (with_moe) {
    start["moe"] = {{"num_experts", 16}, {"top_k", 4}, {"ep_size", 4},
                    {"balancing", "AUX_LOSS"}, {"aux_loss_coeff", 0.01}};
  }
  out << json{{"run_start", start}}.dump() << "\n";
  for (uint64_t step = 0; step < 600; ++step) {
    json line = {{"step", step}, {"grad_norm", 0.5}, {"loss", 2.0}};
    if (step % 5 == 0) {
      std::vector<uint64_t> tokens(16, 0);
      for (uint64_t e = 0; e < 6; ++e) tokens[e] = 1000 + (step * 7 + e * 13) % 50;
      line["moe"] = {{"layers", {{{"layer", "blocks.0.moe"}, {"tokens_per_expert", tokens}}}}};
    }
    out << line.dump() << "\n";
  }
}

json Alerts(const ServerProcess& server, const std::string& run) {
  CommandResult r = RunCommand({BinDir() + "/trainwatchctl", "--server",
                                server.grpc_address(), "alerts", "--run", run, "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out, nullptr, false);
}

const json* Named(const json& alerts, const std::string& alertname) {
  for (const json& a : alerts) {
    if (a["alertname"] == alertname) return &a;
  }
  return nullptr;
}

TEST(ReplayIntegration, AMoeRunsTopKAndEpSizeReachItsDetectors) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  WriteMoeLog(dir.File("moe.jsonl"), "replay/moe", /*with_moe=*/true);
  WriteMoeLog(dir.File("unsaid.jsonl"), "replay/moe-unsaid", /*with_moe=*/false);
  Replay(server, dir.File("moe.jsonl"));
  Replay(server, dir.File("unsaid.jsonl"));

  const v1::RunStart stored = ReadStoredStarts(dir.File("tw.db"))[{"replay/moe", 0}];
  EXPECT_EQ(stored.moe().num_experts(), 16u);
  EXPECT_EQ(stored.moe().top_k(), 4u);
  EXPECT_EQ(stored.moe().ep_size(), 4u);
  EXPECT_EQ(stored.moe().balancing(), v1::AUX_LOSS);

  const json alerts = Alerts(server, "replay/moe");
  const json* collapse = Named(alerts, "MoeRouterCollapse");
  ASSERT_NE(collapse, nullptr) << alerts.dump(1);
  EXPECT_THAT((*collapse)["description"].get<std::string>(), HasSubstr("x top_k 4)"));
  const json* ep = Named(alerts, "MoeExpertParallelImbalance");
  ASSERT_NE(ep, nullptr) << alerts.dump(1);
  EXPECT_THAT((*ep)["description"].get<std::string>(), HasSubstr("in 4 contiguous blocks"));

  const json unsaid = Alerts(server, "replay/moe-unsaid");
  EXPECT_EQ(Named(unsaid, "MoeRouterCollapse"), nullptr) << unsaid.dump(1);
  EXPECT_EQ(Named(unsaid, "MoeExpertParallelImbalance"), nullptr) << unsaid.dump(1);

  // /metrics: the last report's (step 595) worst layer, its one layer here.
  uint64_t total = 0, max = 0;
  for (uint64_t e = 0; e < 6; ++e) {
    const uint64_t c = 1000 + (595 * 7 + e * 13) % 50;
    total += c;
    max = std::max(max, c);
  }
  const std::string metrics = HttpGet(server.metrics_url());
  EXPECT_EQ(MetricValue(metrics, "trainwatch_moe_dead_experts{run=\"replay/moe\"}"), 10);
  EXPECT_DOUBLE_EQ(MetricValue(metrics, "trainwatch_moe_load_max_over_mean{run=\"replay/moe\"}"),
                   static_cast<double>(max) / (static_cast<double>(total) / 16));
}

json Ctl(const ServerProcess& server, std::vector<std::string> args) {
  args.insert(args.begin(), {BinDir() + "/trainwatchctl", "--server", server.grpc_address()});
  CommandResult r = RunCommand(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out, nullptr, false);
}

TEST(ReplayIntegration, AHardBatchIsListedApartFromTheSpikes) {
  // A loss at 2.0 (+-1%) with one step at 8.0 (a hard batch, step 300) and
  // five at 6.0 (a spike, steps 600-604); batch ids 10 x step.
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  {
    std::ofstream out(dir.File("loss.jsonl"));
    out << json{{"run_start", {{"run_id", "replay/hard"}, {"precision", "BF16"},
                               {"max_norm", 1.0}, {"warmup_steps", 0}}}}.dump()
        << "\n";
    for (uint64_t step = 0; step < 800; ++step) {
      double loss = 2.0 * (1.0 + 0.01 * static_cast<double>((step * 37) % 7) / 3.0);
      if (step == 300) loss = 8.0;
      if (step >= 600 && step < 605) loss = 6.0;
      out << json{{"step", step}, {"grad_norm", 0.5}, {"loss", loss},
                  {"batch_ids", {static_cast<int64_t>(step) * 10}}}.dump()
          << "\n";
    }
  }
  Replay(server, dir.File("loss.jsonl"));
  json hard;
  ASSERT_TRUE(Eventually([&] {
    hard = Ctl(server, {"spikes", "--run", "replay/hard", "--hard-batches", "--json"});
    return hard.is_array() && !hard.empty();
  })) << hard.dump(1);
  ASSERT_EQ(hard.size(), 1u) << hard.dump(1);
  EXPECT_EQ(hard[0]["step"], 300);
  EXPECT_EQ(hard[0]["high_steps"], 1);
  EXPECT_EQ(hard[0]["batch_ids"], json::array({3000}));
  EXPECT_TRUE(hard[0]["peak_is_ratio"].get<bool>());
  EXPECT_NEAR(hard[0]["peak"].get<double>(), 4.0, 0.1);

  const json spikes = Ctl(server, {"spikes", "--run", "replay/hard", "--json"});
  std::vector<uint64_t> steps;
  for (const json& s : spikes) steps.push_back(s["step"].get<uint64_t>());
  EXPECT_THAT(steps, ::testing::Contains(600u)) << spikes.dump(1);
  EXPECT_THAT(steps, ::testing::Not(::testing::Contains(300u))) << spikes.dump(1);
  const json alerts = Alerts(server, "replay/hard");
  for (const json& a : alerts) {
    if (a["alertname"] == "LossSpike") {
      EXPECT_EQ(a["onset_step"], 600) << a.dump(1);
    }
  }
  ASSERT_NE(Named(alerts, "LossSpike"), nullptr) << alerts.dump(1);
}

}  // namespace
}  // namespace trainwatch::testing
