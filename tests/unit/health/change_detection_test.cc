// The change-detection components of docs/detectors.md on synthetic signals with
// fixed seeds: delays on sudden shifts, silence on heavy-tailed healthy
// noise, one episode for a hovering quantity.
#include "health/signals/change_detection.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace trainwatch {
namespace {

TEST(CusumThreshold, MatchesSiegmundsApproximation) {
  // Classic table value: k = 0.5, h = 4 gives ARL0 ~ 336 (Siegmund).
  EXPECT_NEAR(GaussianCusumThreshold(0.5, 338.0), 4.0, 0.02);
  // Larger ARL0, larger threshold.
  EXPECT_LT(GaussianCusumThreshold(1.0, 1e4), GaussianCusumThreshold(1.0, 1e6));
  EXPECT_LT(LlrCusumThreshold(0.05, 1e4), LlrCusumThreshold(0.05, 1e6));
  // ARL0 = (e^(h+0.5) - (h+0.5) - 1) / kl.
  const double h = LlrCusumThreshold(0.05, 1e6);
  EXPECT_NEAR((std::exp(h + 0.5) - h - 1.5) / 0.05, 1e6, 1e3);
}

TEST(Cusum, EstimatesTheChangePointAsTheStepAfterItLastStoodAtZero) {
  Cusum c(5.0);
  EXPECT_FALSE(c.Add(1, -1.0));
  EXPECT_FALSE(c.Add(2, 2.0));
  EXPECT_FALSE(c.Add(3, 2.0));
  EXPECT_TRUE(c.Add(4, 2.0));
  EXPECT_EQ(c.onset_step(), 2u);
}

// A lognormal healthy norm: AR(1) wander plus white noise with a heavy tail
// (3% of steps from a 2.2x wider gaussian) and, optionally, single-step
// excursions of 4-6x.
class NormSource {
 public:
  NormSource(uint32_t seed, double sigma, double excursion_p = 0.0)
      : rng_(seed), sigma_(sigma), excursion_p_(excursion_p) {}
  double LogNext() {
    std::normal_distribution<double> g(0.0, 1.0);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    ar_ = 0.9 * ar_ + 0.03 * g(rng_);
    const double s = u(rng_) < 0.03 ? 2.2 * sigma_ : sigma_;
    double x = ar_ + s * g(rng_);
    if (u(rng_) < excursion_p_) x += std::log(4.0 + 2.0 * u(rng_));
    return x;
  }

 private:
  std::mt19937 rng_;
  double sigma_, excursion_p_, ar_ = 0.0;
};

LevelShiftDetector::Options NormOptions() {
  LevelShiftDetector::Options o;
  o.shift = std::log(2.0);
  return o;
}

TEST(LevelShiftDetector, NamesASudden3xShiftWithinTensOfStepsAtItsChangePoint) {
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u}) {
    LevelShiftDetector d(NormOptions());
    NormSource src(seed, 0.15);
    const uint64_t at = 3000;
    std::optional<uint64_t> fired, onset;
    double level = 0;
    for (uint64_t step = 1; step < 4000 && !fired; ++step) {
      double x = std::log(0.4) + src.LogNext();
      if (step >= at) x += std::log(3.0);
      auto r = d.Add(step, x);
      if (r && r->fired_now) {
        fired = step;
        onset = r->onset_step;
        level = std::exp(r->level) / 0.4;
      }
    }
    ASSERT_TRUE(fired.has_value()) << seed;
    EXPECT_GE(*fired, at) << seed;
    EXPECT_LE(*fired - at, 40u) << seed;
    EXPECT_LE(*onset > at ? *onset - at : at - *onset, 5u) << seed;
    EXPECT_NEAR(level, 3.0, 0.5) << seed;
  }
}

TEST(LevelShiftDetector, Names2xShiftWithinTensOfSteps) {
  LevelShiftDetector d(NormOptions());
  NormSource src(7, 0.18);
  std::optional<uint64_t> fired;
  for (uint64_t step = 1; step < 5000 && !fired; ++step) {
    double x = src.LogNext() + (step >= 2500 ? std::log(2.0) : 0.0);
    auto r = d.Add(step, x);
    if (r && r->fired_now) fired = step;
  }
  ASSERT_TRUE(fired.has_value());
  EXPECT_GE(*fired, 2500u);
  EXPECT_LE(*fired - 2500, 60u);
}

TEST(LevelShiftDetector, HeavyTailedHealthyNormsWithExcursionsStaySilent) {
  for (uint32_t seed : {11u, 12u, 13u}) {
    LevelShiftDetector d(NormOptions());
    NormSource src(seed, 0.18, /*excursion_p=*/0.005);
    for (uint64_t step = 1; step <= 50000; ++step) {
      auto r = d.Add(step, src.LogNext());
      ASSERT_FALSE(r && r->fired_now) << "seed " << seed << " step " << step;
    }
  }
}

