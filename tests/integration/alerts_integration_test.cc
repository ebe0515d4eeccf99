// The health engine end to end: a replayed spike is an alert on /metrics by
// the time replay returns (its ack), is stored with its batch ids, comes with
// a restart plan, and survives a server restart without firing again.
#include <cmath>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "eventually.h"
#include "harness.h"

namespace trainwatch::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr uint64_t kSpikeStep = 3000;

// A healthy bf16 run with one spike at kSpikeStep and checkpoints every 500.
void WriteSpikeLog(const std::string& path, const std::string& run, uint64_t steps) {
  std::ofstream out(path);
  out << json{{"run_start", {{"run_id", run}, {"precision", "BF16"},
                             {"max_norm", 1.0}, {"warmup_steps", 200}}}}
             .dump()
      << "\n";
  std::mt19937_64 rng(7);
  std::normal_distribution<double> noise(0.0, 0.2);
  for (uint64_t i = 0; i < steps; ++i) {
    double norm = 0.35 * std::exp(noise(rng));
    if (i == kSpikeStep) norm = 12.0;
    out << json{{"step", i}, {"grad_norm", norm}, {"loss", 2.0},
                {"batch_ids", {7 * i, 7 * i + 1}}}
               .dump()
        << "\n";
    if (i % 500 == 0 && i > 0) {
      out << json{{"event", {{"step", i}, {"kind", "CHECKPOINT_SAVED"},
                             {"detail", "ckpt-" + std::to_string(i)}}}}
                 .dump()
          << "\n";
    }
  }
}

json Ctl(const ServerProcess& server, std::vector<std::string> args) {
  std::vector<std::string> argv = {BinDir() + "/trainwatchctl", "--server",
                                   server.grpc_address()};
  argv.insert(argv.end(), args.begin(), args.end());
  CommandResult r = RunCommand(argv);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out, nullptr, false);
}

