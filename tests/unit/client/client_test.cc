#include "trainwatch/client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto_convert.h"
#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace trainwatch {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using std::chrono::milliseconds;
using std::chrono::seconds;

// A TrainingHealth server that acks every message as soon as it arrives and
// remembers what it saw. `fail` can end a stream with a status instead of
// acking a given (stream index, seq).
class FakeService final : public v1::TrainingHealth::Service {
 public:
  using FailFn = std::function<std::optional<grpc::Status>(int, uint64_t)>;

  grpc::Status Report(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::ReportResponse, v1::ReportRequest>* stream)
      override {
    int index;
    {
      std::lock_guard lock(mu_);
      index = streams_++;
    }
    v1::ReportRequest request;
    if (!stream->Read(&request) || !request.has_start()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no RunStart");
    }
    {
      std::lock_guard lock(mu_);
      starts_.push_back(request.start());
    }
    while (stream->Read(&request)) {
      uint64_t seq = 0;
      if (request.has_batch()) {
        seq = request.batch().seq();
      } else if (request.has_event()) {
        seq = request.event().seq();
      } else {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no payload");
      }
      if (fail_) {
        if (std::optional<grpc::Status> status = fail_(index, seq)) {
          std::lock_guard lock(mu_);
          refused_[seq] = request.batch().records_size();
          return *status;
        }
      }
      v1::ReportResponse response;
      {
        std::lock_guard lock(mu_);
        if (request.has_batch()) {
          dropped_reported_ += request.batch().dropped();
          for (const v1::StepRecord& record : request.batch().records()) {
            ++acked_[record.step()];
            records_[record.step()] = record;
            trace_.push_back("s" + std::to_string(record.step()));
          }
        } else {
          trace_.push_back("e" + std::to_string(request.event().step()));
        }
        response.set_acked_seq(seq);
        if (recommended_) response.set_recommended_max_norm(*recommended_);
      }
      if (!stream->Write(response)) break;
    }
    return grpc::Status::OK;
  }

  void set_fail(FailFn fail) { fail_ = std::move(fail); }
  void set_recommended(double value) {
    std::lock_guard lock(mu_);
    recommended_ = value;
  }

  int streams() {
    std::lock_guard lock(mu_);
    return streams_;
  }
  std::vector<v1::RunStart> starts() {
    std::lock_guard lock(mu_);
    return starts_;
  }
  // Step -> how many times it was acked.
  std::map<uint64_t, int> acked() {
    std::lock_guard lock(mu_);
    return acked_;
  }
  std::map<uint64_t, v1::StepRecord> records() {
    std::lock_guard lock(mu_);
    return records_;
  }
  std::vector<std::string> trace() {
    std::lock_guard lock(mu_);
    return trace_;
  }
  uint64_t dropped_reported() {
    std::lock_guard lock(mu_);
    return dropped_reported_;
  }
  // seq -> records of each message the server refused.
  std::map<uint64_t, int> refused() {
    std::lock_guard lock(mu_);
    return refused_;
  }

 private:
  FailFn fail_;  // set before the client connects
  std::mutex mu_;
  int streams_ = 0;
  std::vector<v1::RunStart> starts_;
  std::map<uint64_t, int> acked_;
  std::map<uint64_t, v1::StepRecord> records_;
  std::vector<std::string> trace_;
  uint64_t dropped_reported_ = 0;
  std::map<uint64_t, int> refused_;
  std::optional<double> recommended_;
};

class ClientTest : public ::testing::Test {
 protected:
  void StartServer() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    address_ = "127.0.0.1:" + std::to_string(port);
  }

  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + seconds(1));
  }

  ClientOptions Options() {
    ClientOptions options;
    options.address = address_;
    options.run_id = "unit/run-1";
    options.max_norm = 1.0;
    options.initial_backoff = milliseconds(10);
    options.max_backoff = milliseconds(100);
    return options;
  }

  std::unique_ptr<Client> MakeClient(const ClientOptions& options) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  FakeService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_ = "127.0.0.1:1";
};

// A TCP socket bound to a free loopback port, listening when `listen_too`.
// Returns the fd; *address gets "127.0.0.1:PORT".
int BindLoopback(bool listen_too, std::string* address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  if (listen_too) {
    EXPECT_EQ(listen(fd, 16), 0);
  }
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  return fd;
}

