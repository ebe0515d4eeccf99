// The health engine's cost per record: RunHealth::OnRankRecord + OnLeadRecord
// (what the engine calls for a lead-stream record) with every detector, on a
// realistic FP16 stream: lognormal norms (~1% clipped), a constant loss scale,
// attention logit and log Z. Measured in steady state (windows full,
// baselines taken). Then each detector group alone against a no-op sink, with
// the windows updated as RunHealth does.
//
//   build/bin/bench_detectors --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "health/detectors/internal.h"
#include "health/run/run_health.h"
#include "health/timing/run_timing.h"

namespace {

using namespace trainwatch;  // NOLINT: a benchmark file

constexpr size_t kStream = 1 << 16;  // records, cycled with increasing steps

std::vector<v1::StepRecord> Stream() {
  std::mt19937_64 rng(1);
  std::lognormal_distribution<double> norm(std::log(0.5), 0.3);
  std::normal_distribution<double> noise(0.0, 1.0);
  std::vector<v1::StepRecord> out(kStream);
  for (size_t i = 0; i < kStream; ++i) {
    v1::StepRecord& r = out[i];
    const double g = norm(rng);
    r.set_grad_norm(g);
    r.set_clipped(g > 1.0);
    r.set_clip_coef(std::min(1.0, 1.0 / (g + 1e-6)));
    r.set_loss_scale(65536.0);
    r.set_max_attn_logit(30.0 + 0.5 * noise(rng));
    r.set_log_z(2.0 + 0.05 * noise(rng));
    r.set_loss(2.5 + 0.01 * noise(rng));
    r.set_lr(3e-4);
  }
  return out;
}

RunInfo Info() {
  return RunInfo{.run_id = "bench/run",
                 .precision = v1::FP16,
                 .max_norm = 1.0,
                 .warmup_steps = 0,
                 .world_size = 1};
}

void BM_RunHealthAllDetectors(benchmark::State& state) {
  HealthConfig config;
  config.window_steps = static_cast<uint32_t>(state.range(0));
  std::vector<v1::StepRecord> stream = Stream();
  uint64_t transitions = 0;
  RunHealth health(Info(), config,
                   [&transitions](const AlertEpisode&) { ++transitions; },
                   [](const SpikeInfo&) {});
  uint64_t step = 0;
  int64_t now = 1'700'000'000'000'000'000;
  auto feed = [&] {
    v1::StepRecord& r = stream[step % kStream];
    r.set_step(step);
    r.set_time_unix_nanos(now);
    health.OnRankRecord(0, 0, r);
    health.OnLeadRecord(r, now);
    ++step;
    now += 1'000'000;
  };
  // Steady state: windows full and baselines taken.
  while (step < 2ull * config.window_steps + 200) feed();
  for (auto _ : state) feed();
  state.SetItemsProcessed(state.iterations());
  state.counters["alert_transitions"] = static_cast<double>(transitions);
}
BENCHMARK(BM_RunHealthAllDetectors)->Arg(1000)->Arg(10000)->ArgName("W");

// The same with an MoE routing report on every record: `layers` x 128
// experts of global-batch counts (~2M assignments a layer, a healthy skew),
// the balancing and z-loss (0 layers: none, the side-by-side reference).
void BM_RunHealthMoeReport(benchmark::State& state) {
  const int layers = static_cast<int>(state.range(0));
  constexpr int kExperts = 128;
  constexpr size_t kReports = 64;  // distinct reports, cycled
  HealthConfig config;
  std::vector<v1::StepRecord> stream = Stream();
  std::mt19937_64 rng(2);
  std::normal_distribution<double> noise(0.0, 1.0);
  std::vector<v1::MoeStats> reports(kReports);
  for (v1::MoeStats& m : reports) {
    for (int l = 0; l < layers; ++l) {
      v1::MoeLayerStats* layer = m.add_layers();
      layer->set_layer(std::to_string(l));
      for (int e = 0; e < kExperts; ++e) {
        layer->add_tokens_per_expert(
            static_cast<uint64_t>(16384 * std::exp(0.2 * noise(rng))));
      }
      layer->set_aux_loss(1.01 + 0.005 * noise(rng));
      layer->set_z_loss(2.5 + 0.05 * noise(rng));
    }
  }
  RunInfo info = Info();
  v1::MoeConfig moe;
  moe.set_num_experts(kExperts);
  moe.set_top_k(8);
  info.moe = moe;
  RunHealth health(info, config, [](const AlertEpisode&) {}, [](const SpikeInfo&) {});
  uint64_t step = 0;
  int64_t now = 1'700'000'000'000'000'000;
  auto feed = [&] {
    v1::StepRecord& r = stream[step % kStream];
    r.set_step(step);
    r.set_time_unix_nanos(now);
    if (layers > 0) r.mutable_moe()->Swap(&reports[step % kReports]);
    health.OnRankRecord(0, 0, r);
    health.OnLeadRecord(r, now);
    if (layers > 0) r.mutable_moe()->Swap(&reports[step % kReports]);
    ++step;
    now += 1'000'000;
  };
  while (step < 2ull * config.window_steps + 400) feed();
  for (auto _ : state) feed();
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RunHealthMoeReport)->Arg(0)->Arg(8)->Arg(48)->ArgName("layers");

// A sink that only counts calls (the detector's own cost, no tracker).
class NullSink final : public AlertSink {
 public:
  void Condition(AlertKind, uint64_t, bool holds, double,
                 const std::function<AlertText()>&) override {
    calls += holds ? 2 : 1;
  }
  void Event(AlertKind, uint64_t, double, const std::vector<int64_t>&,
             const std::function<AlertText()>&) override {
    ++calls;
  }
  void Spike(const SpikeInfo&) override { ++calls; }
  void Fire(AlertKind, uint64_t, double, AlertText) override { ++calls; }
  void Resolve(AlertKind, uint64_t) override { ++calls; }
  uint64_t calls = 0;
};

enum Group { kNorm = 0, kFp16 = 1, kRanks = 2, kLayers = 3, kWindowsOnly = 4 };

void BM_DetectorGroup(benchmark::State& state) {
  HealthConfig config;
  const RunInfo info = Info();
  Detectors detectors;
  switch (state.range(0)) {
    case kNorm:  // the detectors of the norm, clipping and logits files
      for (auto make : {MakeClipFractionHigh, MakeGradNormSpike, MakeGradNormDrift,
                        MakePostClipNormReported, MakeAttentionLogitGrowth,
                        MakeLogZDrift}) {
        detectors.push_back(make(config));
      }
      state.SetLabel("norm");
      break;
    case kFp16: AddFp16Detectors(config, &detectors); state.SetLabel("fp16"); break;
    case kRanks: AddRankDetectors(config, &detectors); state.SetLabel("ranks"); break;
    case kLayers: AddLayerDetectors(config, &detectors); state.SetLabel("layers"); break;
    default: state.SetLabel("windows only"); break;
  }
  std::vector<v1::StepRecord> stream = Stream();
  RunWindow window(config.window_steps);
  Baselines baselines;
  Trends trends;
  NullSink sink;
  RunTiming timing(config.timing);
  uint64_t step = 0;
  auto feed = [&] {
    v1::StepRecord& r = stream[step % kStream];
    r.set_step(step);
    window.grad_norm.Push(step, r.grad_norm());
    window.clipped.Push(r.clipped());
    window.skipped.Push(r.skipped());
    window.max_attn_logit.Push(step, r.max_attn_logit());
    window.log_z.Push(step, r.log_z());
    if (step + 1 == config.window_steps) {
      baselines.grad_norm_median = window.grad_norm.Median();
      baselines.max_attn_logit_median = window.max_attn_logit.Median();
      baselines.through_step = step;
    }
    const RankRecordContext rctx{.record = r, .rank = 0, .attempt = 0,
                                 .run = info, .config = config};
    const StepContext ctx{.record = r, .run = info, .config = config,
                          .window = window, .baselines = baselines,
                          .trends = trends,
                          .post_warmup = true, .records_seen = step + 1,
                          .timing = timing};
    for (auto& d : detectors) {
      d->OnRankRecord(rctx, sink);
      d->OnStep(ctx, sink);
    }
    ++step;
  };
  while (step < 2ull * config.window_steps + 200) feed();
  for (auto _ : state) feed();
  state.SetItemsProcessed(state.iterations());
  benchmark::DoNotOptimize(sink.calls);
}
BENCHMARK(BM_DetectorGroup)->DenseRange(kNorm, kWindowsOnly)->ArgName("group");

}  // namespace

BENCHMARK_MAIN();
