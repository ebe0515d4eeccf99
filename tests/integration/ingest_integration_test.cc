// End-to-end: the real trainwatch-server binary on loopback ports with a
// temporary SQLite file, fed by trainwatchctl and the C++ client.

#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "eventually.h"
#include "harness.h"
#include "raw_stream.h"
#include "store/ranks/rank_digest.h"
#include "stored_data.h"
#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace trainwatch::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

double NormAt(uint64_t step, uint32_t rank) {
  // Deterministic, lognormal-looking, occasionally above max_norm 1.0.
  return 0.5 * std::exp(0.5 * std::sin(0.37 * static_cast<double>(step)) +
                        0.4 * std::cos(1.3 * static_cast<double>(step))) +
         0.001 * rank;
}

// Writes a JSONL step log of `steps` steps for one rank.
void WriteLog(const std::string& path, const std::string& run, uint32_t rank,
              uint32_t world_size, uint64_t steps) {
  std::ofstream out(path);
  out << json{{"run_start", {{"run_id", run}, {"rank", rank},
                             {"world_size", world_size}, {"precision", "BF16"},
                             {"max_norm", 1.0}, {"warmup_steps", 100},
                             {"labels", {{"model", "tiny"}}}}}}
             .dump()
      << "\n";
  for (uint64_t i = 0; i < steps; ++i) {
    out << json{{"step", i}, {"grad_norm", NormAt(i, rank)},
                {"loss", 2.0 + 1.0 / (1.0 + i)}, {"lr", 3e-4},
                {"batch_ids", {2 * i, 2 * i + 1}}}
               .dump()
        << "\n";
  }
}

struct StoredCounts {
  std::map<uint32_t, int64_t> records_by_rank;
  int64_t overlapping_chunks = -1;
};

// Reads the database file directly, as an operator would with sqlite3.
StoredCounts CountStored(const std::string& db_path, const std::string& run) {
  StoredCounts c;
  for (const auto& [stream, n] : CountStoredRecords(db_path)) {
    if (stream.first == run) c.records_by_rank[stream.second] = n;
  }
  // Chunks of one stream never cover a step twice.
  c.overlapping_chunks = CountOverlappingChunks(db_path);
  return c;
}

json StepsJson(const std::string& server, const std::string& run) {
  CommandResult r = RunCommand({BinDir() + "/trainwatchctl", "--server", server,
                         "steps", "--run", run, "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out, nullptr, /*allow_exceptions=*/false);
}

// Asserts that `steps` holds each of 0..n-1 exactly once for `rank`.
void ExpectEachStepOnce(const json& steps, uint32_t rank, uint64_t n) {
  std::vector<int> seen(n, 0);
  for (const json& s : steps) {
    if (s["rank"].get<uint32_t>() != rank) continue;
    uint64_t step = s["step"].get<uint64_t>();
    ASSERT_LT(step, n);
    ++seen[step];
  }
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "rank " << rank << " step " << i;
}

TEST(IngestIntegration, ReplayOfTwoRanksIsStoredExactlyAndExported) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  const std::string run = "two-ranks";
  const uint64_t kSteps = 10000;
  for (uint32_t rank : {0u, 1u}) {
    std::string log = dir.File("rank" + std::to_string(rank) + ".jsonl");
    WriteLog(log, run, rank, 2, kSteps);
    CommandResult r = RunCommand({BinDir() + "/trainwatchctl", "--server",
                           server.grpc_address(), "replay", log});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }

  // The database file holds exactly those rows.
  StoredCounts stored = CountStored(dir.File("tw.db"), run);
  EXPECT_EQ(stored.records_by_rank[0], static_cast<int64_t>(kSteps));
  EXPECT_EQ(stored.records_by_rank[1], static_cast<int64_t>(kSteps));
  EXPECT_EQ(stored.overlapping_chunks, 0);

  // trainwatchctl steps --json returns them: the lead's values intact, the
  // other rank's digest (store/ranks/rank_digest.h: the norm to 16 significant
  // bits, no batch ids).
  json steps = StepsJson(server.grpc_address(), run);
  ASSERT_TRUE(steps.is_array());
  ASSERT_EQ(steps.size(), 2 * kSteps);
  ExpectEachStepOnce(steps, 0, kSteps);
  ExpectEachStepOnce(steps, 1, kSteps);
  int64_t clipped_rank0 = 0;
  for (const json& s : steps) {
    uint64_t step = s["step"];
    uint32_t rank = s["rank"];
    double norm = NormAt(step, rank);
    ASSERT_EQ(s["clipped"].get<bool>(), norm > 1.0) << "step " << step;
    if (rank == 0) {
      ASSERT_EQ(s["grad_norm"].get<double>(), norm);
      ASSERT_EQ(s["batch_ids"][1].get<int64_t>(), static_cast<int64_t>(2 * step + 1));
    } else {
      ASSERT_EQ(s["grad_norm"].get<double>(),
                RoundToSignificantBits(norm, kRankDigestMantissaBits));
      ASSERT_FALSE(s.contains("batch_ids")) << "step " << step;
    }
    if (rank == 0 && norm > 1.0) ++clipped_rank0;
  }
  ASSERT_GT(clipped_rank0, 0) << "the test log should clip sometimes";

  // /metrics reports them: run-level series follow rank 0.
  std::string metrics = HttpGet(server.metrics_url());
  std::string sel = "{run=\"" + run + "\"}";
  EXPECT_EQ(MetricValue(metrics, "trainwatch_steps_total" + sel), kSteps);
  EXPECT_EQ(MetricValue(metrics, "trainwatch_last_step" + sel), kSteps - 1);
  EXPECT_EQ(MetricValue(metrics, "trainwatch_clipped_steps_total" + sel), clipped_rank0);
  EXPECT_DOUBLE_EQ(MetricValue(metrics, "trainwatch_grad_norm" + sel), NormAt(kSteps - 1, 0));
  EXPECT_EQ(MetricValue(metrics, "trainwatch_clip_threshold" + sel), 1.0);
  EXPECT_EQ(MetricValue(metrics, "trainwatch_ingest_records_total"), 2 * kSteps);

  // runs --json lists the run with its totals.
  CommandResult runs = RunCommand({BinDir() + "/trainwatchctl", "--server",
                            server.grpc_address(), "runs", "--json"});
  ASSERT_EQ(runs.exit_code, 0) << runs.err;
  json listed = json::parse(runs.out);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0]["run_id"], run);
  EXPECT_EQ(listed[0]["steps"].get<uint64_t>(), 2 * kSteps);
  EXPECT_EQ(listed[0]["last_step"].get<uint64_t>(), kSteps - 1);
}

