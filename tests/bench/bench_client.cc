// trainwatch::Client::Record() of a plain step (no batch ids, no layer
// stats): the cost the training loop pays per optimizer step (budget: <= 100
// ns median, DESIGN.md §8).
//
// The client talks to an in-process fake server that acks every batch as
// soon as it arrives, so the queue drains while Record() is measured (the
// sender thread and the fake server share the machine's cores with the
// measuring thread, as they would in a trainer). Each repetition records a
// fixed number of steps (200,000) into a client whose capacity holds them
// all, so nothing drops even if the sender falls behind; the "dropped"
// counter says if anything did.
//
//   build/bin/bench_client [--record_iterations=200000] --benchmark_repetitions=10 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>

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

void BM_ClientRecord(benchmark::State& state) {
  trainwatch::ClientOptions options;
  options.address = Server().address;
  options.run_id = "bench/client";
  options.max_norm = 1.0;
  // Room for every step of a repetition: nothing drops.
  options.capacity = static_cast<size_t>(g_iterations) + 4096;
  auto client = trainwatch::Client::Create(options);
  if (!client.ok()) {
    state.SkipWithError(std::string(client.status().message()).c_str());
    return;
  }
  uint64_t step = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize((*client)->Record(
        {.step = ++step, .grad_norm = 0.5 + 1e-7 * static_cast<double>(step & 1023)}));
  }
  // The timed loop has ended: closing is not measured.
  const trainwatch::ClientStats stats = (*client)->Stats();
  state.counters["dropped"] = static_cast<double>(stats.dropped);
  (void)(*client)->Close(std::chrono::seconds(10));
  state.counters["acked"] = static_cast<double>((*client)->Stats().acked);
  state.SetItemsProcessed(state.iterations());
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
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
