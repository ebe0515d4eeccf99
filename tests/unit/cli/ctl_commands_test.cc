// Tests of whole trainwatchctl invocations (RunCli) against an in-process
// fake TrainingHealth server: exit codes, messages, and output shapes.
#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cli/cli.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace trainwatch::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Answers queries with canned responses and acks every Report message as
// soon as it arrives, keeping what it received. Thread-safe.
class FakeServer final : public v1::TrainingHealth::Service {
 public:
  grpc::Status Report(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::ReportResponse, v1::ReportRequest>* stream)
      override {
    v1::ReportRequest request;
    while (stream->Read(&request)) {
      uint64_t seq = request.has_batch()   ? request.batch().seq()
                     : request.has_event() ? request.event().seq()
                                           : 0;
      {
        absl::MutexLock lock(&mu_);
        reports_.push_back(request);
      }
      if (seq == 0) continue;
      v1::ReportResponse response;
      response.set_acked_seq(seq);
      stream->Write(response);
    }
    return grpc::Status::OK;
  }

  grpc::Status ListRuns(grpc::ServerContext*, const v1::ListRunsRequest*,
                        v1::ListRunsResponse* response) override {
    v1::RunSummary* run = response->add_runs();
    run->set_run_id("r1");
    run->set_world_size(2);
    run->set_precision(v1::BF16);
    run->set_last_step(1ULL << 40);
    (*run->mutable_labels())["model"] = "tiny";
    return grpc::Status::OK;
  }

  grpc::Status ListAlerts(grpc::ServerContext*,
                          const v1::ListAlertsRequest* request,
                          v1::ListAlertsResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      last_alerts_request_ = *request;
    }
    v1::Alert* spike = response->add_alerts();
    spike->set_alertname("GradNormSpike");
    spike->set_run("r1");
    spike->set_state(v1::ALERT_STATE_FIRING);
    spike->set_started_step(150);
    spike->set_peak_value(42.5);
    spike->add_batch_ids(300);
    spike->add_batch_ids(301);
    v1::Alert* clip = response->add_alerts();
    clip->set_alertname("ClipFractionHigh");
    clip->set_run("r1");
    clip->set_state(v1::ALERT_STATE_RESOLVED);
    clip->set_started_step(10);
    clip->set_resolved_step(90);
    return grpc::Status::OK;
  }

  grpc::Status GetRunHealth(grpc::ServerContext*,
                            const v1::GetRunHealthRequest* request,
                            v1::GetRunHealthResponse* response) override {
    if (request->run_id() != "r1") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "no run \"" + request->run_id() + "\"");
    }
    response->mutable_run()->set_run_id("r1");
    response->mutable_window()->set_steps(900);
    response->mutable_window()->set_grad_norm_p50(0.25);
    response->set_recommended_max_norm(1.5);
    v1::Alert* alert = response->add_active_alerts();
    alert->set_alertname("LossScaleCollapse");
    alert->set_state(v1::ALERT_STATE_FIRING);
    // Oldest first: one too early for any checkpoint, one with a plan.
    v1::Spike* early = response->add_spikes();
    early->set_step(90);
    early->set_grad_norm(12);
    early->set_ratio_to_ema(11.5);
    early->set_sigmas(7.5);
    early->add_batch_ids(7);
    v1::Spike* planned = response->add_spikes();
    planned->set_step(150);
    planned->set_grad_norm(42.5);
    planned->set_ratio_to_ema(27.4);
    planned->set_sigmas(8.3);
    planned->add_batch_ids(300);
    planned->add_batch_ids(301);
    planned->set_restart_from_step(40);
    planned->set_restart_checkpoint("ckpt/step-40");
    planned->set_outcome("recurred");
    planned->set_batches_skipped(true);
    return grpc::Status::OK;
  }

  grpc::Status QuerySteps(
      grpc::ServerContext*, const v1::QueryStepsRequest* request,
      grpc::ServerWriter<v1::StepRecords>* writer) override {
    {
      absl::MutexLock lock(&mu_);
      last_query_ = *request;
    }
    if (request->run_id() == "empty") return grpc::Status::OK;
    // Two chunks, so that the JSON array must continue across them.
    for (uint64_t first : {0, 2}) {
      v1::StepRecords chunk;
      for (uint64_t step = first; step < first + 2; ++step) {
        v1::StepRecords::Item* item = chunk.add_items();
        item->set_rank(1);
        item->set_attempt(3);
        item->mutable_record()->set_step(step);
        item->mutable_record()->set_grad_norm(0.5);
      }
      writer->Write(chunk);
    }
    return grpc::Status::OK;
  }

  std::vector<v1::ReportRequest> reports() {
    absl::MutexLock lock(&mu_);
    return reports_;
  }
  v1::ListAlertsRequest last_alerts_request() {
    absl::MutexLock lock(&mu_);
    return last_alerts_request_;
  }
  v1::QueryStepsRequest last_query() {
    absl::MutexLock lock(&mu_);
    return last_query_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::ReportRequest> reports_ ABSL_GUARDED_BY(mu_);
  v1::ListAlertsRequest last_alerts_request_ ABSL_GUARDED_BY(mu_);
  v1::QueryStepsRequest last_query_ ABSL_GUARDED_BY(mu_);
};