TEST(LevelShiftDetector, ABriefBurstOfFewerThanMinStepsDoesNotFire) {
  LevelShiftDetector d(NormOptions());
  NormSource src(21, 0.15);
  for (uint64_t step = 1; step <= 3000; ++step) {
    double x = src.LogNext() + (step >= 2000 && step < 2008 ? std::log(50.0) : 0);
    auto r = d.Add(step, x);
    ASSERT_FALSE(r && r->fired_now) << step;
  }
}

TEST(LevelShiftDetector, HoveringAroundTheThresholdGivesOneEpisode) {
  LevelShiftDetector d(NormOptions());
  NormSource src(31, 0.15);
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(1.7, 2.6);
  int fires = 0;
  double level = 0;
  for (uint64_t step = 1; step <= 12000; ++step) {
    if (step >= 2000 && step % 200 == 0) level = std::log(u(rng));
    auto r = d.Add(step, src.LogNext() + (step >= 2000 ? level : 0.0));
    fires += r && r->fired_now;
  }
  EXPECT_EQ(fires, 1);
}

TEST(LevelShiftDetector, ResolvesOnceTheLevelIsBackAndStaysBack) {
  LevelShiftDetector::Options o = NormOptions();
  o.resolve_after_steps = 100;
  LevelShiftDetector d(o);
  NormSource src(41, 0.15);
  std::optional<uint64_t> last_hold;
  for (uint64_t step = 1; step <= 5000; ++step) {
    double x = src.LogNext() + (step >= 2000 && step < 3000 ? std::log(3.0) : 0);
    auto r = d.Add(step, x);
    if (r && r->holds) last_hold = step;
  }
  ASSERT_TRUE(last_hold.has_value());
  EXPECT_GE(*last_hold, 3000u);
  EXPECT_LE(*last_hold, 3100u);
  EXPECT_FALSE(d.firing());
}

TEST(LevelShiftDetector, TwoSidedNamesADropInNats) {
  LevelShiftDetector::Options o;
  o.shift = 5.0;  // nats
  o.two_sided = true;
  LevelShiftDetector d(o);
  std::mt19937 rng(3);
  std::normal_distribution<double> g(0.0, 0.05);
  std::optional<uint64_t> fired;
  bool downward = false;
  for (uint64_t step = 1; step < 4000 && !fired; ++step) {
    auto r = d.Add(step, (step >= 2000 ? 5.5 : 10.8) + g(rng));
    if (r && r->fired_now) {
      fired = step;
      downward = r->downward;
    }
  }
  ASSERT_TRUE(fired.has_value());
  EXPECT_TRUE(downward);
  EXPECT_LE(*fired - 2000, 30u);
}

TEST(LevelShiftDetector, RewindIntoTheBaselineRetakesIt) {
  LevelShiftDetector::Options o = NormOptions();
  o.baseline_steps = 100;
  LevelShiftDetector d(o);
  for (uint64_t s = 1; s <= 150; ++s) d.Add(s, 0.0);
  ASSERT_TRUE(d.baseline().has_value());
  d.RewindTo(120);  // after the baseline: kept
  EXPECT_TRUE(d.baseline().has_value());
  d.RewindTo(50);
  EXPECT_FALSE(d.baseline().has_value());
}

struct RateRun {
  int fires = 0;
  std::optional<uint64_t> first_fire;
  std::optional<uint64_t> first_onset;
  double rate = 0;
};

template <typename RateOf>
RateRun RunRate(uint32_t seed, uint64_t steps, RateOf rate_of) {
  RateShiftDetector d(RateShiftDetector::Options{});
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  RateRun out;
  for (uint64_t step = 1; step <= steps; ++step) {
    auto r = d.Add(step, u(rng) < rate_of(step));
    if (r.fired_now) {
      ++out.fires;
      if (!out.first_fire) {
        out.first_fire = step;
        out.first_onset = r.onset_step;
        out.rate = r.rate;
      }
    }
  }
  return out;
}

TEST(RateShiftDetector, NamesAClipRateJumpTo20PercentWithinTensOfSteps) {
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u, 6u}) {
    RateRun r = RunRate(seed, 4000, [](uint64_t s) { return s >= 2000 ? 0.2 : 0.002; });
    ASSERT_TRUE(r.first_fire.has_value()) << seed;
    EXPECT_GE(*r.first_fire, 2000u) << seed;
    EXPECT_LE(*r.first_fire - 2000, 90u) << seed;
    EXPECT_NEAR(static_cast<double>(*r.first_onset), 2000.0, 30.0) << seed;
    EXPECT_GT(r.rate, 0.1) << seed;
  }
}

TEST(RateShiftDetector, ARateHoveringBetween4_6And7PercentGivesAtMostTwoFires) {
  for (uint32_t seed : {7u, 8u, 9u, 10u}) {
    std::mt19937 wander(seed);
    std::uniform_real_distribution<double> u(0.046, 0.07);
    double p = 0.05;
    RateRun r = RunRate(seed, 9000, [&](uint64_t s) {
      if (s % 300 == 0) p = u(wander);
      return p;
    });
    EXPECT_LE(r.fires, 2) << seed;
  }
}