// A port on which nothing listens: bound once by us, then released.
std::string UnusedAddress() {
  std::string address;
  close(BindLoopback(/*listen_too=*/false, &address));
  return address;
}

// grad_norm cycles through 0, 0.5, 1.0, 1.5: only 1.5 exceeds max_norm 1.0.
double NormOf(uint64_t step) { return 0.5 * static_cast<double>(step % 4); }

TEST_F(ClientTest, DeliversEveryStepOnceWithDerivedClipping) {
  StartServer();
  service_.set_recommended(2.5);
  ClientOptions options = Options();
  options.max_batch_records = 256;
  std::unique_ptr<Client> client = MakeClient(options);
  ASSERT_NE(client, nullptr);

  constexpr uint64_t kSteps = 10000;
  for (uint64_t step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(client->Record({.step = step, .grad_norm = NormOf(step)}));
  }
  ASSERT_TRUE(client->Flush(seconds(20)).ok());

  const ClientStats stats = client->Stats();
  EXPECT_EQ(stats.recorded, kSteps);
  EXPECT_EQ(stats.acked, kSteps);
  EXPECT_EQ(stats.sent, kSteps);
  EXPECT_EQ(stats.dropped, 0u);
  EXPECT_EQ(client->RecommendedMaxNorm(), 2.5);

  const std::map<uint64_t, int> acked = service_.acked();
  ASSERT_EQ(acked.size(), kSteps);
  for (const auto& [step, count] : acked) EXPECT_EQ(count, 1) << step;
  for (const auto& [step, record] : service_.records()) {
    const double norm = NormOf(step);
    EXPECT_EQ(record.grad_norm(), norm);
    ASSERT_TRUE(record.has_clipped() && record.has_clip_coef()) << step;
    // clip_grad_norm_ scales the gradients whenever its coefficient is
    // under 1: at norm == max_norm too (by 1 / (1 + 1e-6)).
    EXPECT_EQ(record.clipped(), 1.0 / (norm + 1e-6) < 1.0) << step;
    EXPECT_DOUBLE_EQ(record.clip_coef(), std::min(1.0, 1.0 / (norm + 1e-6)));
    EXPECT_GT(record.time_unix_nanos(), 0);
  }

  ASSERT_EQ(service_.starts().size(), 1u);
  EXPECT_EQ(service_.starts()[0].run_id(), "unit/run-1");
  EXPECT_EQ(service_.starts()[0].max_norm(), 1.0);
  EXPECT_TRUE(client->Close().ok());
}

TEST_F(ClientTest, ReconnectsAndResendsAfterUnavailable) {
  // The first stream acks seqs 1 and 2, then ends before acking seq 3, as a
  // draining or crashing server would.
  service_.set_fail([](int stream, uint64_t seq) -> std::optional<grpc::Status> {
    if (stream == 0 && seq == 3) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining");
    }
    return std::nullopt;
  });
  StartServer();
  ClientOptions options = Options();
  options.max_batch_records = 100;
  std::unique_ptr<Client> client = MakeClient(options);
  ASSERT_NE(client, nullptr);

  constexpr uint64_t kSteps = 10000;
  for (uint64_t step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(client->Record({.step = step, .grad_norm = NormOf(step)}));
  }
  ASSERT_TRUE(client->Flush(seconds(20)).ok());

  const std::map<uint64_t, int> acked = service_.acked();
  EXPECT_EQ(acked.size(), kSteps);
  EXPECT_EQ(acked.begin()->first, 0u);
  EXPECT_EQ(acked.rbegin()->first, kSteps - 1);
  const ClientStats stats = client->Stats();
  EXPECT_EQ(stats.dropped, 0u);
  EXPECT_EQ(stats.acked, kSteps);
  EXPECT_GE(stats.sent, kSteps);
  EXPECT_GE(stats.reconnects, 1u);
  EXPECT_GE(service_.streams(), 2);
  // Every stream, the resumed one included, began with the RunStart.
  EXPECT_EQ(service_.starts().size(), static_cast<size_t>(service_.streams()));
}