TEST(IngestIntegration, MetricsPassPromtoolWithNonFiniteValues) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  std::ofstream(dir.File("nf.jsonl"))
      << R"({"run_start": {"run_id": "team/exp:1.a-b_c", "precision": "FP16", "max_norm": 1.0}})" "\n"
      << R"({"step": 1, "grad_norm": 0.5, "loss_scale": 65536, "max_attn_logit": 11.5, "log_z": 0.3, "loss": 2.5, "lr": 0.001})" "\n"
      << R"({"step": 2, "grad_norm": "Infinity", "skipped": true, "loss_scale": 32768, "loss": "NaN"})" "\n";
  CommandResult r = RunCommand({BinDir() + "/trainwatchctl", "--server",
                         server.grpc_address(), "replay", dir.File("nf.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.err;

  std::string metrics = HttpGet(server.metrics_url());
  std::string sel = "{run=\"team/exp:1.a-b_c\"}";
  EXPECT_TRUE(std::isinf(MetricValue(metrics, "trainwatch_grad_norm" + sel)));
  EXPECT_TRUE(std::isnan(MetricValue(metrics, "trainwatch_loss" + sel)));
  EXPECT_THAT(metrics, HasSubstr("trainwatch_loss" + sel));
  EXPECT_EQ(MetricValue(metrics, "trainwatch_nonfinite_steps_total" + sel), 1);
  EXPECT_EQ(MetricValue(metrics, "trainwatch_skipped_steps_total" + sel), 1);
  EXPECT_EQ(MetricValue(metrics, "trainwatch_loss_scale" + sel), 32768);
  EXPECT_EQ(MetricValue(metrics, "trainwatch_max_attention_logit" + sel), 11.5);

  CommandResult lint = RunCommand({"promtool", "check", "metrics"}, metrics);
  EXPECT_EQ(lint.exit_code, 0) << "promtool check metrics:\n" << lint.out << lint.err;
}

TEST(IngestIntegration, LargeReplayIsCompleteAndQueryable) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  const uint64_t kSteps = 100000;
  WriteLog(dir.File("big.jsonl"), "big-run", 0, 1, kSteps);
  auto t0 = std::chrono::steady_clock::now();
  CommandResult r = RunCommand({BinDir() + "/trainwatchctl", "--server",
                         server.grpc_address(), "replay", dir.File("big.jsonl")});
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Informational, not asserted: the figures of docs/performance.md come from benchmarks.
  std::printf("replayed %llu steps in %.2f s (%.0f steps/s)\n",
              static_cast<unsigned long long>(kSteps), seconds, kSteps / seconds);
  json steps = StepsJson(server.grpc_address(), "big-run");
  ASSERT_EQ(steps.size(), kSteps);
  ExpectEachStepOnce(steps, 0, kSteps);
}

// Many bulk streams at once (1,024-record batches): together they exceed the
// shared bound on records waiting for the detectors (8,192), so streams stop
// reading and are woken as the detectors catch up. None may stall: every
// batch is acked and every record stored once.
TEST(IngestIntegration, BulkStreamsBeyondTheSharedBoundAllCompleteAndAreStored) {
  TempDir dir;
  const std::string db = dir.File("tw.db");
  ServerProcess server(db);
  ASSERT_GT(server.grpc_port(), 0);
  CommandResult load = RunCommand(
      {BinDir() + "/trainwatch-loadgen", "--server", server.grpc_address(),
       "--populate-runs", "64", "--records-per-run", "5000", "--batch", "1024",
       "--streams", "32"});
  ASSERT_EQ(load.exit_code, 0) << load.out << load.err;
  EXPECT_EQ(server.Terminate(), 0);
  const std::map<RunRank, int64_t> stored = CountStoredRecords(db);
  EXPECT_EQ(stored.size(), 64u);
  for (const auto& [run_rank, count] : stored) {
    EXPECT_EQ(count, 5000) << run_rank.first;
  }
  EXPECT_EQ(CountOverlappingChunks(db), 0);
}

TEST(IngestIntegration, ClientResendsAcrossAServerKillAndEachStepIsStoredOnce) {
  TempDir dir;
  auto server = std::make_unique<ServerProcess>(dir.File("tw.db"));
  const int port = server->grpc_port();
  ClientOptions options;
  options.address = server->grpc_address();
  options.run_id = "kill-test";
  options.max_norm = 1.0;
  options.initial_backoff = std::chrono::milliseconds(20);
  options.max_backoff = std::chrono::milliseconds(200);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();

  const uint64_t kSteps = 30000;
  for (uint64_t i = 0; i < kSteps; ++i) {
    ASSERT_TRUE((*client)->Record({.step = i, .grad_norm = NormAt(i, 0)}));
    if (i % 500 == 499) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (i == 10000) {
      // Kill it mid-stream, once some of the stream is acknowledged.
      ASSERT_TRUE(Eventually([&] { return (*client)->Stats().acked >= 5000; }))
          << (*client)->Stats().acked;
      server->Kill();
    }
    if (i == 15000) {
      server = std::make_unique<ServerProcess>(dir.File("tw.db"), port);
      ASSERT_EQ(server->grpc_port(), port);
    }
  }
  absl::Status flushed = (*client)->Flush(std::chrono::seconds(60));
  ASSERT_TRUE(flushed.ok()) << flushed;
  ClientStats stats = (*client)->Stats();
  EXPECT_EQ(stats.recorded, kSteps);
  EXPECT_EQ(stats.acked, kSteps);
  EXPECT_EQ(stats.dropped, 0u);
  EXPECT_GE(stats.reconnects, 1u);
  EXPECT_TRUE((*client)->Close().ok());

  StoredCounts stored = CountStored(dir.File("tw.db"), "kill-test");
  EXPECT_EQ(stored.records_by_rank[0], static_cast<int64_t>(kSteps));
  EXPECT_EQ(stored.overlapping_chunks, 0);
  json steps = StepsJson(server->grpc_address(), "kill-test");
  ASSERT_EQ(steps.size(), kSteps);
  ExpectEachStepOnce(steps, 0, kSteps);
}

// Step `i` of a run with every kind of field, once as a trainer gives it to
// Record() and once as replay and import hold it, for RecordProto().
constexpr int64_t kStartNanos = 1'700'000'000'000'000'000;

Step FullStepAt(uint64_t i) {
  const bool skipped = i % 97 == 5;
  Step step{.step = i,
            .grad_norm = skipped ? std::numeric_limits<double>::infinity()
                                 : NormAt(i, 0),
            .skipped = skipped,
            .loss = 2.0 + 1.0 / (1.0 + i),
            .lr = 3e-4,
            .time_unix_nanos = kStartNanos + static_cast<int64_t>(i) * 1'000'000'000,
            .batch_ids = {static_cast<int64_t>(2 * i), static_cast<int64_t>(2 * i + 1)},
            .layer_stats = {{"attn.0", {.grad_norm = 0.1, .grad_rms = 0.01,
                                        .g_over_sqrt_v_rms = 1.1}}},
            .data_wait_s = 0.05};
  if (i % 2 == 0) step.layer_stats["attn.0"].update_rms_ratio = 1e-3;
  if (i % 3 == 0) step.step_time_s = 0.9;
  if (i % 10 == 0) {
    step.fp8["l0:input"] = {.format = Fp8Format::kE4M3, .amax = 3.5, .scale = 64.0,
                            .amax_history_len = 16, .margin = 1.0,
                            .underflow_fraction = 0.01, .amax_group = "tp0"};
  }
  if (i % 50 == 7) {  // reported, not derived
    step.clipped = false;
    step.clip_coef = 0.5;
  }
  return step;
}

v1::StepRecord FullRecordAt(uint64_t i) {
  const Step step = FullStepAt(i);
  v1::StepRecord r;
  r.set_step(step.step);
  r.set_grad_norm(step.grad_norm);
  r.set_skipped(step.skipped);
  r.set_loss(*step.loss);
  r.set_lr(*step.lr);
  r.set_time_unix_nanos(step.time_unix_nanos);
  for (int64_t id : step.batch_ids) r.add_batch_ids(id);
  v1::LayerStats& layer = (*r.mutable_layer_stats())["attn.0"];
  layer.set_grad_norm(0.1);
  layer.set_grad_rms(0.01);
  layer.set_g_over_sqrt_v_rms(1.1);
  if (i % 2 == 0) layer.set_update_rms_ratio(1e-3);
  r.set_data_wait_s(0.05);
  if (step.step_time_s) r.set_step_time_s(*step.step_time_s);
  if (i % 10 == 0) {
    v1::Fp8TensorStats& f = (*r.mutable_fp8())["l0:input"];
    f.set_format(v1::E4M3);
    f.set_amax(3.5);
    f.set_scale(64.0);
    f.set_amax_history_len(16);
    f.set_margin(1.0);
    f.set_underflow_fraction(0.01);
    f.set_amax_group("tp0");
  }
  if (step.clipped) r.set_clipped(*step.clipped);
  if (step.clip_coef) r.set_clip_coef(*step.clip_coef);
  return r;
}

TEST(IngestIntegration, RecordProtoStoresWhatRecordStoresForTheSameSteps) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  constexpr uint64_t kSteps = 3000;
  for (const std::string run : {"by-step", "by-proto"}) {
    ClientOptions options;
    options.address = server.grpc_address();
    options.run_id = run;
    options.max_norm = 1.0;
    options.measure_locally = false;  // as replay and import run it
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    for (uint64_t i = 0; i < kSteps; ++i) {
      ASSERT_TRUE(run == "by-step" ? (*client)->Record(FullStepAt(i))
                                   : (*client)->RecordProto(FullRecordAt(i)));
    }
    absl::Status closed = (*client)->Close(std::chrono::seconds(60));
    ASSERT_TRUE(closed.ok()) << closed;
  }
  std::map<RunRank, std::vector<v1::StepRecord>> stored =
      ReadStoredRecords(dir.File("tw.db"));
  const std::vector<v1::StepRecord>& by_step = stored[{"by-step", 0}];
  const std::vector<v1::StepRecord>& by_proto = stored[{"by-proto", 0}];
  ASSERT_EQ(by_step.size(), kSteps);
  ASSERT_EQ(by_proto.size(), kSteps);
  uint64_t derived = 0;
  for (uint64_t i = 0; i < kSteps; ++i) {
    ASSERT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
        by_step[i], by_proto[i]))
        << "Record():      " << by_step[i].ShortDebugString() << "\n"
        << "RecordProto(): " << by_proto[i].ShortDebugString();
    if (i % 50 != 7 && by_proto[i].has_clip_coef()) ++derived;
  }
  EXPECT_EQ(by_proto[7].clip_coef(), 0.5);  // reported wins
  EXPECT_GT(derived, kSteps / 2);           // the rest derived from max_norm
}

