// Outages: the server goes away while a trainer keeps
// recording. The client buffers (capacity configurable, 100,000 records by
// default) and delivers everything once the server is back; past capacity it
// drops, counts every drop exactly (Stats().dropped), says so on stderr and
// reports the count to the server, which exports it on /metrics. Record()
// returns at once throughout; its latency during the outage is printed here
// (never asserted) and measured by bench_client.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "harness.h"
#include "stored_data.h"
#include "trainwatch/client.h"
#include "eventually.h"

namespace trainwatch::testing {
namespace {

using ::trainwatch::testing::Eventually;

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

double NormAt(uint64_t step) {
  return 0.5 + 0.25 * std::sin(0.01 * static_cast<double>(step));
}

ClientOptions Options(const std::string& address, const std::string& run) {
  ClientOptions options;
  options.address = address;
  options.run_id = run;
  options.max_norm = 1.0;
  options.initial_backoff = std::chrono::milliseconds(20);
  options.max_backoff = std::chrono::milliseconds(200);
  return options;
}

// Times each Record() call, to print what the training loop paid.
class RecordTimer {
 public:
  bool Record(Client& client, Step step) {
    const Clock::time_point t0 = Clock::now();
    const bool accepted = client.Record(std::move(step));
    nanos_.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         Clock::now() - t0)
                         .count());
    return accepted;
  }
  void Print(const char* what) {
    if (nanos_.empty()) return;
    std::sort(nanos_.begin(), nanos_.end());
    auto at = [&](double q) {
      return nanos_[std::min(nanos_.size() - 1,
                             static_cast<size_t>(q * static_cast<double>(nanos_.size())))];
    };
    std::printf("Record() %s: %zu calls, median %lld ns, p99 %lld ns, max %lld ns "
                "(timed one by one, with the clock's own cost)\n",
                what, nanos_.size(), static_cast<long long>(at(0.5)),
                static_cast<long long>(at(0.99)), static_cast<long long>(nanos_.back()));
  }

 private:
  std::vector<int64_t> nanos_;
};

// Sends this process's stderr (where the client logs) to a file while alive.
class StderrCapture {
 public:
  explicit StderrCapture(std::string path) : path_(std::move(path)) {
    std::fflush(stderr);
    saved_ = dup(2);
    const int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
  }
  ~StderrCapture() { Stop(); }

  // Restores stderr and returns what was written to it.
  std::string Stop() {
    if (saved_ >= 0) {
      std::fflush(stderr);
      dup2(saved_, 2);
      close(saved_);
      saved_ = -1;
    }
    std::ifstream in(path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  std::string path_;
  int saved_ = -1;
};

// The stored records of (run, rank 0) are exactly steps [0, n), once each,
// with the grad_norm the trainer recorded.
void ExpectStoredExactly(const std::string& db, const std::string& run, uint64_t n) {
  const auto stored = ReadStoredRecords(db);
  auto it = stored.find({run, 0});
  ASSERT_NE(it, stored.end()) << run;
  EXPECT_EQ(it->second.size(), n);
  std::vector<int> seen(n, 0);
  uint64_t wrong_value = 0, out_of_range = 0;
  for (const v1::StepRecord& r : it->second) {
    if (r.step() >= n) {
      ++out_of_range;
      continue;
    }
    ++seen[r.step()];
    if (r.grad_norm() != NormAt(r.step())) ++wrong_value;
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 0), 0) << "steps missing";
  EXPECT_EQ(std::count_if(seen.begin(), seen.end(), [](int c) { return c > 1; }), 0)
      << "steps stored twice";
  EXPECT_EQ(out_of_range, 0u);
  EXPECT_EQ(wrong_value, 0u);
}

// The server stops (SIGTERM: drained; SIGKILL: died) while the trainer keeps
// recording at 10,000 steps/s, and is back 2 s later on the same port and DB.
class OutageTest : public ::testing::TestWithParam<bool /*sigkill*/> {};

TEST_P(OutageTest, ClientBuffersThroughTheOutageAndDeliversEveryStepOnce) {
  const bool sigkill = GetParam();
  TempDir dir;
  const std::string db = dir.File("tw.db");
  auto server = std::make_unique<ServerProcess>(db);
  const int port = server->grpc_port();
  const std::string run = sigkill ? "outage-kill" : "outage-term";
  ClientOptions options = Options(server->grpc_address(), run);
  EXPECT_EQ(options.capacity, 100000u) << "the documented default";
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();

  constexpr uint64_t kSteps = 30000, kStopAt = 5000, kBackAt = 25000;
  RecordTimer during_outage;
  uint64_t refused = 0, acked_when_back = 0;
  const Clock::time_point t0 = Clock::now();
  for (uint64_t step = 0; step < kSteps; ++step) {
    if (step % 100 == 0) {
      std::this_thread::sleep_until(t0 + std::chrono::microseconds(100 * step));
    }
    if (step == kStopAt) {
      ASSERT_TRUE(Eventually([&] { return (*client)->Stats().acked >= 2000; }));
      if (sigkill) {
        server->Kill();
      } else {
        EXPECT_EQ(server->Terminate(), 0);
      }
    }
    if (step == kBackAt) {
      acked_when_back = (*client)->Stats().acked;
      server = std::make_unique<ServerProcess>(db, port);
      ASSERT_EQ(server->grpc_port(), port);
    }
    Step s{.step = step, .grad_norm = NormAt(step)};
    const bool accepted = step >= kStopAt && step < kBackAt
                              ? during_outage.Record(**client, std::move(s))
                              : (*client)->Record(std::move(s));
    if (!accepted) ++refused;
  }
  during_outage.Print(sigkill ? "while the server was SIGKILLed"
                              : "while the server was stopped (SIGTERM)");
  absl::Status flushed = (*client)->Flush(std::chrono::seconds(60));
  ASSERT_TRUE(flushed.ok()) << flushed;
  const ClientStats stats = (*client)->Stats();
  EXPECT_EQ(refused, 0u);
  EXPECT_EQ(stats.recorded, kSteps);
  EXPECT_EQ(stats.dropped, 0u);
  EXPECT_EQ(stats.acked, kSteps);
  EXPECT_GE(stats.reconnects, 1u);
  // The outage's steps were held by the client, not acknowledged.
  EXPECT_LE(acked_when_back, kStopAt);
  EXPECT_TRUE((*client)->Close().ok());
  EXPECT_EQ(server->Terminate(), 0);
  ExpectStoredExactly(db, run, kSteps);
}

INSTANTIATE_TEST_SUITE_P(StopKinds, OutageTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "Sigkill" : "Sigterm";
                         });