TEST_F(ClientTest, DropsBatchTheServerRefusesAndReportsTheDrop) {
  service_.set_fail([](int stream, uint64_t seq) -> std::optional<grpc::Status> {
    if (stream == 0 && seq == 2) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad batch");
    }
    return std::nullopt;
  });
  StartServer();
  ClientOptions options = Options();
  options.max_batch_records = 10;
  std::unique_ptr<Client> client = MakeClient(options);
  ASSERT_NE(client, nullptr);

  for (uint64_t step = 0; step < 100; ++step) {
    ASSERT_TRUE(client->Record({.step = step, .grad_norm = 0.5}));
  }
  // The refused batch counts as resolved, so the flush completes.
  ASSERT_TRUE(client->Flush(seconds(20)).ok());
  const std::map<uint64_t, int> refused = service_.refused();
  ASSERT_EQ(refused.size(), 1u);
  const uint64_t lost = refused.at(2);
  ASSERT_GT(lost, 0u);
  EXPECT_EQ(client->Stats().dropped, lost);
  EXPECT_EQ(service_.acked().size(), 100 - lost);

  // The next batch tells the server about the loss.
  ASSERT_TRUE(client->Record({.step = 100, .grad_norm = 0.5}));
  ASSERT_TRUE(client->Flush(seconds(20)).ok());
  EXPECT_EQ(service_.dropped_reported(), lost);
  EXPECT_EQ(client->Stats().acked, 101 - lost);
}

TEST_F(ClientTest, EventsKeepTheirPlaceAmongSteps) {
  StartServer();
  std::unique_ptr<Client> client = MakeClient(Options());
  ASSERT_NE(client, nullptr);
  std::vector<std::string> expected;
  for (uint64_t step = 1; step <= 5; ++step) {
    ASSERT_TRUE(client->Record({.step = step}));
    expected.push_back("s" + std::to_string(step));
  }
  ASSERT_TRUE(client->RecordEvent(EventKind::kCheckpointSaved, 5, "ckpt-5"));
  expected.push_back("e5");
  for (uint64_t step = 6; step <= 10; ++step) {
    ASSERT_TRUE(client->Record({.step = step}));
    expected.push_back("s" + std::to_string(step));
  }
  ASSERT_TRUE(client->RecordEvent(EventKind::kRunFinished, 10));
  expected.push_back("e10");
  // Close flushes, events included.
  ASSERT_TRUE(client->Close(seconds(20)).ok());
  EXPECT_THAT(service_.trace(), ElementsAreArray(expected));
}

TEST_F(ClientTest, DropsBeyondCapacityWhileServerIsUnreachable) {
  ClientOptions options = Options();
  options.address = UnusedAddress();
  options.capacity = 100;
  std::unique_ptr<Client> client = MakeClient(options);
  ASSERT_NE(client, nullptr);

  for (uint64_t step = 0; step < 1000; ++step) {
    EXPECT_EQ(client->Record({.step = step, .grad_norm = 1.0}), step < 100)
        << step;
  }
  EXPECT_FALSE(client->RecordEvent(EventKind::kRunFinished, 999));
  ClientStats stats = client->Stats();
  EXPECT_EQ(stats.recorded, 100u);
  EXPECT_EQ(stats.dropped, 900u);
  EXPECT_EQ(stats.acked, 0u);

  const absl::Status flush = client->Flush(milliseconds(50));
  EXPECT_EQ(flush.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(flush.message()), HasSubstr("0 of 100"));
  // Close during the outage gives up after its timeout.
  EXPECT_EQ(client->Close(milliseconds(100)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(client->Close(milliseconds(100)).code(),
            absl::StatusCode::kDeadlineExceeded);  // idempotent
  EXPECT_FALSE(client->Record({.step = 1000}));
}

TEST_F(ClientTest, CloseDoesNotHangOnAServerThatNeverAnswers) {
  // Listening but never accepting: the TCP connect succeeds and the stream
  // then waits forever, as with a hung server.
  ClientOptions options = Options();
  const int fd = BindLoopback(/*listen_too=*/true, &options.address);
  std::unique_ptr<Client> client = MakeClient(options);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Record({.step = 1}));

  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(client->Close(milliseconds(200)).code(),
            absl::StatusCode::kDeadlineExceeded);
  // Generous: without cancelling the stream Close() would wait for gRPC's
  // 20 s connect timeout or forever.
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(5));
  close(fd);
}

TEST_F(ClientTest, FlushWithNothingRecordedSucceeds) {
  StartServer();
  std::unique_ptr<Client> client = MakeClient(Options());
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->Flush(milliseconds(1)).ok());
}

