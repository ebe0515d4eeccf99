// Tests of the pure goodput-and-straggler state (server/health): per-rank
// step times, input waits, goodput accounting, lemon hosts, spike replays.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "health/timing/goodput.h"
#include "health/detectors/host_incidents.h"
#include "health/timing/run_timing.h"
#include "health/timing/spike_replay.h"
#include "health/timing/step_times.h"

namespace trainwatch {
namespace {

// Step `s` of `rank`: 1 s with +-10% uniform jitter, x3 on every rank at
// each checkpoint step (every 100) and x2 on two-step evaluations (every
// 250), x`slow` on `slow_rank` from `slow_from` on.
double StepTime(std::mt19937& rng, uint32_t rank, uint64_t s,
                uint32_t slow_rank = 0, uint64_t slow_from = ~0ull,
                double slow = 1.0) {
  std::uniform_real_distribution<double> jitter(0.9, 1.1);
  double t = jitter(rng);
  if (s % 100 == 0) t *= 3.0;
  if (s % 250 == 0 || s % 250 == 1) t *= 2.0;
  if (rank == slow_rank && s >= slow_from) t *= slow;
  return t;
}

// Feeds `steps` steps of `ranks` ranks the way the scenario harness replays
// them (chunks of 100 steps, each rank's chunk whole, ranks one after the
// other), or step by step in lockstep; returns the first step at which the
// tracker names a suspect after `from` (or ~0).
struct Replay {
  uint32_t ranks = 8;
  uint64_t steps = 3000;
  bool chunked = true;
  uint32_t slow_rank = 0;
  uint64_t slow_from = ~0ull;
  double slow = 1.0;
};

std::pair<uint64_t, uint32_t> FirstSuspect(RankStepTimes& times, const Replay& r,
                                           unsigned seed) {
  std::mt19937 rng(seed);
  const uint64_t chunk = r.chunked ? 100 : 1;
  for (uint64_t c = 0; c < r.steps; c += chunk) {
    for (uint32_t rank = 0; rank < r.ranks; ++rank) {
      for (uint64_t s = c; s < c + chunk && s < r.steps; ++s) {
        times.Add(rank, StepTime(rng, rank, s, r.slow_rank, r.slow_from, r.slow));
        if (std::optional<uint32_t> suspect = times.Suspect()) {
          return {s, *suspect};
        }
      }
    }
  }
  return {~0ull, 0};
}

TEST(RankStepTimes, NamesARankSlowedBy30PercentWithinTensOfSteps) {
  for (bool chunked : {false, true}) {
    for (unsigned seed = 1; seed <= 5; ++seed) {
      StragglerConfig config;
      RankStepTimes times(config);
      for (uint32_t rank = 0; rank < 8; ++rank) {
        times.SetHost(rank, "node-" + std::to_string(rank / 4));
      }
      Replay r{.slow_rank = 5, .slow_from = 1234, .slow = 1.3};
      auto [step, rank] = FirstSuspect(times, r, seed);
      ASSERT_NE(step, ~0ull) << "seed " << seed << " chunked " << chunked;
      EXPECT_EQ(rank, 5u);
      EXPECT_GE(step, 1234u) << "named before it slowed down";
      EXPECT_LE(step, 1234u + 100) << "seed " << seed;
      EXPECT_EQ(times.HostOf(rank), "node-1");
    }
  }
}

TEST(RankStepTimes, StaysSilentOnJitterCheckpointsAndEvaluations) {
  for (bool chunked : {false, true}) {
    for (unsigned seed = 1; seed <= 10; ++seed) {
      StragglerConfig config;
      RankStepTimes times(config);
      Replay r{.steps = 5000, .chunked = chunked};
      EXPECT_EQ(FirstSuspect(times, r, seed).first, ~0ull)
          << "seed " << seed << " chunked " << chunked;
      EXPECT_TRUE(times.ready());
      EXPECT_NEAR(times.median_seconds(), 1.0, 0.1);
      EXPECT_LT(times.lost_fraction(), 0.1);
    }
  }
}

TEST(RankStepTimes, ReportsTheLossAndTheSlowestRanks) {
  StragglerConfig config;
  RankStepTimes times(config);
  for (uint64_t s = 0; s < 200; ++s) {
    for (uint32_t rank = 0; rank < 8; ++rank) times.Add(rank, rank == 3 ? 1.5 : 1.0);
  }
  EXPECT_NEAR(times.Ratio(3), 1.5, 0.01);
  EXPECT_NEAR(times.lost_fraction(), 1.0 - 1.0 / 1.5, 0.01);
  EXPECT_EQ(times.RanksAtLeast(1.2), 1u);
  ASSERT_EQ(times.Suspect(), 3u);
  const auto slowest = times.Slowest(2);
  ASSERT_EQ(slowest.size(), 2u);
  EXPECT_EQ(slowest[0].rank, 3u);
  EXPECT_NEAR(slowest[0].seconds, 1.5, 0.01);
  EXPECT_NEAR(slowest[1].ratio, 1.0, 0.01);
  // Recovers: the level comes back, the CUSUM drains.
  for (uint64_t s = 0; s < 200; ++s) {
    for (uint32_t rank = 0; rank < 8; ++rank) times.Add(rank, 1.0);
  }
  EXPECT_FALSE(times.Suspect().has_value());
  EXPECT_LT(times.Ratio(3), 1.01);
}

TEST(RankStepTimes, NeedsThreeRanksAndIgnoresNonsense) {
  StragglerConfig config;
  RankStepTimes times(config);
  for (int i = 0; i < 100; ++i) {
    times.Add(0, 1.0);
    times.Add(1, 5.0);
    times.Add(1, -1.0);
    times.Add(1, std::nan(""));
  }
  EXPECT_FALSE(times.ready());
  EXPECT_FALSE(times.Suspect().has_value());
}

TEST(RankStepTimes, MemoryAt1024RanksIsAFewBytesARank) {
  StragglerConfig config;
  RankStepTimes times(config);
  for (uint32_t rank = 0; rank < 1024; ++rank) {
    times.SetHost(rank, "gpu-node-" + std::to_string(rank / 8) + ".cluster.example");
  }
  for (uint64_t s = 0; s < 20; ++s) {
    for (uint32_t rank = 0; rank < 1024; ++rank) times.Add(rank, 1.0);
  }
  const size_t bytes = times.MemoryBytes();
  std::printf("[ memory   ] RankStepTimes at 1024 ranks (128 hosts): %zu bytes, "
              "%.1f bytes a rank\n", bytes, bytes / 1024.0);
  EXPECT_LT(bytes, 64u * 1024);  // docs/performance.md: 100 KiB a run in all
}

TEST(InputWait, MedianOfRecentStepsIgnoresOneSlowBatch) {
  InputWait wait;
  EXPECT_FALSE(wait.ready());
  for (int i = 0; i < 40; ++i) wait.Add(1.0, i == 20 ? 0.9 : 0.02);
  EXPECT_TRUE(wait.ready());
  EXPECT_NEAR(wait.MedianFraction(), 0.02, 1e-6);
  for (int i = 0; i < 17; ++i) wait.Add(1.0, 0.4);
  EXPECT_NEAR(wait.MedianFraction(), 0.4, 1e-6);
  wait.Add(0.0, 0.4);  // ignored
  EXPECT_NEAR(wait.last_fraction(), 0.4, 1e-6);
}

constexpr int64_t kSec = 1'000'000'000;

TEST(Goodput, CountsSkippedRewoundAndSilentTime) {
  GoodputConfig config;
  Goodput g(config);
  int64_t t = 1000 * kSec;
  // Attempt 0: steps 0..299 at 1 s, steps 50 and 51 skipped.
  for (uint64_t s = 0; s < 300; ++s) {
    t += kSec;
    g.OnLeadRecord(s, s == 50 || s == 51, t, 1.0);
  }
  // Crash; 600 s down; attempt 1 restarts from the checkpoint at 199.
  g.OnRewind(200, 299);
  t += 600 * kSec;
  g.OnLeadRecord(200, false, t, std::nullopt);  // first record: no step time
  for (uint64_t s = 201; s < 400; ++s) {
    t += kSec;
    g.OnLeadRecord(s, s == 350, t, 1.0);
  }
  const GoodputTotals totals = g.totals();
  EXPECT_EQ(totals.skipped_steps, 3u);
  EXPECT_EQ(totals.rewound_steps, 100u);
  EXPECT_EQ(totals.productive_steps, 500u - 103u);
  EXPECT_NEAR(totals.skipped_seconds, 3.0, 1e-9);
  EXPECT_NEAR(totals.rewound_seconds, 100.0, 1e-6);
  EXPECT_NEAR(totals.silent_seconds, 599.0, 1e-6);
  EXPECT_NEAR(totals.wall_seconds, 299 + 600 + 199, 1e-6);
  EXPECT_NEAR(totals.ratio, (1098.0 - 3 - 100 - 599) / 1098.0, 1e-9);
}

TEST(Goodput, MeasuresStepTimeFromGapsWhenRecordsHaveNone) {
  GoodputConfig config;
  Goodput g(config);
  for (uint64_t s = 0; s < 50; ++s) {
    g.OnLeadRecord(s, false, static_cast<int64_t>(s) * 2 * kSec, std::nullopt);
  }
  EXPECT_NEAR(g.typical_step_seconds(), 2.0, 1e-9);
  EXPECT_EQ(g.totals().ratio, 1.0);
}

TEST(HostIncidents, TwoRunsNamingAHostWithinADayMakeItSuspect) {
  HostIncidents incidents(HostSuspectConfig{});
  EXPECT_TRUE(HostIncidents::Implicates(AlertKind::kRankStraggler));
  EXPECT_FALSE(HostIncidents::Implicates(AlertKind::kClipFractionHigh));
  const int64_t t0 = 100000 * kSec;
  EXPECT_FALSE(incidents.Add({"node-7", "NonFiniteUpdate", "run-a", t0}).has_value());
  EXPECT_FALSE(incidents.Add({"node-7", "RankStraggler", "run-a", t0 + kSec}).has_value());
  EXPECT_FALSE(incidents.Add({"node-8", "LossSpike", "run-b", t0 + kSec}).has_value());
  EXPECT_FALSE(incidents.Add({"", "LossSpike", "run-c", t0 + kSec}).has_value());
  std::optional<HostSuspicion> s =
      incidents.Add({"node-7", "LossSpike", "run-b", t0 + 3600 * kSec});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->host, "node-7");
  EXPECT_EQ(s->runs, (std::vector<std::string>{"run-a", "run-b"}));
  EXPECT_EQ(s->alertnames,
            (std::vector<std::string>{"LossSpike", "NonFiniteUpdate", "RankStraggler"}));
  // Once per host while suspect.
  EXPECT_FALSE(incidents.Add({"node-7", "LossSpike", "run-c", t0 + 3700 * kSec}).has_value());
  // A day later the first incidents age out.
  EXPECT_TRUE(incidents.Expire(t0 + 3600 * kSec + 86400 * kSec + 1).size() == 1);
  EXPECT_FALSE(incidents.Suspicion("node-7", t0 + 3600 * kSec + 86400 * kSec + 1));
}

// A deleted run leaves nothing behind: its incidents are forgotten, so a
// later incident of another run does not make the host suspect with it.
TEST(HostIncidents, ADeletedRunsIncidentsAreForgotten) {
  HostIncidents incidents(HostSuspectConfig{});
  const int64_t t0 = 100000 * kSec;
  incidents.Add({"node-7", "NonFiniteUpdate", "deleted", t0});
  incidents.Add({"node-7", "LossSpike", "deleted", t0 + kSec});
  incidents.Add({"node-8", "LossSpike", "kept", t0 + kSec});
  const auto forgot = incidents.ForgetRun("deleted");
  EXPECT_EQ(forgot.size(), 2u);
  EXPECT_EQ(forgot.at({"node-7", "LossSpike"}), 1u);
  EXPECT_EQ(forgot.at({"node-7", "NonFiniteUpdate"}), 1u);
  EXPECT_EQ(incidents.hosts(), 1u);  // node-8 only
  EXPECT_FALSE(incidents.Add({"node-7", "LossSpike", "other", t0 + 2 * kSec}).has_value());
  // A host suspect through the deleted run is not suspect any more.
  incidents.Add({"node-9", "LossSpike", "a", t0});
  ASSERT_TRUE(incidents.Add({"node-9", "LossSpike", "b", t0 + kSec}).has_value());
  incidents.ForgetRun("b");
  EXPECT_FALSE(incidents.Suspicion("node-9", t0 + 2 * kSec).has_value());
  // ... and becomes suspect again through a new run.
  EXPECT_TRUE(incidents.Add({"node-9", "LossSpike", "c", t0 + 3 * kSec}).has_value());
}

// The same records replayed under other run ids (an import, a scenario
// replayed in three arrival orders) are one run, not a lemon machine's
// victims: the same alert at the same step with the same text.
TEST(HostIncidents, AReplayOfTheSameRecordsUnderAnotherRunIdIsNotAnotherRun) {
  HostIncidents incidents(HostSuspectConfig{});
  const int64_t t0 = 100000 * kSec;
  const std::string said = "RankStraggler|1530|5|rank 5 on host gpu-node-1 takes 1.30x";
  EXPECT_FALSE(incidents.Add({"gpu-node-1", "RankStraggler", "s/at-once", t0, said}));
  EXPECT_FALSE(incidents.Add({"gpu-node-1", "RankStraggler", "s/rank0-first", t0 + kSec, said}));
  EXPECT_FALSE(incidents.Add({"gpu-node-1", "RankStraggler", "s/rank0-last", t0 + 2 * kSec, said}));
  // Another run with an incident of its own on that host: suspect.
  std::optional<HostSuspicion> s = incidents.Add(
      {"gpu-node-1", "RankStraggler", "other-run", t0 + 3 * kSec,
       "RankStraggler|88|5|rank 5 on host gpu-node-1 takes 1.41x"});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->runs, (std::vector<std::string>{"other-run", "s/at-once"}));
}