TEST(AlertsIntegration, ASpikeIsOnMetricsByItsAckStoredWithARestartPlanAndSurvivesARestart) {
  TempDir dir;
  auto server = std::make_unique<ServerProcess>(dir.File("tw.db"));
  const int port = server->grpc_port();
  WriteSpikeLog(dir.File("spike.jsonl"), "spiky", kSpikeStep + 1);
  CommandResult r = RunCommand({BinDir() + "/trainwatchctl", "--server",
                                server->grpc_address(), "replay", dir.File("spike.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.err;

  // replay returned once the spike's batch was acked: the alert is visible.
  std::string metrics = HttpGet(server->metrics_url());
  EXPECT_EQ(MetricValue(metrics, "trainwatch_alert_active{alertname=\"GradNormSpike\",run=\"spiky\",severity=\"info\"}"), 1);
  EXPECT_EQ(MetricValue(metrics, "trainwatch_alerts_fired_total{alertname=\"GradNormSpike\",run=\"spiky\"}"), 1);

  json alerts = Ctl(*server, {"alerts", "--run", "spiky", "--json"});
  ASSERT_EQ(alerts.size(), 1u) << alerts.dump();
  EXPECT_EQ(alerts[0]["alertname"], "GradNormSpike");
  EXPECT_EQ(alerts[0]["state"], "firing");
  EXPECT_EQ(alerts[0]["started_step"], kSpikeStep);
  EXPECT_EQ(alerts[0]["peak_value"], 12.0);
  EXPECT_EQ(alerts[0]["batch_ids"], (json{7 * kSpikeStep, 7 * kSpikeStep + 1}));
  EXPECT_THAT(alerts[0]["description"].get<std::string>(), HasSubstr("12"));
  EXPECT_FALSE(alerts[0]["fix"].get<std::string>().empty());

  json spikes = Ctl(*server, {"spikes", "--run", "spiky", "--json"});
  ASSERT_EQ(spikes.size(), 1u) << spikes.dump();
  EXPECT_EQ(spikes[0]["step"], kSpikeStep);
  EXPECT_GT(spikes[0]["ratio_to_ema"].get<double>(), 10.0);
  // The last checkpoint at least 100 steps before step 3000 is ckpt-2500.
  EXPECT_EQ(spikes[0]["restart_from_step"], 2500);
  EXPECT_EQ(spikes[0]["restart_checkpoint"], "ckpt-2500");
  EXPECT_EQ(spikes[0]["skip_batch_ids"], (json{7 * kSpikeStep, 7 * kSpikeStep + 1}));

  // A server restart keeps the alert firing and does not fire it again.
  server->Kill();
  server = std::make_unique<ServerProcess>(dir.File("tw.db"), port);
  metrics = HttpGet(server->metrics_url());
  EXPECT_EQ(MetricValue(metrics, "trainwatch_alert_active{alertname=\"GradNormSpike\",run=\"spiky\",severity=\"info\"}"), 1);
  EXPECT_TRUE(std::isnan(MetricValue(metrics, "trainwatch_alerts_fired_total{alertname=\"GradNormSpike\",run=\"spiky\"}")));
  json health = Ctl(*server, {"health", "--run", "spiky", "--json"});
  EXPECT_GT(health["window"]["baseline_grad_norm_median"].get<double>(), 0.3);
  EXPECT_EQ(health["active_alerts"].size(), 1u);

  // The run continues healthy: the spike alert resolves 100 steps on, once.
  std::ofstream more(dir.File("more.jsonl"));
  for (uint64_t i = kSpikeStep + 1; i < kSpikeStep + 200; ++i) {
    more << json{{"step", i}, {"grad_norm", 0.35}}.dump() << "\n";
  }
  more.close();
  r = RunCommand({BinDir() + "/trainwatchctl", "--server", server->grpc_address(),
                  "replay", "--run", "spiky", "--max-norm", "1", "--warmup-steps", "200",
                  dir.File("more.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  alerts = Ctl(*server, {"alerts", "--run", "spiky", "--json"});
  ASSERT_EQ(alerts.size(), 1u) << alerts.dump();
  EXPECT_EQ(alerts[0]["state"], "resolved");
  EXPECT_EQ(alerts[0]["resolved_step"], kSpikeStep + 100);
  metrics = HttpGet(server->metrics_url());
  EXPECT_EQ(MetricValue(metrics, "trainwatch_alert_active{alertname=\"GradNormSpike\",run=\"spiky\",severity=\"info\"}"), 0);
}

TEST(AlertsIntegration, AFinishedRunLeavesMetricsAfterItsRetentionWithItsAlertsResolved) {
  TempDir dir;
  {
    std::ofstream config(dir.File("trainwatch.yaml"));
    config << "finished_runs:\n  retention_seconds: 1\n";
  }
  ServerProcess server(dir.File("tw.db"), 0, {"--config", dir.File("trainwatch.yaml")});
  WriteSpikeLog(dir.File("spike.jsonl"), "done", kSpikeStep + 1);
  {
    std::ofstream log(dir.File("spike.jsonl"), std::ios::app);
    log << json{{"event", {{"step", kSpikeStep}, {"kind", "RUN_FINISHED"}}}}.dump() << "\n";
  }
  CommandResult r = RunCommand({BinDir() + "/trainwatchctl", "--server",
                                server.grpc_address(), "replay", dir.File("spike.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string active = "trainwatch_alert_active{alertname=\"GradNormSpike\",run=\"done\",severity=\"info\"}";
  std::string metrics = HttpGet(server.metrics_url());
  // The RUN_FINISHED was acked: the run is marked finished, still exported.
  // (If the 1 s retention already passed, the series are gone instead.)
  if (!std::isnan(MetricValue(metrics, "trainwatch_steps_total{run=\"done\"}"))) {
    EXPECT_EQ(MetricValue(metrics, "trainwatch_run_finished{run=\"done\"}"), 1) << metrics;
    EXPECT_EQ(MetricValue(metrics, active), 1);
  }
  EXPECT_EQ(MetricValue(metrics, "trainwatch_runs_active"), 0);

  // The server checks once a second.
  EXPECT_TRUE(Eventually([&] {
    metrics = HttpGet(server.metrics_url());
    return std::isnan(MetricValue(metrics, "trainwatch_steps_total{run=\"done\"}"));
  }, std::chrono::seconds(120), std::chrono::milliseconds(100)));
  ASSERT_FALSE(metrics.empty());
  EXPECT_THAT(metrics, ::testing::Not(HasSubstr("run=\"done\""))) << "a forgotten run's series stay";

  // Its history is still there, with the spike alert resolved at the last step.
  json alerts = Ctl(server, {"alerts", "--run", "done", "--json"});
  ASSERT_EQ(alerts.size(), 1u) << alerts.dump();
  EXPECT_EQ(alerts[0]["alertname"], "GradNormSpike");
  EXPECT_EQ(alerts[0]["state"], "resolved");
  EXPECT_EQ(alerts[0]["resolved_step"], kSpikeStep);
  json health = Ctl(server, {"health", "--run", "done", "--json"});
  EXPECT_EQ(health["run"]["last_step"], kSpikeStep) << health.dump();
  EXPECT_EQ(health["active_alerts"].size(), 0u) << health.dump();
}

}  // namespace
}  // namespace trainwatch::testing