TEST_F(ClientTest, MeasuresStepTimeAndNamesItsHost) {
  StartServer();
  std::unique_ptr<Client> client = MakeClient(Options());
  ASSERT_NE(client, nullptr);
  constexpr int64_t kSecond = 1'000'000'000;
  // Times given: each step's time is the gap to the previous step's.
  ASSERT_TRUE(client->Record({.step = 1, .time_unix_nanos = 10 * kSecond}));
  ASSERT_TRUE(client->Record({.step = 2, .time_unix_nanos = 12 * kSecond}));
  // A time the loop measured itself wins.
  ASSERT_TRUE(client->Record(
      {.step = 3, .time_unix_nanos = 15 * kSecond, .step_time_s = 0.5}));
  ASSERT_TRUE(client->Record({.step = 4, .time_unix_nanos = 16 * kSecond,
                              .data_wait_s = 0.25}));
  ASSERT_TRUE(client->Flush(seconds(10)).ok());
  const std::map<uint64_t, v1::StepRecord> records = service_.records();
  ASSERT_EQ(records.size(), 4u);
  EXPECT_FALSE(records.at(1).has_step_time_s());  // nothing before it
  EXPECT_DOUBLE_EQ(records.at(2).step_time_s(), 2.0);
  EXPECT_DOUBLE_EQ(records.at(3).step_time_s(), 0.5);
  EXPECT_DOUBLE_EQ(records.at(4).step_time_s(), 1.0);
  EXPECT_EQ(records.at(4).data_wait_s(), 0.25);
  EXPECT_FALSE(records.at(2).has_data_wait_s());

  char name[256] = {};
  ASSERT_EQ(gethostname(name, sizeof(name) - 1), 0);
  ASSERT_EQ(service_.starts().size(), 1u);
  EXPECT_EQ(service_.starts()[0].host(), std::string(name));
  EXPECT_FALSE(service_.starts()[0].host().empty());
}

TEST_F(ClientTest, ReplayModeMeasuresNothingLocally) {
  StartServer();
  ClientOptions options = Options();
  options.measure_locally = false;
  std::unique_ptr<Client> client = MakeClient(options);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Record({.step = 1}));
  ASSERT_TRUE(client->Record({.step = 2}));
  ASSERT_TRUE(client->Flush(seconds(10)).ok());
  for (const auto& [step, record] : service_.records()) {
    EXPECT_FALSE(record.has_step_time_s()) << step;
  }
  ASSERT_EQ(service_.starts().size(), 1u);
  EXPECT_EQ(service_.starts()[0].host(), "");

  ClientOptions named = Options();
  named.host = "gpu-node-3";
  std::unique_ptr<Client> second = MakeClient(named);
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(second->Record({.step = 3}));
  ASSERT_TRUE(second->Flush(seconds(10)).ok());
  ASSERT_EQ(service_.starts().size(), 2u);
  EXPECT_EQ(service_.starts()[1].host(), "gpu-node-3");
}