TEST(HostIncidents, IncidentsMoreThanADayApartAreNotSuspect) {
  HostIncidents incidents(HostSuspectConfig{});
  EXPECT_FALSE(incidents.Add({"node-1", "LossSpike", "run-a", 0}).has_value());
  EXPECT_FALSE(
      incidents.Add({"node-1", "LossSpike", "run-b", 90000 * kSec}).has_value());
}

TEST(SpikeReplay, RecoveredWhenTheReplaySkipsTheBatchesAndNoSpikeReturns) {
  SpikeReplayConfig config;
  SpikeReplay replay(config);
  EXPECT_TRUE(replay.OnSpike(150, {1200, 1201}).empty());
  replay.OnRewind(51);
  // Step s trains on batch 8s; the replay leaves out 1200 and 1201.
  for (uint64_t s = 51; s < 199; ++s) {
    const int64_t id = s == 150 ? 99999 : int64_t(s) * 8;
    EXPECT_TRUE(replay.OnLeadRecord(s, {id, id + 1}).empty()) << s;
  }
  std::vector<SpikeOutcome> out = replay.OnLeadRecord(200, {});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].spike_step, 150u);
  EXPECT_EQ(out[0].outcome(), "recovered");
  EXPECT_TRUE(out[0].batches_skipped);
  EXPECT_TRUE(replay.OnLeadRecord(260, {}).empty());  // judged once
}