struct Result {
  int code;
  std::string out;
  std::string err;
};

class CtlTest : public ::testing::Test {
 public:
  // Serves `service` on a free loopback port; returns its address.
  static std::string Start(grpc::Service* service,
                           std::unique_ptr<grpc::Server>* server) {
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(service);
    *server = builder.BuildAndStart();
    return "127.0.0.1:" + std::to_string(port);
  }

 protected:
  void SetUp() override { address_ = Start(&fake_, &server_); }
  void TearDown() override { server_->Shutdown(); }

  // Runs trainwatchctl with --server pointing at the fake.
  Result Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {"--server", address_});
    ::testing::internal::CaptureStdout();
    ::testing::internal::CaptureStderr();
    int code = RunCli(args);
    std::string out = ::testing::internal::GetCapturedStdout();
    return {code, out, ::testing::internal::GetCapturedStderr()};
  }

  static std::string WriteFile(const std::string& name,
                               const std::string& text) {
    std::string path = ::testing::TempDir() + name;
    std::ofstream(path) << text;
    return path;
  }

  FakeServer fake_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(CtlTest, ReplaySendsRunStartStepsAndEventsInOrder) {
  std::string path = WriteFile(
      "replay_ok.jsonl",
      R"({"run_start": {"run_id": "r1", "precision": "FP16", "max_norm": 1.0, "labels": {"model": "tiny"}}})"
      "\n{\"step\": 0, \"grad_norm\": 0.3}\n\n"
      R"({"event": {"step": 0, "kind": "CHECKPOINT_SAVED"}})"
      "\n{\"step\": 1, \"grad_norm\": \"Infinity\", \"skipped\": true}\n");
  Result r = Ctl(
      {"replay", path, "--rank=1", "--world-size", "2", "--max-norm", "2.5"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("(2 steps, 1 event), 2 acked"));

  std::vector<v1::ReportRequest> reports = fake_.reports();
  ASSERT_FALSE(reports.empty());
  const v1::RunStart& start = reports[0].start();
  EXPECT_EQ(start.run_id(), "r1");
  EXPECT_EQ(start.rank(), 1u);  // flags override the run_start line
  EXPECT_EQ(start.world_size(), 2u);
  EXPECT_EQ(start.max_norm(), 2.5);
  EXPECT_EQ(start.precision(), v1::FP16);
  EXPECT_EQ(start.labels().at("model"), "tiny");
  // Steps and the event arrive in file order.
  std::vector<std::string> order;
  for (const v1::ReportRequest& req : reports) {
    for (const v1::StepRecord& rec : req.batch().records()) {
      order.push_back("step" + std::to_string(rec.step()));
    }
    if (req.has_event()) order.push_back("event");
  }
  EXPECT_THAT(order, ::testing::ElementsAre("step0", "event", "step1"));
}

TEST_F(CtlTest, ReplayStopsAtABadLineAfterDeliveringWhatCameBefore) {
  std::string path = WriteFile("replay_bad.jsonl",
                               "{\"step\": 0, \"grad_norm\": 0.3}\n"
                               "{\"step\": 1, \"grad_norm\": oops}\n"
                               "{\"step\": 2, \"grad_norm\": 0.3}\n");
  Result r = Ctl({"replay", "--run", "bad-run", path});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, StartsWith("trainwatchctl: " + path + ":2: invalid JSON"));
  std::vector<uint64_t> steps;
  for (const v1::ReportRequest& req : fake_.reports()) {
    for (const v1::StepRecord& rec : req.batch().records()) {
      steps.push_back(rec.step());
    }
  }
  EXPECT_THAT(steps, ::testing::ElementsAre(0));
}

TEST_F(CtlTest, ReplayWithoutRunStartNeedsRun) {
  std::string path = WriteFile("replay_norun.jsonl", "{\"step\": 0}\n");
  Result r = Ctl({"replay", path});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("no run_start line: give --run"));
  EXPECT_TRUE(fake_.reports().empty());
}