TEST(IngestIntegration, SigtermAcksWhatArrivedAndExitsZero) {
  TempDir dir;
  auto server = std::make_unique<ServerProcess>(dir.File("tw.db"));
  const int port = server->grpc_port();
  ClientOptions options;
  options.address = server->grpc_address();
  options.run_id = "drain-test";
  options.initial_backoff = std::chrono::milliseconds(20);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  ASSERT_TRUE(client.ok());
  const uint64_t kSteps = 20000;
  for (uint64_t i = 0; i < kSteps / 2; ++i) {
    (*client)->Record({.step = i, .grad_norm = 0.5});
  }
  EXPECT_EQ(server->Terminate(), 0) << "see " << server->log_path();
  uint64_t acked_at_stop = (*client)->Stats().acked;
  StoredCounts stored = CountStored(dir.File("tw.db"), "drain-test");
  // Everything acked is durable.
  EXPECT_GE(stored.records_by_rank[0], static_cast<int64_t>(acked_at_stop));

  server = std::make_unique<ServerProcess>(dir.File("tw.db"), port);
  for (uint64_t i = kSteps / 2; i < kSteps; ++i) {
    (*client)->Record({.step = i, .grad_norm = 0.5});
  }
  ASSERT_TRUE((*client)->Flush(std::chrono::seconds(60)).ok());
  EXPECT_EQ((*client)->Stats().dropped, 0u);
  stored = CountStored(dir.File("tw.db"), "drain-test");
  EXPECT_EQ(stored.records_by_rank[0], static_cast<int64_t>(kSteps));
  EXPECT_EQ(stored.overlapping_chunks, 0);
}