TEST(OutageDropTest, PastCapacityDropsAreCountedExactlyLoggedAndExported) {
  TempDir dir;
  const std::string db = dir.File("tw.db");
  auto server = std::make_unique<ServerProcess>(db);
  const int port = server->grpc_port();
  const std::string run = "outage-drops";
  constexpr size_t kCapacity = 1000;
  ClientOptions options = Options(server->grpc_address(), run);
  options.capacity = kCapacity;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();

  // 500 steps delivered: the buffer is empty when the server dies.
  constexpr uint64_t kBefore = 500, kDuring = 5000;
  for (uint64_t step = 0; step < kBefore; ++step) {
    ASSERT_TRUE((*client)->Record({.step = step, .grad_norm = NormAt(step)}));
  }
  ASSERT_TRUE((*client)->Flush(std::chrono::seconds(30)).ok());
  const uint64_t reconnects = (*client)->Stats().reconnects;
  server->Kill();
  // Once the client has noticed, nothing is in flight: the next kCapacity
  // steps fill the buffer and every later one drops.
  ASSERT_TRUE(Eventually([&] { return (*client)->Stats().reconnects > reconnects; }));

  StderrCapture log(dir.File("client.log"));
  RecordTimer during_outage;
  uint64_t accepted = 0, refused = 0;
  for (uint64_t step = kBefore; step < kBefore + kDuring; ++step) {
    if (during_outage.Record(**client, {.step = step, .grad_norm = NormAt(step)})) {
      ++accepted;
    } else {
      ++refused;
    }
  }
  const uint64_t kDropped = kDuring - kCapacity;
  EXPECT_EQ(accepted, kCapacity);
  EXPECT_EQ(refused, kDropped);
  ClientStats stats = (*client)->Stats();
  EXPECT_EQ(stats.dropped, kDropped);
  EXPECT_EQ(stats.recorded, kBefore + kCapacity);

  server = std::make_unique<ServerProcess>(db, port);
  ASSERT_EQ(server->grpc_port(), port);
  absl::Status flushed = (*client)->Flush(std::chrono::seconds(60));
  const std::string logged = log.Stop();
  std::printf("client log during the outage:\n%s", logged.c_str());
  during_outage.Print("past capacity, while the server was down");
  ASSERT_TRUE(flushed.ok()) << flushed;
  stats = (*client)->Stats();
  EXPECT_EQ(stats.acked, kBefore + kCapacity);
  EXPECT_EQ(stats.dropped, kDropped);

  EXPECT_THAT(logged, HasSubstr("trainwatch: buffer full (1000 records), dropping steps"));
  EXPECT_THAT(logged, HasSubstr("trainwatch: 4000 steps dropped so far (buffer capacity 1000 records)"));

  // The count reached the server with the first batch after the outage.
  const std::string series = "trainwatch_client_dropped_steps_total{run=\"" + run + "\"}";
  double exported = std::nan("");
  EXPECT_TRUE(Eventually([&] {
    exported = MetricValue(HttpGet(server->metrics_url()), series);
    return exported == static_cast<double>(kDropped);
  })) << series << " is " << exported;

  EXPECT_TRUE((*client)->Close().ok());
  EXPECT_EQ(server->Terminate(), 0);
  // Stored: everything recorded but the drops, i.e. steps 0..1499.
  ExpectStoredExactly(db, run, kBefore + kDuring - kDropped);
}

}  // namespace
}  // namespace trainwatch::testing
