// OrderStatWindow and FlagWindow: the per-step cost of the engine's windows.
//
//   build/bin/bench_window --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "health/signals/window.h"

namespace {

using trainwatch::FlagWindow;
using trainwatch::OrderStatWindow;

// A lognormal stream of gradient norms (median 1, sigma 0.3).
std::vector<double> Norms(size_t n) {
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> dist(0.0, 0.3);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

constexpr size_t kStream = 1 << 16;

// A full window: each iteration pushes one value (evicting the oldest).
void BM_OrderStatWindowPush(benchmark::State& state) {
  const size_t w = static_cast<size_t>(state.range(0));
  const std::vector<double> norms = Norms(kStream);
  OrderStatWindow window(w);
  uint64_t step = 0;
  for (; step < w; ++step) window.Push(step, norms[step % kStream]);
  for (auto _ : state) {
    window.Push(step, norms[step % kStream]);
    ++step;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_OrderStatWindowPush)->Arg(1000)->Arg(10000);

// Quantiles of a full window (no push).
void BM_OrderStatWindowQuantile(benchmark::State& state) {
  const size_t w = static_cast<size_t>(state.range(0));
  const double q = static_cast<double>(state.range(1)) / 100.0;
  const std::vector<double> norms = Norms(kStream);
  OrderStatWindow window(w);
  for (uint64_t step = 0; step < w; ++step) window.Push(step, norms[step]);
  for (auto _ : state) {
    benchmark::DoNotOptimize(window.Quantile(q));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_OrderStatWindowQuantile)
    ->ArgsProduct({{1000, 10000}, {50, 90, 99}})
    ->ArgNames({"W", "q%"});

// What one post-warmup step costs the norm window as the engine uses it:
// one push, then p50, p90 and p99.
void BM_OrderStatWindowPushAndQuantiles(benchmark::State& state) {
  const size_t w = static_cast<size_t>(state.range(0));
  const std::vector<double> norms = Norms(kStream);
  OrderStatWindow window(w);
  uint64_t step = 0;
  for (; step < w; ++step) window.Push(step, norms[step % kStream]);
  for (auto _ : state) {
    window.Push(step, norms[step % kStream]);
    ++step;
    benchmark::DoNotOptimize(window.Quantile(0.5));
    benchmark::DoNotOptimize(window.Quantile(0.9));
    benchmark::DoNotOptimize(window.Quantile(0.99));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_OrderStatWindowPushAndQuantiles)->Arg(1000)->Arg(10000);

void BM_FlagWindowPush(benchmark::State& state) {
  const size_t w = static_cast<size_t>(state.range(0));
  FlagWindow window(w);
  uint64_t step = 0;
  for (; step < w; ++step) window.Push(step, step % 17 == 0);
  for (auto _ : state) {
    window.Push(step, step % 17 == 0);
    ++step;
    benchmark::DoNotOptimize(window.fraction());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_FlagWindowPush)->Arg(1000)->Arg(10000);

}  // namespace

BENCHMARK_MAIN();