// The case: ~0.3% of steps clipped, then the norm's median moves
// from 0.35 to 0.81 of max_norm. The delays are printed; the bound on the
// mean is what the CUSUM from half the threshold can do at ARL0 1e6.
TEST(RateShiftDetector, AJumpTo15To25PercentIsNamedWithinTensOfSteps) {
  for (const auto [to, mean_bound] : {std::pair{0.15, 90.0}, {0.19, 60.0}, {0.25, 40.0}}) {
    uint64_t worst = 0, total = 0;
    for (uint32_t seed = 1; seed <= 20; ++seed) {
      RateRun r = RunRate(seed, 4000, [to = to](uint64_t s) { return s >= 2000 ? to : 0.003; });
      ASSERT_TRUE(r.first_fire.has_value()) << to << " " << seed;
      EXPECT_GE(*r.first_fire, 2000u) << to << " " << seed;
      EXPECT_EQ(r.fires, 1) << to << " " << seed;
      EXPECT_NEAR(static_cast<double>(*r.first_onset), 2000.0, 60.0) << seed;
      worst = std::max(worst, *r.first_fire - 2000);
      total += *r.first_fire - 2000;
    }
    std::printf("[ delay    ] 0.3%% -> %.0f%%: mean %.1f, worst %d steps (20 seeds)\n",
                100 * to, total / 20.0, static_cast<int>(worst));
    EXPECT_LE(total / 20.0, mean_bound) << to;
  }
}

TEST(RateShiftDetector, ARateWellBelowTheThresholdNeverFires) {
  for (uint32_t seed : {11u, 12u, 13u}) {
    RateRun r = RunRate(seed, 50000, [](uint64_t) { return 0.025; });
    EXPECT_EQ(r.fires, 0) << seed;
  }
}

// Steps until `test` is convinced the rate is below, on flags drawn at
// `rate`; 0 when it is not within `steps`.
uint64_t StepsToFall(RateFallTest& test, uint32_t seed, uint64_t steps, double rate) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (uint64_t step = 1; step <= steps; ++step) {
    if (test.Add(step, u(rng) < rate)) return step;
  }
  return 0;
}

// In control at the threshold: a rate hovering there is not found below
// (an expected once in ARL0 = 10^6 steps).
TEST(RateFallTest, ARateAtItsThresholdIsNotFoundBelow) {
  for (const double threshold : {0.05, 0.01}) {
    for (uint32_t seed = 1; seed <= 5; ++seed) {
      RateFallTest test(threshold, /*resolve_ratio=*/0.8, /*arl0=*/1e6);
      EXPECT_EQ(StepsToFall(test, seed, 50000, threshold), 0u)
          << "threshold " << threshold << ", seed " << seed;
    }
  }
}

// A clip rate that falls from 5% to 0 is found below in h / -log(1 - 0.05)
// ~ 300 steps, to 1% within a thousand; a skip rate from 1% to 0 (fewer
// events, slower evidence) in ~1250; Restart() forgets the evidence.
TEST(RateFallTest, FindsAClearFallWithinHundredsOfSteps) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    RateFallTest clip(0.05, 0.8, 1e6);
    const uint64_t to_zero = StepsToFall(clip, seed, 5000, 0.0);
    EXPECT_GE(to_zero, 250u) << seed;
    EXPECT_LE(to_zero, 350u) << seed;
    clip.Restart();
    EXPECT_GT(StepsToFall(clip, seed, 5000, 0.01), 0u) << seed;
    clip.Restart();
    EXPECT_LE(StepsToFall(clip, seed, 5000, 0.01), 1000u) << seed;

    RateFallTest skip(0.01, 0.8, 1e6);
    const uint64_t skip_to_zero = StepsToFall(skip, seed, 5000, 0.0);
    EXPECT_GE(skip_to_zero, 1000u) << seed;
    EXPECT_LE(skip_to_zero, 1500u) << seed;
  }
}

}  // namespace
}  // namespace trainwatch

namespace trainwatch {
namespace {

TEST(Hysteresis, FiresOnAFireHoldsOnAHoldAndForgetsAfterResolveSteps) {
  Hysteresis h(10);
  EXPECT_FALSE(h.Update(1, false, true));  // a hold alone does not fire
  EXPECT_TRUE(h.Update(2, true, false));
  EXPECT_TRUE(h.Update(3, false, true));
  EXPECT_FALSE(h.Update(4, false, false));
  EXPECT_TRUE(h.firing());  // cooling: a hold now is the same episode
  EXPECT_TRUE(h.Update(8, false, true));
  EXPECT_FALSE(h.Update(17, false, false));
  EXPECT_TRUE(h.firing());
  EXPECT_FALSE(h.Update(18, false, false));
  EXPECT_FALSE(h.firing());
  EXPECT_FALSE(h.Update(19, false, true));
}

}  // namespace
}  // namespace trainwatch