v1::ReportRequest StartMsg(const std::string& run, uint32_t rank, uint32_t world) {
  v1::ReportRequest r;
  r.mutable_start()->set_run_id(run);
  r.mutable_start()->set_rank(rank);
  r.mutable_start()->set_world_size(world);
  return r;
}

v1::ReportRequest BatchMsg(uint64_t seq, uint64_t first, uint64_t n) {
  v1::ReportRequest r;
  r.mutable_batch()->set_seq(seq);
  for (uint64_t i = first; i < first + n; ++i) {
    v1::StepRecord* rec = r.mutable_batch()->add_records();
    rec->set_step(i);
    rec->set_grad_norm(0.5);
  }
  return r;
}

TEST(IngestIntegration, BadInputIsRefusedClearlyAndNothingAcceptedIsLost) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  {
    RawStream s(server.grpc_address());
    s.Send(BatchMsg(1, 0, 3));
    grpc::Status st = s.Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(st.error_message(), HasSubstr("must be a RunStart"));
  }
  {
    RawStream s(server.grpc_address());
    s.Send(StartMsg("r", 4, 4));
    grpc::Status st = s.Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(st.error_message(), HasSubstr("rank 4 is not below world_size 4"));
  }
  {
    RawStream s(server.grpc_address());
    s.Send(StartMsg("bad run id", 0, 1));
    grpc::Status st = s.Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(st.error_message(), HasSubstr("run_id has character 0x20 at position 3"));
  }
  {
    // Two good batches, then one with a bad record: that record is refused
    // alone, the rest of its batch is stored and acked, the stream goes on.
    RawStream s(server.grpc_address());
    s.Send(StartMsg("partial", 0, 1));
    s.Send(BatchMsg(1, 0, 10));
    s.Send(BatchMsg(2, 10, 10));
    v1::ReportRequest bad = BatchMsg(3, 20, 2);
    bad.mutable_batch()->mutable_records(1)->set_clip_coef(7.0);
    s.Send(bad);
    grpc::Status st = s.Finish();
    EXPECT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(s.acked(), 3u);
  }
  // The server still serves: a good replay and the stored partial run.
  std::ofstream(dir.File("ok.jsonl")) << R"({"step": 0, "grad_norm": 0.1})" "\n";
  CommandResult r = RunCommand({BinDir() + "/trainwatchctl", "--server", server.grpc_address(),
                         "replay", "--run", "still-serving", dir.File("ok.jsonl")});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(StepsJson(server.grpc_address(), "partial").size(), 21u);
  std::string metrics = HttpGet(server.metrics_url());
  EXPECT_EQ(MetricValue(metrics, "trainwatch_ingest_rejected_total{reason=\"invalid_argument\"}"), 3);
  EXPECT_EQ(MetricValue(metrics, "trainwatch_ingest_rejected_total{reason=\"invalid_record\"}"), 1);
}

TEST(IngestIntegration, MalformedJsonlLineIsReportedWithItsNumberAndNothingAfterIsSent) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  std::ofstream(dir.File("bad.jsonl")) << R"({"step": 0, "grad_norm": 0.3})" "\n"
                                       << R"({"step": 1, "grad_norm": 0.3})" "\n"
                                       << R"({"step": 2, "grad_norm": oops})" "\n"
                                       << R"({"step": 3, "grad_norm": 0.3})" "\n";
  CommandResult r = RunCommand({BinDir() + "/trainwatchctl", "--server", server.grpc_address(),
                         "replay", "--run", "bad-log", dir.File("bad.jsonl")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("bad.jsonl:3:"));
  json steps = StepsJson(server.grpc_address(), "bad-log");
  ASSERT_TRUE(steps.is_array());
  EXPECT_EQ(steps.size(), 2u) << "lines before the bad one are sent, none after";
}

}  // namespace
}  // namespace trainwatch::testing