TEST(SpikeReplay, RecurrenceWithoutTheBatchesBlamesTheOptimizer) {
  SpikeReplayConfig config;
  SpikeReplay replay(config);
  replay.OnSpike(150, {7});
  replay.OnRewind(100);
  replay.OnLeadRecord(149, {8});
  std::vector<SpikeOutcome> out = replay.OnSpike(153, {9});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].outcome(), "recurred");
  EXPECT_TRUE(out[0].optimizer_or_lr());
  EXPECT_EQ(out[0].recurrence_step, 153u);
}

TEST(SpikeReplay, RecurrenceWithTheSameBatchesIsTheData) {
  SpikeReplayConfig config;
  SpikeReplay replay(config);
  replay.OnSpike(150, {7});
  EXPECT_TRUE(replay.OnSpike(300, {9}).empty());  // a later, unrelated spike
  replay.OnRewind(100);
  replay.OnLeadRecord(150, {7});
  std::vector<SpikeOutcome> out = replay.OnSpike(150, {7});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].outcome(), "recurred");
  EXPECT_FALSE(out[0].batches_skipped);
  EXPECT_FALSE(out[0].optimizer_or_lr());
  // The run finishes past the later spike: judged recovered there.
  out = replay.OnFinish(320);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].spike_step, 300u);
}