TEST_F(CtlTest, RunsJsonPrintsBareNumbersAndPrecisionNames) {
  Result r = Ctl({"runs", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith(R"([{"run_id":"r1","world_size":2,)"));
  EXPECT_THAT(r.out, HasSubstr(R"("precision":"BF16")"));
  EXPECT_THAT(r.out, HasSubstr(R"("labels":{"model":"tiny"})"));
  EXPECT_THAT(r.out, HasSubstr(R"("last_step":1099511627776,)"));
  EXPECT_EQ(r.out.back(), '\n');
}

TEST_F(CtlTest, StepsJsonIsOneArrayAcrossChunks) {
  Result r = Ctl({"steps", "--run", "r1", "--from", "5", "--to=9", "--rank",
                  "1", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("[\n{\"rank\":1,\"attempt\":3,\"step\":0,"));
  EXPECT_THAT(r.out, HasSubstr("\"step\":1,\"grad_norm\":0.5,\"skipped\":false,"
                               "\"time_unix_nanos\":0},\n{\"rank\":1,"
                               "\"attempt\":3,\"step\":2,"));
  EXPECT_THAT(r.out, ::testing::EndsWith("}\n]\n"));
  v1::QueryStepsRequest query = fake_.last_query();
  EXPECT_EQ(query.from_step(), 5u);
  EXPECT_EQ(query.to_step(), 9u);
  ASSERT_TRUE(query.has_rank());
  EXPECT_EQ(query.rank(), 1u);

  Result empty = Ctl({"steps", "--run", "empty", "--json"});
  EXPECT_EQ(empty.out, "[]\n");
  EXPECT_FALSE(fake_.last_query().has_rank());
}

TEST_F(CtlTest, StepsTableHasAHeaderAndARowPerStep) {
  Result r = Ctl({"steps", "--run", "r1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("RANK  ATTEMPT"));
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 5);
}

TEST_F(CtlTest, AlertsJsonHasTheDesignKeysAndPassesFilters) {
  Result r = Ctl({"alerts", "--run", "r1", "--active", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out,
              StartsWith(R"([{"alertname":"GradNormSpike","run":"r1",)"));
  EXPECT_THAT(r.out, HasSubstr(R"("resolved_step":null)"));
  EXPECT_THAT(r.out, HasSubstr(R"("started_step":10,"resolved_step":90,)"));
  EXPECT_EQ(fake_.last_alerts_request().run_id(), "r1");
  EXPECT_TRUE(fake_.last_alerts_request().active_only());
}

TEST_F(CtlTest, SpikesTableHasEachSpikeAndItsRestartPlan) {
  Result r = Ctl({"spikes", "--run", "r1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(
      r.out,
      "STEP  GRAD_NORM  RATIO  SIGMAS  BATCH_IDS  RESTART_FROM  CHECKPOINT    "
      "OUTCOME\n"
      "90    12         11.5x  7.5     7          -             -             -\n"
      "150   42.5       27.4x  8.3     300,301    40            ckpt/step-40  "
      "recurred (batches skipped)\n"
      "restart plan for step 90: no checkpoint at least 100 steps before it; "
      "restart from the start or the nearest earlier checkpoint you have, and "
      "skip batches 7\n"
      "restart plan for step 150: resume from checkpoint ckpt/step-40 (step "
      "40) and skip batches 300,301\n");
}

TEST_F(CtlTest, SpikesJsonIsAnArrayOfSpikesWithRestartPlans) {
  Result r = Ctl({"spikes", "--run", "r1", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out,
            R"([{"step":90,"grad_norm":12,"ratio_to_ema":11.5,"sigmas":7.5,)"
            R"("batch_ids":[7],"restart_from_step":null,)"
            R"("restart_checkpoint":"","skip_batch_ids":[7],)"
            R"("outcome":"","batches_skipped":false},)"
            R"({"step":150,"grad_norm":42.5,"ratio_to_ema":27.4,"sigmas":8.3,)"
            R"("batch_ids":[300,301],"restart_from_step":40,)"
            R"("restart_checkpoint":"ckpt/step-40",)"
            R"("skip_batch_ids":[300,301],"outcome":"recurred",)"
            R"("batches_skipped":true}])"
            "\n");
}

TEST_F(CtlTest, PlanIsTheLatestSpikesPlanWithItsOutcome) {
  Result r = Ctl({"plan", "--run", "r1", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out,
              StartsWith(R"({"run":"r1","spike_step":150,"restart_from_step":40,)"
                         R"("checkpoint":"ckpt/step-40","skip_batch_ids":[300,301],)"
                         R"("outcome":"recurred","batches_skipped":true,"why":")"));
  EXPECT_THAT(r.out, HasSubstr("not the data"));
  Result text = Ctl({"plan", "--run", "r1"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("spike          step 150 (recurred)\n"
                                  "resume from    ckpt/step-40 (step 40)\n"
                                  "skip batches   300,301\n"));
}

TEST_F(CtlTest, PlanServerErrorNamesTheCommand) {
  Result r = Ctl({"plan", "--run", "nope"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "trainwatchctl: plan: NOT_FOUND: no run \"nope\"\n");
}

TEST_F(CtlTest, SpikesServerErrorNamesTheCommand) {
  Result r = Ctl({"spikes", "--run", "nope"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "trainwatchctl: spikes: NOT_FOUND: no run \"nope\"\n");
}

TEST_F(CtlTest, HealthPrintsWindowRecommendationAndActiveAlerts) {
  Result text = Ctl({"health", "--run", "r1"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("900 post-warmup steps"));
  EXPECT_THAT(text.out, HasSubstr("max_norm 1.5"));
  EXPECT_THAT(text.out, HasSubstr("LossScaleCollapse"));

  Result json = Ctl({"health", "--run", "r1", "--json"});
  ASSERT_EQ(json.code, 0) << json.err;
  EXPECT_THAT(json.out, StartsWith(R"({"run":{"run_id":"r1",)"));
  EXPECT_THAT(json.out,
              HasSubstr(R"("window":{"steps":900,"grad_norm_p50":0.25,)"));
  EXPECT_THAT(
      json.out,
      HasSubstr(
          R"("recommended_max_norm":1.5,"active_alerts":[{"alertname":"LossScaleCollapse",)"));
  EXPECT_THAT(json.out, HasSubstr(R"(}],"spikes":[{"step":90,)"));
  EXPECT_THAT(json.out,
              HasSubstr(R"("restart_from_step":40,)"
                        R"("restart_checkpoint":"ckpt/step-40",)"
                        R"("skip_batch_ids":[300,301],"outcome":"recurred",)"
                        R"("batches_skipped":true}]})"
                        "\n"));
}

TEST_F(CtlTest, ServerErrorNamesCommandAndCode) {
  Result r = Ctl({"health", "--run", "nope"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "trainwatchctl: health: NOT_FOUND: no run \"nope\"\n");
}

TEST(Ctl, UnimplementedRpcIsNamed) {
  v1::TrainingHealth::Service bare;  // every RPC answers UNIMPLEMENTED
  std::unique_ptr<grpc::Server> server;
  std::string address = CtlTest::Start(&bare, &server);
  for (const auto& [command, rpc] :
       {std::pair{"health", "GetRunHealth"}, std::pair{"alerts", "ListAlerts"},
        std::pair{"spikes", "GetRunHealth"}}) {
    ::testing::internal::CaptureStderr();
    int code = RunCli({"--server", address, command, "--run", "r1"});
    EXPECT_EQ(code, 1);
    EXPECT_EQ(::testing::internal::GetCapturedStderr(),
              absl::StrCat("trainwatchctl: ", command,
                           ": the server does not implement ", rpc, " yet\n"));
  }
  server->Shutdown();
}

TEST(Ctl, UnreachableServerIsAGrpcError) {
  ::testing::internal::CaptureStderr();
  int code = RunCli({"--server=127.0.0.1:1", "--timeout", "5", "runs"});
  EXPECT_EQ(code, 1);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              StartsWith("trainwatchctl: runs: UNAVAILABLE: "));
}

TEST_F(CtlTest, UsageErrorsExitTwoAndHelpExitsZero) {
  EXPECT_EQ(Ctl({"bogus"}).code, 2);
  EXPECT_EQ(Ctl({"steps"}).code, 2);  // --run is required
  EXPECT_EQ(Ctl({"steps", "--run", "r1", "--from", "-1"}).code, 2);
  EXPECT_EQ(Ctl({"runs", "--nope"}).code, 2);
  EXPECT_EQ(Ctl({"runs", "--json=yes"}).code, 2);
  Result unknown = Ctl({"alerts", "--frobnicate"});
  EXPECT_THAT(unknown.err, HasSubstr("unknown flag --frobnicate"));
  Result help = Ctl({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.out, HasSubstr("replay FILE.jsonl"));
}

}  // namespace
}  // namespace trainwatch::cli
