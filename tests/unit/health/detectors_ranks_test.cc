// The cross-rank detectors (detectors/ranks.cc) on simulated multi-rank runs,
// through the real RunHealth and alert tracker.
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health_test_util.h"

namespace trainwatch {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::trainwatch::testing::HealthHarness;
using ::trainwatch::testing::Rec;

RunInfo DdpInfo(uint32_t world_size) {
  RunInfo info;
  info.run_id = "ddp-run";
  info.precision = v1::BF16;
  info.max_norm = 1.0;
  info.warmup_steps = 200;
  info.world_size = world_size;
  return info;
}

// A healthy DDP/FSDP run: every rank reports the same global pre-clip norm,
// and the ranks' shard_sq_sum (a random split of the parameters) add up to
// norm^2. `corrupt` may change rank r's record of a step before it is sent.
class DdpRun {
 public:
  using Corrupt = std::function<void(uint32_t rank, v1::StepRecord&)>;

  DdpRun(HealthHarness& h, uint32_t world_size, uint64_t seed = 3)
      : h_(h), world_size_(world_size), rng_(seed) {}

  void Feed(uint64_t end, const Corrupt& corrupt = nullptr) {
    std::lognormal_distribution<double> norm_noise(std::log(0.4), 0.25);
    std::uniform_real_distribution<double> share(0.5, 1.5);
    for (; step_ < end; ++step_) {
      const double norm = norm_noise(rng_);
      std::vector<double> shares(world_size_);
      double total = 0;
      for (double& s : shares) total += (s = share(rng_));
      for (uint32_t rank = 0; rank < world_size_; ++rank) {
        v1::StepRecord r = Rec(step_, norm);
        r.set_shard_sq_sum(norm * norm * shares[rank] / total);
        if (corrupt) corrupt(rank, r);
        if (rank == 0) {
          h_.Lead(r);
        } else {
          h_.Rank(rank, r);
        }
      }
    }
  }

 private:
  HealthHarness& h_;
  uint32_t world_size_;
  std::mt19937_64 rng_;
  uint64_t step_ = 0;
};

TEST(RankNormMismatch, FiresWhenTwoRanksReportDifferentClipCoefficients) {
  HealthHarness h(DdpInfo(2));
  DdpRun run(h, 2);
  const uint64_t bad_from = 1000, bad_to = 1050;  // [bad_from, bad_to)
  // As reported on bad_from.
  double coef[2] = {0, 0}, norm = 0;
  run.Feed(bad_from);
  // Rank 1 clips with its own shard's norm: a different coefficient.
  run.Feed(bad_to, [&](uint32_t rank, v1::StepRecord& r) {
    if (rank == 1) r.set_clip_coef(0.8 * r.clip_coef());
    if (r.step() == bad_from) {
      coef[rank] = r.clip_coef();
      norm = r.grad_norm();
    }
  });
  run.Feed(1300);

  const auto fired = h.Fired(AlertKind::kRankNormMismatch);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].step, bad_from);
  EXPECT_THAT(fired[0].description,
              HasSubstr(absl::StrFormat(
                  "step %d: rank 0 reported grad_norm %.3g (clip_coef %.3g), "
                  "rank 1 reported %.3g (clip_coef %.3g): spread %.3g%%",
                  bad_from, norm, coef[0], norm, coef[1],
                  100 * (coef[0] - coef[1]) / coef[0])));
  const auto resolved = h.Resolved(AlertKind::kRankNormMismatch);
  ASSERT_EQ(resolved.size(), 1u);
  EXPECT_EQ(resolved[0].step, bad_to - 1 + h.config().resolve_after_steps);
}