v1::StepRecord Rec(uint64_t step, double seconds, double wait = -1) {
  v1::StepRecord r;
  r.set_step(step);
  r.set_step_time_s(seconds);
  if (wait >= 0) r.set_data_wait_s(wait);
  r.set_time_unix_nanos(static_cast<int64_t>(step) * kSec);
  return r;
}

TEST(RunTiming, NamesTheStragglerAndItsHostThenResolves) {
  TimingConfig config;
  RunTiming timing(config);
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> jitter(0.9, 1.1);
  uint64_t fired = 0;
  for (uint64_t s = 0; s < 600; ++s) {
    for (uint32_t rank = 0; rank < 8; ++rank) {
      const double slow = rank == 6 && s >= 300 && s < 450 ? 1.3 : 1.0;
      timing.OnRecord(rank, 0, "node-" + std::to_string(rank / 2),
                      Rec(s, jitter(rng) * slow));
    }
    timing.OnLeadRecord(Rec(s, 1.0), 0);
    bool holds = false;
    timing.JudgeRanksThrough(s, [&](uint64_t) { holds = timing.StragglerHolds(); });
    if (holds && fired == 0) {
      fired = s;
      EXPECT_EQ(timing.straggler_rank(), 6u);
      EXPECT_EQ(timing.straggler_host(), "node-3");
      EXPECT_NE(timing.StragglerDescription().find("rank 6 on host node-3"),
                std::string::npos)
          << timing.StragglerDescription();
      EXPECT_EQ(timing.StragglerSummary(), "rank 6 on node-3 is a straggler");
    }
    if (s < 300) {
      ASSERT_FALSE(holds) << s;
    }
    if (s >= 500) {
      EXPECT_FALSE(holds) << s;  // recovered: the level is back
    }
  }
  EXPECT_GE(fired, 300u);
  EXPECT_LE(fired, 400u);
  v1::WindowStats window;
  v1::GetRunHealthResponse health;
  timing.FillHealth(&window, &health);
  EXPECT_NEAR(window.step_seconds_median(), 1.0, 0.05);
  ASSERT_EQ(health.slowest_ranks_size(), 8);
  EXPECT_GE(health.slowest_ranks(0).ratio_to_median(),
            health.slowest_ranks(7).ratio_to_median());
  EXPECT_EQ(health.goodput().productive_steps(), 600u);
}

