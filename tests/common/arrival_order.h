// The same multi-rank records in any arrival order: a synthetic DDP run with
// a loss spike, per-shard clipping, a double-counted shard and a straggler,
// fed through the real RunPipeline by a schedule (which rank sends how many
// of its next records as one batch), and the run's verdict as text.
// arrival_order_test and arrival_order_fuzzer require every schedule to give
// the verdict of every other (docs/architecture.md, "Arrival order").
//
// Header-only: the fuzz build compiles only tests/fuzz.
#ifndef TRAINWATCH_TESTS_COMMON_ARRIVAL_ORDER_H_
#define TRAINWATCH_TESTS_COMMON_ARRIVAL_ORDER_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "health/alert_catalog.h"
#include "health/run/run_pipeline.h"
#include "trainwatch/v1/alert_names.h"

namespace trainwatch::arrival {

// Where the run's faults are.
struct RunShape {
  uint32_t world = 4;
  uint64_t steps = 3000;
  uint64_t seed = 1;
  uint64_t spike_step = 1500;      // loss x2.5 on every rank for 20 steps
  uint64_t mismatch_from = 800;    // rank 2 clips with its local norm ...
  uint64_t mismatch_to = 1100;     // ... until here
  uint64_t shard_from = 2400;      // rank 1 counts its shard twice ...
  uint64_t shard_to = 2600;        // ... until here
  uint64_t slow_from = 2000;       // the last rank 1.35x slower from here
};

struct RankedRun {
  RunShape shape;
  std::vector<v1::RunStart> starts;                 // by rank
  std::vector<std::vector<v1::StepRecord>> records;  // by rank, in step order
};

inline RankedRun MakeRun(const RunShape& shape) {
  RankedRun run{.shape = shape};
  std::mt19937_64 rng(shape.seed);
  std::lognormal_distribution<double> norm_noise(std::log(0.4), 0.25);
  std::normal_distribution<double> loss_noise(0.0, 0.02);
  std::uniform_real_distribution<double> share(0.5, 1.5), jitter(0.95, 1.05);
  const uint32_t n = shape.world;
  for (uint32_t rank = 0; rank < n; ++rank) {
    v1::RunStart s;
    s.set_run_id("arrival");
    s.set_rank(rank);
    s.set_world_size(n);
    s.set_precision(v1::BF16);
    s.set_max_norm(1.0);
    s.set_warmup_steps(100);
    s.set_host(absl::StrFormat("node-%d", rank / 2));
    run.starts.push_back(s);
  }
  run.records.resize(n);
  for (uint64_t step = 0; step < shape.steps; ++step) {
    const bool spike = step >= shape.spike_step && step < shape.spike_step + 20;
    double norm = norm_noise(rng) * (step == shape.spike_step ? 8.0 : 1.0);
    const double level = 2.0 + 3.0 * std::exp(-static_cast<double>(step) / 5000.0);
    std::vector<double> shares(n);
    double total = 0;
    for (double& x : shares) total += (x = share(rng));
    for (uint32_t rank = 0; rank < n; ++rank) {
      v1::StepRecord r;
      r.set_step(step);
      double rank_norm = norm;
      if (rank == 2 && step >= shape.mismatch_from && step < shape.mismatch_to) {
        rank_norm = norm * 0.7;  // its local shard's norm
      }
      r.set_grad_norm(rank_norm);
      r.set_clipped(rank_norm > 1.0);
      r.set_clip_coef(std::min(1.0, 1.0 / (rank_norm + 1e-6)));
      double sq = norm * norm * shares[rank] / total;
      if (rank == 1 && step >= shape.shard_from && step < shape.shard_to) sq *= 2;
      r.set_shard_sq_sum(sq);
      r.set_loss((level + loss_noise(rng)) * (spike ? 2.5 : 1.0));
      r.set_lr(3e-4);
      const bool slow = rank == n - 1 && step >= shape.slow_from;
      r.set_step_time_s(jitter(rng) * (slow ? 1.35 : 1.0));
      r.set_data_wait_s(0.01);
      r.set_time_unix_nanos(1'700'000'000'000'000'000 +
                            static_cast<int64_t>(step) * 1'000'000'000);
      r.add_batch_ids(static_cast<int64_t>(step * n + rank));
      run.records[rank].push_back(std::move(r));
    }
  }
  return run;
}

// Which rank sends how many of its next records as one batch. A rank with
// fewer left sends what it has.
using Schedule = std::vector<std::pair<uint32_t, uint32_t>>;

// Every rank at once: rounds of `batch` records from each rank in turn.
inline Schedule RoundRobin(const RankedRun& run, uint32_t batch) {
  Schedule out;
  for (uint64_t sent = 0; sent < run.shape.steps; sent += batch) {
    for (uint32_t rank = 0; rank < run.shape.world; ++rank) out.push_back({rank, batch});
  }
  return out;
}

// One rank after another, in `order`, each in batches of `batch`.
inline Schedule OneAfterAnother(const RankedRun& run, const std::vector<uint32_t>& order,
                                uint32_t batch) {
  Schedule out;
  for (uint32_t rank : order) {
    for (uint64_t sent = 0; sent < run.shape.steps; sent += batch) out.push_back({rank, batch});
  }
  return out;
}

// Random ranks and heavy-tailed batch sizes (1 to ~2,000).
inline Schedule Shuffled(const RankedRun& run, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> left(run.shape.world, run.shape.steps);
  Schedule out;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (;;) {
    std::vector<uint32_t> ranks;
    for (uint32_t r = 0; r < left.size(); ++r) {
      if (left[r] > 0) ranks.push_back(r);
    }
    if (ranks.empty()) return out;
    const uint32_t rank = ranks[rng() % ranks.size()];
    const auto n = static_cast<uint32_t>(
        std::min<double>(2000.0, std::floor(1.0 / std::max(u(rng), 5e-4))));
    const uint32_t take = static_cast<uint32_t>(std::min<uint64_t>(n, left[rank]));
    left[rank] -= take;
    out.push_back({rank, take});
  }
}

// `late` sends nothing until the others are `lag` steps ahead, then all go
// on in rounds: it stays `lag` steps behind to the end.
inline Schedule Lagging(const RankedRun& run, uint32_t late, uint64_t lag, uint32_t batch) {
  Schedule out;
  for (uint64_t sent = 0; sent < run.shape.steps + lag; sent += batch) {
    for (uint32_t rank = 0; rank < run.shape.world; ++rank) {
      if (rank == late ? sent >= lag : sent < run.shape.steps) out.push_back({rank, batch});
    }
  }
  return out;
}

// What the run said: every alert transition as a line (name, fire /
// resolve / cause found, steps, rank and host, text), and the spikes,
// sorted: the lead's and the cross-rank alerts interleave differently in
// time under different arrival orders, their content must not differ.
struct Verdict {
  std::vector<std::string> lines;
  uint64_t lead_window_slots = 0;

  std::vector<std::string> Fired(std::string_view name) const {
    std::vector<std::string> out;
    for (const std::string& l : lines) {
      if (l.rfind(std::string(name) + " fire ", 0) == 0) out.push_back(l);
    }
    return out;
  }
};

class Recorder final : public RunObserver {
 public:
  void OnAlert(AlertKind kind, const v1::Alert& a, bool update) override {
    const std::string_view name = Spec(kind).name;
    if (update) {
      lines.push_back(absl::StrFormat("%s update started=%d caused_by=%s text=%s",
                                      name, a.started_step(), a.caused_by(),
                                      a.description()));
    } else if (v1::Firing(a)) {
      lines.push_back(absl::StrFormat(
          "%s fire started=%d onset=%d rank=%d host=%s caused_by=%s text=%s | %s",
          name, a.started_step(), a.onset_step(), a.rank(), a.host(),
          a.caused_by(), a.summary(), a.description()));
    } else {
      lines.push_back(absl::StrFormat("%s resolve started=%d resolved=%d peak=%.9g",
                                      name, a.started_step(), a.resolved_step(),
                                      a.peak_value()));
    }
  }
  void OnSpike(const SpikeInfo& s) override {
    lines.push_back(absl::StrFormat("spike step=%d", s.step));
  }
  void OnLeadChanged(const v1::RunStart&) override {}
  void OnLeadRecord(const v1::StepRecord&) override {}
  void OnRecordsAccepted(size_t, uint64_t) override {}
  void OnLeadBatchDone(const v1::StepRecord&, int64_t) override {}
  void OnWindows(const RunHealth&) override {}

  std::vector<std::string> lines;
};

// Feeds `run` to a fresh RunPipeline in the order `schedule` says, a
// millisecond apart, then lets the engine's timer declare the silent ranks
// missing (as it would once the streams stop), and returns the verdict.
inline Verdict Replay(const RankedRun& run, const Schedule& schedule,
                      const HealthConfig& config) {
  Recorder seen;
  int64_t now = 1'700'000'000'000'000'000;
  RunPipeline pipeline("arrival", config, &seen, now);
  for (uint32_t rank = 0; rank < run.shape.world; ++rank) {
    pipeline.OnStreamStarted(rank, 0, std::nullopt);
  }
  std::vector<size_t> next(run.shape.world, 0);
  google::protobuf::RepeatedPtrField<v1::StepRecord> batch;
  for (const auto& [rank, count] : schedule) {
    const std::vector<v1::StepRecord>& all = run.records[rank];
    batch.Clear();
    for (uint32_t i = 0; i < count && next[rank] < all.size(); ++i) {
      *batch.Add() = all[next[rank]++];
    }
    if (batch.empty()) continue;
    pipeline.OnBatch(run.starts[rank], batch, 0, now += 1'000'000);
  }
  // What a schedule left unsent is sent at the end, in rank order.
  for (uint32_t rank = 0; rank < run.shape.world; ++rank) {
    const std::vector<v1::StepRecord>& all = run.records[rank];
    if (next[rank] >= all.size()) continue;
    batch.Clear();
    while (next[rank] < all.size()) *batch.Add() = all[next[rank]++];
    pipeline.OnBatch(run.starts[rank], batch, 0, now += 1'000'000);
  }
  pipeline.CheckRanks(now + config.ranks.missing_after_seconds * 1'000'000'000);
  Verdict v{.lines = std::move(seen.lines)};
  std::sort(v.lines.begin(), v.lines.end());
  if (pipeline.health() != nullptr) {
    v.lead_window_slots = pipeline.health()->window().grad_norm.slots();
  }
  return v;
}

}  // namespace trainwatch::arrival

#endif  // TRAINWATCH_TESTS_COMMON_ARRIVAL_ORDER_H_