TEST_F(ClientTest, RecordProtoSendsWhatRecordSendsForTheSameStep) {
  StartServer();
  constexpr int64_t kSecond = 1'000'000'000;
  const double inf = std::numeric_limits<double>::infinity();
  // What a step carries, and what is left for the client to fill: a time of
  // 0 (step 1), step times to measure (3) or given (4), clipping to derive
  // (1, 2, 3) or reported (4), an infinite norm (2).
  const std::vector<Step> steps = {
      {.step = 1,
       .grad_norm = 4.0,
       .loss_scale = 1024.0,
       .loss = 2.5,
       .batch_ids = {7, 8},
       .layer_stats = {{"attn.0", {0.1, 0.01, 1.2}},
                       {"mlp.0", {0.2, 0.02, 0.9, 1e-3}}},
       .fp8 = {{"l0:input", {.format = Fp8Format::kE4M3, .amax = 3.5,
                             .scale = 64.0, .underflow_fraction = 0.01}},
               {"l0:grad", {.format = Fp8Format::kE5M2, .amax = 1.5}}}},
      {.step = 2, .grad_norm = inf, .skipped = true, .time_unix_nanos = 10 * kSecond},
      {.step = 3, .grad_norm = 0.5, .lr = 3e-4, .time_unix_nanos = 12 * kSecond},
      {.step = 4,
       .grad_norm = 2.0,
       .clipped = false,
       .clip_coef = 0.75,
       .time_unix_nanos = 15 * kSecond,
       .step_time_s = 0.5,
       .data_wait_s = 0.25},
  };
  // Each path on a client of its own, so each measures step times afresh.
  auto send = [&](bool as_proto) {
    std::unique_ptr<Client> client = MakeClient(Options());
    EXPECT_NE(client, nullptr);
    if (client == nullptr) return std::map<uint64_t, v1::StepRecord>();
    for (const Step& step : steps) {
      v1::StepRecord record;
      internal::FillStepRecord(step, /*max_norm=*/0.0, &record);  // as given
      EXPECT_TRUE(as_proto ? client->RecordProto(record) : client->Record(step));
    }
    EXPECT_TRUE(client->Close(seconds(10)).ok());
    return service_.records();
  };
  std::map<uint64_t, v1::StepRecord> by_step = send(/*as_proto=*/false);
  std::map<uint64_t, v1::StepRecord> by_proto = send(/*as_proto=*/true);
  ASSERT_EQ(by_step.size(), steps.size());
  ASSERT_EQ(by_proto.size(), steps.size());
  // Step 1's time is each call's own "now".
  EXPECT_GT(by_step.at(1).time_unix_nanos(), 0);
  EXPECT_GT(by_proto.at(1).time_unix_nanos(), 0);
  by_proto.at(1).set_time_unix_nanos(by_step.at(1).time_unix_nanos());
  EXPECT_TRUE(by_step.at(1).has_clip_coef());
  EXPECT_DOUBLE_EQ(by_step.at(3).step_time_s(), 2.0);
  for (const auto& [step, record] : by_step) {
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
        record, by_proto.at(step)))
        << "Record():      " << record.ShortDebugString() << "\n"
        << "RecordProto(): " << by_proto.at(step).ShortDebugString();
  }
}

// A step of -1 read as unsigned never reaches a batch: Record() refuses it
// and counts it, and its neighbours are delivered.
TEST_F(ClientTest, RefusesAStepAbove2To63AtRecordAndCountsIt) {
  StartServer();
  std::unique_ptr<Client> client = MakeClient(Options());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Record({.step = 0, .grad_norm = 0.5}));
  EXPECT_FALSE(client->Record({.step = kMaxStep + 1, .grad_norm = 0.5}));
  v1::StepRecord wire;
  wire.set_step(std::numeric_limits<uint64_t>::max());
  EXPECT_FALSE(client->RecordProto(wire));
  ASSERT_TRUE(client->Record({.step = 1, .grad_norm = 0.5}));
  ASSERT_TRUE(client->Flush(seconds(20)).ok());
  const ClientStats stats = client->Stats();
  EXPECT_EQ(stats.rejected, 2u);
  EXPECT_EQ(stats.dropped, 0u);
  EXPECT_EQ(stats.acked, 2u);
  EXPECT_EQ(service_.acked().size(), 2u);
}

// A one-shot command over a quota gives up at once with the server's
// reason; a trainer keeps its data and retries.
TEST_F(ClientTest, AQuotaRefusalEndsAFailFastFlushAtOnceAndATrainerRetries) {
  // The next `quota_refusals` batches are refused as over a quota.
  auto quota_refusals = std::make_shared<std::atomic<int>>(1 << 20);
  service_.set_fail([quota_refusals](int, uint64_t) -> std::optional<grpc::Status> {
    if (quota_refusals->fetch_sub(1) > 0) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "this token already has 5 active runs, its runs:5 quota");
    }
    return std::nullopt;
  });
  StartServer();
  {
    ClientOptions options = Options();
    options.fail_fast = true;
    std::unique_ptr<Client> client = MakeClient(options);
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(client->Record({.step = 0, .grad_norm = 0.5}));
    const auto start = std::chrono::steady_clock::now();
    const absl::Status s = client->Flush(seconds(60));
    EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(30));
    EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("runs:5 quota"));
  }
  // A trainer keeps its data through three refusals and delivers it after.
  quota_refusals->store(3);
  std::unique_ptr<Client> client = MakeClient(Options());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Record({.step = 0, .grad_norm = 0.5}));
  EXPECT_TRUE(client->Flush(seconds(60)).ok());
  EXPECT_EQ(client->Stats().acked, 1u);
  EXPECT_LE(quota_refusals->load(), 0);
  EXPECT_GE(client->Stats().reconnects, 3u);
}

}  // namespace
}  // namespace trainwatch