TEST(RunTiming, InputStallWithHysteresis) {
  TimingConfig config;
  RunTiming timing(config);
  std::vector<bool> holds;
  for (uint64_t s = 0; s < 200; ++s) {
    const double wait = s >= 50 && s < 120 ? 0.3 : (s >= 120 && s < 150 ? 0.15 : 0.02);
    timing.AddLeadWait(Rec(s, 1.0, wait));
    timing.OnLeadRecord(Rec(s, 1.0, wait), 0);
    holds.push_back(timing.StallHolds());
  }
  EXPECT_FALSE(holds[49]);
  EXPECT_FALSE(holds[60]);   // the median needs half of the recent steps
  EXPECT_TRUE(holds[70]);
  EXPECT_TRUE(holds[140]);   // 15%: below the fire threshold, above resolve
  EXPECT_FALSE(holds[199]);
  EXPECT_NE(timing.StallDescription().find("waits for its input pipeline"),
            std::string::npos);
}

TEST(RunTiming, MemoryAt1024Ranks) {
  TimingConfig config;
  RunTiming timing(config);
  for (uint64_t s = 0; s < 20; ++s) {
    for (uint32_t rank = 0; rank < 1024; ++rank) {
      timing.OnRecord(rank, 0, "gpu-node-" + std::to_string(rank / 8), Rec(s, 1.0));
    }
    timing.JudgeRanksThrough(s, [](uint64_t) {});
  }
  std::printf("[ memory   ] RunTiming at 1024 ranks: %zu bytes (%.1f a rank)\n",
              timing.MemoryBytes(), timing.MemoryBytes() / 1024.0);
  EXPECT_LT(timing.MemoryBytes(), 64u * 1024);
}

}  // namespace
}  // namespace trainwatch
