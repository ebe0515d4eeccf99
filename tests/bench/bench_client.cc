// trainwatch::Client::Record() of a plain step (no batch ids, no layer
// stats): the cost the training loop pays per optimizer step (budget: <= 100
// ns median, docs/performance.md).
//
// The client talks to an in-process fake server that acks every batch as
// soon as it arrives, so the queue drains while Record() is measured (the
// sender thread and the fake server share the machine's cores with the
// measuring thread, as they would in a trainer). Each repetition records a
// fixed number of steps (200,000) into a client whose capacity holds them
// all, so nothing drops even if the sender falls behind; the "dropped"
// counter says if anything did.
//
// Record() during an outage: the same loop against an address where
// no server listens, so every step is buffered while the sender retries
// (BM_ClientRecordServerDown), and with a 1,024-record buffer, so nearly every
// step drops (BM_ClientRecordServerDownFull). BM_ClientRecordPerCall/outage:N
// times each call on its own (N = 0 live, 1 down, 2 down past capacity) and
// reports median, p99 and max ns per call, clock cost included.
//
//   build/bin/bench_client [--record_iterations=200000] --benchmark_repetitions=10 --benchmark_report_aggregates_only=true
#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace {

// Acks every batch and event as soon as it is read.
class AckingService final : public trainwatch::v1::TrainingHealth::Service {
 public:
  grpc::Status Report(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<trainwatch::v1::ReportResponse,
                               trainwatch::v1::ReportRequest>* stream) override {
    trainwatch::v1::ReportRequest request;
    trainwatch::v1::ReportResponse response;
    while (stream->Read(&request)) {
      if (request.has_batch()) {
        response.set_acked_seq(request.batch().seq());
      } else if (request.has_event()) {
        response.set_acked_seq(request.event().seq());
      } else {
        continue;
      }
      if (!stream->Write(response)) break;
    }
    return grpc::Status::OK;
  }
};

struct Fixture {
  Fixture() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~Fixture() { server->Shutdown(std::chrono::system_clock::now()); }
  AckingService service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

Fixture& Server() {
  static Fixture* fixture = new Fixture();  // lives for the process
  return *fixture;
}

int64_t g_iterations = 200'000;

// An address where nothing listens (a port the kernel just handed out and
// that was closed again): the client sees an outage from its first attempt.
const std::string& NoServerAddress() {
  static const std::string* address = [] {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    close(fd);
    return new std::string("127.0.0.1:" + std::to_string(ntohs(addr.sin_port)));
  }();
  return *address;
}

// Past capacity: the buffer holds this many steps, every later one drops.
constexpr size_t kSmallCapacity = 1024;

struct RecordSetup {
  bool live_server = true;
  // false: room for every step of a repetition (nothing drops).
  bool small_capacity = false;
  // Time each call on its own (steady_clock around it) and report median,
  // p99 and max; the Time column then includes the clock's cost.
  bool time_each_call = false;
  // Each step also asks DueDirectives(step), as a closed-loop hook does
  // before optimizer.step() (docs/closed-loop.md); none is ever due.
  bool due_directives = false;
};

void RecordSteps(benchmark::State& state, RecordSetup setup) {
  trainwatch::ClientOptions options;
  options.address = setup.live_server ? Server().address : NoServerAddress();
  options.run_id = "bench/client";
  options.max_norm = 1.0;
  options.capacity = setup.small_capacity
                         ? kSmallCapacity
                         : static_cast<size_t>(g_iterations) + 4096;
  auto client = trainwatch::Client::Create(options);
  if (!client.ok()) {
    state.SkipWithError(std::string(client.status().message()).c_str());
    return;
  }
  std::vector<int64_t> nanos;
  if (setup.time_each_call) nanos.reserve(static_cast<size_t>(g_iterations));
  uint64_t step = 0;
  for (auto _ : state) {
    trainwatch::Step s{.step = ++step,
                       .grad_norm = 0.5 + 1e-7 * static_cast<double>(step & 1023)};
    if (setup.due_directives) benchmark::DoNotOptimize((*client)->DueDirectives(step));
    if (!setup.time_each_call) {
      benchmark::DoNotOptimize((*client)->Record(std::move(s)));
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize((*client)->Record(std::move(s)));
    nanos.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - t0)
                        .count());
  }
  // The timed loop has ended: closing is not measured.
  const trainwatch::ClientStats stats = (*client)->Stats();
  state.counters["dropped"] = static_cast<double>(stats.dropped);
  if (!nanos.empty()) {
    std::sort(nanos.begin(), nanos.end());
    auto at = [&](double q) {
      return static_cast<double>(nanos[std::min(
          nanos.size() - 1, static_cast<size_t>(q * static_cast<double>(nanos.size())))]);
    };
    state.counters["p50_ns"] = at(0.50);
    state.counters["p99_ns"] = at(0.99);
    state.counters["max_ns"] = static_cast<double>(nanos.back());
  }
  // Against no server, Close() gives up at once rather than after a flush.
  (void)(*client)->Close(setup.live_server ? std::chrono::milliseconds(10000)
                                           : std::chrono::milliseconds(0));
  state.counters["acked"] = static_cast<double>((*client)->Stats().acked);
  state.SetItemsProcessed(state.iterations());
}

// What the training loop pays against a live server that acks everything.
void BM_ClientRecord(benchmark::State& state) { RecordSteps(state, {}); }

// The same with the closed loop's DueDirectives() every step (nothing due):
// the hook's cost beside BM_ClientRecord's, in one run.
void BM_ClientRecordAndDueDirectives(benchmark::State& state) {
  RecordSteps(state, {.due_directives = true});
}

// During an outage (nothing listens at the address; the sender is retrying):
// every step is buffered.
void BM_ClientRecordServerDown(benchmark::State& state) {
  RecordSteps(state, {.live_server = false});
}

// During an outage, past capacity: every step after the first 1,024 drops.
void BM_ClientRecordServerDownFull(benchmark::State& state) {
  RecordSteps(state, {.live_server = false, .small_capacity = true});
}

// The same three, each call timed on its own: median, p99 and max per call.
void BM_ClientRecordPerCall(benchmark::State& state) {
  RecordSteps(state, {.live_server = state.range(0) == 0,
                      .small_capacity = state.range(0) == 2,
                      .time_each_call = true});
}
}  // namespace

// A fixed count below capacity, so nothing drops even if the sender falls
// behind: --record_iterations=N (default 200,000; the ctest smoke run uses
// a small one).
int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--record_iterations=", 0) == 0) {
      g_iterations = std::stoll(a.substr(a.find('=') + 1));
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  benchmark::RegisterBenchmark("BM_ClientRecord", BM_ClientRecord)
      ->Iterations(g_iterations);
  benchmark::RegisterBenchmark("BM_ClientRecordAndDueDirectives",
                               BM_ClientRecordAndDueDirectives)
      ->Iterations(g_iterations);
  benchmark::RegisterBenchmark("BM_ClientRecordServerDown", BM_ClientRecordServerDown)
      ->Iterations(g_iterations);
  benchmark::RegisterBenchmark("BM_ClientRecordServerDownFull",
                               BM_ClientRecordServerDownFull)
      ->Iterations(g_iterations);
  // Arg: 0 live server, 1 server down, 2 server down past capacity.
  benchmark::RegisterBenchmark("BM_ClientRecordPerCall", BM_ClientRecordPerCall)
      ->ArgName("outage")
      ->DenseRange(0, 2)
      ->Iterations(g_iterations);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
