// Parsing and serializing a StepBatch of 1,024 realistic records (what the
// server's Report reactor parses per batch), and the wire budget's check
// that comes before the parse.
//
//   build/bin/bench_proto --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "google/protobuf/arena.h"

#include "ingest/wire_budget.h"
#include "test_records.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace {

// `n` records with the fields a bf16/fp16 trainer sends (no layer stats).
trainwatch::v1::StepBatch MakeBatch(int n, bool batch_ids) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> norm(0.0, 0.3);
  trainwatch::v1::StepBatch batch;
  batch.set_seq(12345);
  for (int i = 0; i < n; ++i) {
    trainwatch::v1::StepRecord* r = batch.add_records();
    const double g = norm(rng);
    r->set_step(100000 + i);
    r->set_grad_norm(g);
    r->set_clipped(g > 1.0);
    r->set_clip_coef(g > 1.0 ? 1.0 / (g + 1e-6) : 1.0);
    r->set_loss_scale(65536.0);
    r->set_max_attn_logit(30.0 + norm(rng));
    r->set_log_z(2.0 + 0.1 * norm(rng));
    r->set_loss(2.5 + 0.01 * norm(rng));
    r->set_lr(3e-4);
    r->set_time_unix_nanos(1'700'000'000'000'000'000 + i * 1'000'000LL);
    if (batch_ids) r->add_batch_ids(i * 8);
  }
  return batch;
}

void BM_ParseStepBatch(benchmark::State& state) {
  const std::string wire =
      MakeBatch(static_cast<int>(state.range(0)), state.range(1) != 0)
          .SerializeAsString();
  trainwatch::v1::StepBatch batch;
  for (auto _ : state) {
    if (!batch.ParseFromString(wire)) state.SkipWithError("parse failed");
    benchmark::DoNotOptimize(batch);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(wire.size()));
  state.counters["wire_bytes"] = static_cast<double>(wire.size());
}
BENCHMARK(BM_ParseStepBatch)
    ->Args({1024, 0})
    ->Args({1024, 1})
    ->ArgNames({"records", "batch_ids"});

// What ingest adds before each parse: the ReportRequest's cost judged on
// its bytes (WireBudget). Compare with BM_ParseStepBatch in the same run.
void BM_WireBudgetCheck(benchmark::State& state) {
  trainwatch::v1::ReportRequest request;
  *request.mutable_batch() =
      MakeBatch(static_cast<int>(state.range(0)), state.range(1) != 0);
  const std::string wire = request.SerializeAsString();
  const trainwatch::WireBudget budget{trainwatch::ValidationLimits{}};
  for (auto _ : state) {
    if (!budget.Check(wire).ok()) state.SkipWithError("refused");
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_WireBudgetCheck)
    ->Args({1024, 0})
    ->Args({1024, 1})
    ->ArgNames({"records", "batch_ids"});

// A batch of `n` records, each with a 48-layer x 128-expert MoE report as a
// trainer sends it (testing::RealisticMoe, as bench_store's MoeChunkRecords,
// its layers named as Megatron's routers, no aux loss), parsed as ingest
// parses it: a ReportRequest on an arena of its own. The counts are ~3-byte
// varints.
void BM_ParseMoeBatch(benchmark::State& state) {
  constexpr int kLayers = 48, kExperts = 128;
  const int n = static_cast<int>(state.range(0));
  trainwatch::v1::ReportRequest request;
  *request.mutable_batch() = MakeBatch(n, false);
  trainwatch::testing::RealisticMoe counts(5, kLayers, kExperts);
  for (trainwatch::v1::StepRecord& r : *request.mutable_batch()->mutable_records()) {
    counts.AddTo(r, "layers.", ".mlp.router", /*aux_loss=*/false);
  }
  const std::string wire = request.SerializeAsString();
  for (auto _ : state) {
    google::protobuf::Arena arena;
    auto* parsed = google::protobuf::Arena::CreateMessage<trainwatch::v1::ReportRequest>(&arena);
    if (!parsed->ParseFromString(wire)) state.SkipWithError("parse failed");
    benchmark::DoNotOptimize(parsed);
  }
  state.SetItemsProcessed(state.iterations() * n * kLayers * kExperts);  // counts
  state.counters["wire_bytes"] = static_cast<double>(wire.size());
}
BENCHMARK(BM_ParseMoeBatch)->Arg(16)->ArgName("records");

void BM_SerializeStepBatch(benchmark::State& state) {
  const trainwatch::v1::StepBatch batch =
      MakeBatch(static_cast<int>(state.range(0)), false);
  std::string wire;
  for (auto _ : state) {
    wire.clear();
    batch.SerializeToString(&wire);
    benchmark::DoNotOptimize(wire);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_SerializeStepBatch)->Arg(1024);

}  // namespace

BENCHMARK_MAIN();