TEST(RankNormMismatch, NamesTheRanksThatDisagreeOnTheNorm) {
  HealthHarness h(DdpInfo(4));
  DdpRun run(h, 4);
  run.Feed(1200);
  // Per-shard clipping: rank 3's local norm is not the global one.
  run.Feed(1201, [](uint32_t rank, v1::StepRecord& r) {
    r = Rec(r.step(), rank == 3 ? 1.71 : 0.52);
  });
  run.Feed(1400);

  const auto fired = h.Fired(AlertKind::kRankNormMismatch);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].step, 1200u);
  EXPECT_THAT(fired[0].description,
              HasSubstr(absl::StrFormat(
                  "step 1200: rank 0 reported grad_norm 0.52 (clip_coef 1), "
                  "rank 3 reported 1.71 (clip_coef 0.585): spread %.3g%%",
                  100 * (1.71 - 0.52) / 1.71)));
  EXPECT_EQ(h.Resolved(AlertKind::kRankNormMismatch).at(0).step,
            1200u + h.config().resolve_after_steps);
}

TEST(RankNormMismatch, SilentWhenRanksAgreeWithTheSameNoise) {
  HealthHarness h(DdpInfo(2));
  DdpRun run(h, 2);
  run.Feed(1300);
  EXPECT_THAT(h.transitions, IsEmpty());
}

TEST(RankNormMismatch, IgnoresRecordsOfAnOlderAttempt) {
  HealthHarness h(DdpInfo(2));
  RunHealth& health = h.health();
  int64_t now = 1'700'000'000'000'000'000;
  auto feed = [&](uint32_t attempt, uint64_t from, uint64_t to) {
    for (uint64_t step = from; step < to; ++step) {
      const v1::StepRecord r = Rec(step, 0.4);
      health.OnRankRecord(0, attempt, r);
      health.OnLeadRecord(r, now += 1'000'000);
      health.OnRankRecord(1, attempt, r);
    }
  };
  feed(0, 0, 600);
  // The job restarts from the checkpoint of step 500 as attempt 1. While
  // step 650 of attempt 1 waits for rank 1, a record of attempt 0 for that
  // step arrives late, with another norm.
  health.Rewind(500);
  feed(1, 500, 650);
  const v1::StepRecord r = Rec(650, 0.4);
  health.OnRankRecord(0, 1, r);
  health.OnLeadRecord(r, now += 1'000'000);
  health.OnRankRecord(1, 0, Rec(650, 3.0));
  health.OnRankRecord(1, 1, r);
  feed(1, 651, 800);
  EXPECT_THAT(h.transitions, IsEmpty());
}

TEST(ShardNormMismatch, FiresWhenReplicatedParametersAreCountedOnEveryRank) {
  HealthHarness h(DdpInfo(4));
  DdpRun run(h, 4);
  const uint64_t bad_from = 1000, bad_to = 1100;
  run.Feed(bad_from);
  // Every rank holds all the (replicated) parameters and reports norm^2:
  // the sum is 4 norm^2, so the rebuilt norm is sqrt(4) = 2 times too big.
  double norm = 0;
  run.Feed(bad_to, [&](uint32_t rank, v1::StepRecord& r) {
    r.set_shard_sq_sum(r.grad_norm() * r.grad_norm());
    if (r.step() == bad_from) norm = r.grad_norm();
  });
  run.Feed(1400);

  const auto fired = h.Fired(AlertKind::kShardNormMismatch);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].step, bad_from);
  EXPECT_DOUBLE_EQ(fired[0].peak, 2.0);
  EXPECT_THAT(fired[0].description,
              HasSubstr(absl::StrFormat(
                  "step %d: sqrt(sum of shard_sq_sum over 4 ranks) = %.4g but "
                  "rank 0 reported grad_norm %.4g (ratio 2)",
                  bad_from, 2 * norm, norm)));
  const auto resolved = h.Resolved(AlertKind::kShardNormMismatch);
  ASSERT_EQ(resolved.size(), 1u);
  EXPECT_EQ(resolved[0].step, bad_to - 1 + h.config().resolve_after_steps);
  EXPECT_THAT(h.Fired(AlertKind::kRankNormMismatch), IsEmpty());
}

TEST(HealthyDdpRun, FourRanksAgreeAndShardsAddUp) {
  HealthHarness h(DdpInfo(4));
  DdpRun run(h, 4, /*seed=*/11);
  run.Feed(5000);
  EXPECT_THAT(h.FiredNames(), IsEmpty());
  EXPECT_THAT(h.transitions, IsEmpty());
}

}  // namespace
}  // namespace trainwatch
