// Host streams (RunStart.local_ranks): one stream carries a host's ranks,
// and the server treats each rank's records as if its own stream had sent
// them. Metamorphic: the same records of a 16-rank run sent by 16 rank
// streams and by 2 host streams of 8 give the same alerts and the same
// stored rows; and what a host stream may not carry is refused clearly.

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "harness.h"
#include "raw_stream.h"
#include "stored_data.h"
#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace trainwatch::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr uint32_t kRanks = 16;
constexpr uint32_t kPerHost = 8;
constexpr uint64_t kSteps = 700;
constexpr uint32_t kSlowRank = 11;
constexpr uint64_t kSlowFrom = 300;
constexpr int64_t kT0 = 1'790'000'000'000'000'000;

std::string HostOf(uint32_t rank) { return "node-" + std::to_string(rank / kPerHost); }

// Rank `rank`'s record of `step`, the same whichever stream sends it: a
// data-parallel run whose global norm every rank reports, with this rank's
// share of its squares; rank 11 three times slower from step 300; the loss
// 4x for 4 steps at 450 (a spike every rank sees).
Step StepOf(uint64_t step, uint32_t rank) {
  const double x = static_cast<double>(step);
  const double g = 0.5 * std::exp(0.3 * std::sin(0.37 * x) + 0.2 * std::cos(1.3 * x));
  Step s;
  s.step = step;
  s.grad_norm = g;
  s.shard_sq_sum = g * g / kRanks * (1.0 + 0.01 * std::sin(x + rank));
  s.loss = (2.0 + 1.0 / (1.0 + 0.01 * x)) * (step >= 450 && step < 454 ? 4.0 : 1.0);
  s.lr = 3e-4;
  s.batch_ids = {static_cast<int64_t>(step * kRanks + rank)};
  s.time_unix_nanos = kT0 + static_cast<int64_t>(step) * 1'000'000'000;
  double t = 1.0 + 0.02 * std::sin(0.7 * x + rank);
  if (rank == kSlowRank && step >= kSlowFrom) t *= 3.0;
  s.step_time_s = t;
  s.data_wait_s = 0.01;
  return s;
}

ClientOptions OptionsFor(const std::string& address, const std::string& run, uint32_t rank) {
  ClientOptions o;
  o.address = address;
  o.run_id = run;
  o.rank = rank;
  o.world_size = kRanks;
  o.precision = Precision::kBf16;
  o.max_norm = 1.0;
  o.warmup_steps = 50;
  o.host = HostOf(rank);
  o.measure_locally = false;  // the steps carry their own times
  o.labels = {{"model", "tiny"}};
  return o;
}

// Sends the run by one stream a rank (per_stream 1) or by host streams of
// `per_stream` ranks, sent by each host's first rank; all acked.
void SendRun(const std::string& address, const std::string& run, uint32_t per_stream) {
  std::vector<std::unique_ptr<Client>> clients;
  for (uint32_t first = 0; first < kRanks; first += per_stream) {
    ClientOptions o = OptionsFor(address, run, first);
    if (per_stream > 1) {
      for (uint32_t r = first; r < first + per_stream; ++r) o.local_ranks.push_back(r);
    }
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(*std::move(c));
  }
  for (uint64_t step = 0; step < kSteps; ++step) {
    for (uint32_t i = 0; i < clients.size(); ++i) {
      if (per_stream == 1) {
        ASSERT_TRUE(clients[i]->Record(StepOf(step, i)));
        continue;
      }
      std::vector<Step> ranks;
      for (uint32_t r = i * per_stream; r < (i + 1) * per_stream; ++r) {
        ranks.push_back(StepOf(step, r));
        ranks.back().rank = r;
      }
      ASSERT_TRUE(clients[i]->RecordRanks(std::move(ranks)));
    }
  }
  for (auto& c : clients) {
    const absl::Status closed = c->Close(std::chrono::seconds(60));
    ASSERT_TRUE(closed.ok()) << closed;
    EXPECT_EQ(c->Stats().rejected, 0u);
    EXPECT_EQ(c->Stats().dropped, 0u);
  }
}

// The alerts of `run` as (alertname, severity, started_step, rank, host,
// onset_step, state), sorted: what a comparison of two runs may expect equal.
using AlertKey = std::tuple<std::string, std::string, uint64_t, uint32_t, std::string,
                            uint64_t, std::string>;
std::vector<AlertKey> AlertsOf(const std::string& server, const std::string& run) {
  const CommandResult r = RunCommand(
      {BinDir() + "/trainwatchctl", "--server", server, "alerts", "--run", run, "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const json alerts = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  std::vector<AlertKey> out;
  for (const json& a : alerts) {
    out.emplace_back(a.value("alertname", ""), a.value("severity", ""),
                     a.value("started_step", uint64_t{0}), a.value("rank", 0u),
                     a.value("host", ""), a.value("onset_step", uint64_t{0}),
                     a.value("state", ""));
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(HostStreams, GiveTheAlertsAndStoredRowsOfRankStreams) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  SendRun(server.grpc_address(), "by-rank", 1);
  SendRun(server.grpc_address(), "by-host", kPerHost);

  const std::vector<AlertKey> by_rank = AlertsOf(server.grpc_address(), "by-rank");
  const std::vector<AlertKey> by_host = AlertsOf(server.grpc_address(), "by-host");
  EXPECT_EQ(by_rank, by_host);
  // The run's faults were seen at all: the loss spike every rank saw, and
  // the slowed rank named with its host.
  bool straggler = false, spike = false;
  for (const AlertKey& a : by_host) {
    spike |= std::get<0>(a) == "LossSpike";
    if (std::get<0>(a) == "RankStraggler") {
      straggler = true;
      EXPECT_EQ(std::get<3>(a), kSlowRank);
      EXPECT_EQ(std::get<4>(a), HostOf(kSlowRank));
      EXPECT_LE(std::get<2>(a), kSlowFrom + 50);
    }
  }
  EXPECT_TRUE(straggler) << "RankStraggler not raised on the host streams' run";
  EXPECT_TRUE(spike) << "LossSpike not raised on the host streams' run";

  const std::string db = dir.File("tw.db");
  std::map<RunRank, std::vector<v1::StepRecord>> rows = ReadStoredRecords(db);
  std::map<RunRank, v1::RunStart> starts = ReadStoredStarts(db);
  for (uint32_t rank = 0; rank < kRanks; ++rank) {
    SCOPED_TRACE(rank);
    const std::vector<v1::StepRecord>& a = rows[RunRank("by-rank", rank)];
    const std::vector<v1::StepRecord>& b = rows[RunRank("by-host", rank)];
    ASSERT_EQ(a.size(), kSteps);
    ASSERT_EQ(b.size(), kSteps);
    for (uint64_t i = 0; i < kSteps; ++i) {
      ASSERT_TRUE(google::protobuf::util::MessageDifferencer::Equals(a[i], b[i]))
          << "rank stream: " << a[i].ShortDebugString() << "\n"
          << "host stream: " << b[i].ShortDebugString();
    }
    // Each rank's RunStart is the one its own stream would have sent.
    v1::RunStart sa = starts[RunRank("by-rank", rank)];
    v1::RunStart sb = starts[RunRank("by-host", rank)];
    sa.clear_run_id();
    sb.clear_run_id();
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(sa, sb))
        << sa.ShortDebugString() << "\n" << sb.ShortDebugString();
  }
}


v1::ReportRequest HostStart(const std::string& run, uint32_t rank,
                            std::vector<uint32_t> local_ranks) {
  v1::ReportRequest r;
  r.mutable_start()->set_run_id(run);
  r.mutable_start()->set_rank(rank);
  r.mutable_start()->set_world_size(8);
  for (uint32_t l : local_ranks) r.mutable_start()->add_local_ranks(l);
  return r;
}

TEST(HostStreams, WhatAHostStreamMayNotCarryIsRefusedClearly) {
  TempDir dir;
  ServerProcess server(dir.File("tw.db"));
  const struct {
    v1::ReportRequest start;
    std::string message;
  } bad_starts[] = {
      {HostStart("h", 0, {1, 2}), "local_ranks does not list the stream's own rank 0"},
      {HostStart("h", 0, {0, 3, 3}), "local_ranks lists rank 3 twice"},
      {HostStart("h", 0, {0, 8}), "local_ranks[1] = 8 is not below world_size 8"},
  };
  for (const auto& bad : bad_starts) {
    RawStream s(server.grpc_address());
    s.Send(bad.start);
    const grpc::Status st = s.Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.message;
    EXPECT_THAT(st.error_message(), HasSubstr(bad.message));
  }
  // Records without a rank, or of a rank the stream does not carry, are
  // refused alone; the others are stored and the batch acked.
  RawStream s(server.grpc_address());
  s.Send(HostStart("h", 4, {4, 5}));
  v1::ReportRequest batch;
  batch.mutable_batch()->set_seq(1);
  for (uint64_t step = 0; step < 4; ++step) {
    for (int rank : {4, 5, 6, -1}) {
      v1::StepRecord* r = batch.mutable_batch()->add_records();
      r->set_step(step);
      r->set_grad_norm(0.5);
      if (rank >= 0) r->set_rank(static_cast<uint32_t>(rank));
    }
  }
  s.Send(batch);
  ASSERT_TRUE(s.WaitAck(1));
  EXPECT_EQ(s.rejected(), 8u);
  EXPECT_THAT(s.reason(), HasSubstr("rank 6 is not a rank this stream carries"));
  const grpc::Status st = s.Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
  std::map<RunRank, std::vector<v1::StepRecord>> rows = ReadStoredRecords(dir.File("tw.db"));
  EXPECT_EQ(rows[RunRank("h", 4)].size(), 4u);
  EXPECT_EQ(rows[RunRank("h", 5)].size(), 4u);
  EXPECT_EQ(rows.count(RunRank("h", 6)), 0u);
  // A rank's own stream may name its rank, and no other.
  RawStream own(server.grpc_address());
  own.Send(HostStart("h", 7, {}));
  v1::ReportRequest mine;
  mine.mutable_batch()->set_seq(1);
  for (uint32_t rank : {7u, 6u}) {
    v1::StepRecord* r = mine.mutable_batch()->add_records();
    r->set_step(0);
    r->set_grad_norm(0.5);
    r->set_rank(rank);
  }
  own.Send(mine);
  ASSERT_TRUE(own.WaitAck(1));
  EXPECT_EQ(own.rejected(), 1u);
  EXPECT_TRUE(own.Finish().ok());
}

}  // namespace
}  // namespace trainwatch::testing
