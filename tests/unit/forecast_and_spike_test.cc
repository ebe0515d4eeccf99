// TrendForecaster, ScaleBleed and StepDigests (docs/detectors.md) on synthetic
// signals with fixed seeds (LossSpikeRule: loss_spike_test.cc).
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "health/scale_bleed.h"
#include "health/step_digests.h"
#include "health/trend_forecast.h"

namespace trainwatch {
namespace {

TEST(TrendForecaster, ForecastsALinearClimbReachingTheCap) {
  TrendForecaster f(TrendForecaster::Options{});
  std::mt19937 rng(1);
  std::normal_distribution<double> noise(0.0, 0.03);
  // 60 at step 1000, +0.01 a step: reaches 100 at step 5000.
  for (uint64_t s = 1000; s <= 2500; ++s) {
    f.Add(s, (60.0 + 0.01 * (s - 1000)) * std::exp(noise(rng)));
  }
  ASSERT_TRUE(f.trend().has_value());
  EXPECT_NEAR(f.trend()->slope, 0.01, 0.002);
  std::optional<uint64_t> at = f.StepReaching(100.0);
  ASSERT_TRUE(at.has_value());
  EXPECT_NEAR(static_cast<double>(*at), 5000.0, 400.0);
}

TEST(TrendForecaster, AFlatNoisySignalForecastsNoCrossingWithinAHorizon) {
  TrendForecaster f(TrendForecaster::Options{});
  std::mt19937 rng(2);
  std::normal_distribution<double> noise(0.0, 0.05);
  for (uint64_t s = 1; s <= 20000; ++s) {
    if (f.Add(s, 15.0 * std::exp(noise(rng)))) {
      std::optional<uint64_t> at = f.StepReaching(100.0);
      ASSERT_TRUE(!at.has_value() || *at > s + 2000) << s;
    }
  }
}

TEST(TrendForecaster, ResistsOutliersAndRewinds) {
  TrendForecaster f(TrendForecaster::Options{.stride = 1, .points = 50,
                                             .min_points = 10});
  for (uint64_t s = 1; s <= 50; ++s) {
    f.Add(s, s % 7 == 0 ? 1000.0 : 2.0 * s);
  }
  ASSERT_TRUE(f.trend().has_value());
  EXPECT_NEAR(f.trend()->slope, 2.0, 1e-9);
  f.RewindTo(21);
  ASSERT_TRUE(f.trend().has_value());
  EXPECT_EQ(f.trend()->step, 20u);
  EXPECT_FALSE(f.StepReaching(-5.0).has_value());  // moving away
}

// The fit's medians are exact: the trend equals Theil-Sen computed by
// sorting every pairwise slope, on noise, heavy tails and many ties.
// Every fit against Theil-Sen by sorting all the pairwise slopes: most fits
// select inside a bracket around the last slope, the rest (the first, after
// a jump of the trend) among all of them; both must give the exact median.
TEST(TrendForecaster, TheFitIsTheilSenExactly) {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::cauchy_distribution<double> cauchy(0.0, 1.0);
  uint64_t fits = 0, bracketed = 0;
  for (int series = 0; series < 120; ++series) {
    const int kind = series % 4;
    TrendForecaster f(TrendForecaster::Options{.stride = 1, .points = 64,
                                               .min_points = 2});
    std::vector<uint64_t> steps;
    std::vector<double> values;
    // Up to 64 values fill the ring; more wrap it.
    const uint64_t n = 64 + (series * 37) % 1200;
    for (uint64_t s = 1; s <= n; ++s) {
      double v = 0.01 * s;
      if (kind == 0) v += normal(rng);
      if (kind == 1) v += cauchy(rng);
      if (kind == 2) v = std::round(2 * normal(rng));  // ties everywhere
      if (kind == 3) {  // the trend turns every 300 values
        v = (s / 300 % 2 == 0 ? 0.02 : -0.05) * static_cast<double>(s % 300) +
            0.1 * normal(rng);
      }
      steps.push_back(s * 3);
      values.push_back(v);
      if (!f.Add(s * 3, v)) continue;
      ++fits;
      const size_t first = steps.size() > 64 ? steps.size() - 64 : 0;
      std::vector<double> slopes;
      for (size_t i = first; i < steps.size(); ++i) {
        for (size_t j = i + 1; j < steps.size(); ++j) {
          slopes.push_back((values[j] - values[i]) /
                           (static_cast<double>(steps[j]) - steps[i]));
        }
      }
      std::sort(slopes.begin(), slopes.end());
      const double slope = slopes[slopes.size() / 2];
      std::vector<double> levels;
      for (size_t i = first; i < steps.size(); ++i) {
        levels.push_back(values[i] - slope * (static_cast<double>(steps[i]) -
                                              steps.back()));
      }
      std::sort(levels.begin(), levels.end());
      ASSERT_TRUE(f.trend().has_value()) << series << " at " << s;
      ASSERT_EQ(f.trend()->slope, slope) << series << " at " << s;
      ASSERT_EQ(f.trend()->level, levels[levels.size() / 2])
          << series << " at " << s;
    }
    bracketed += f.bracketed_fits();
  }
  // The bracket does its job: most fits never look at most slopes twice.
  EXPECT_GT(bracketed, fits * 85 / 100) << bracketed << " of " << fits;
  EXPECT_LT(bracketed, fits) << "no fit selected among all the slopes";
}

TEST(ScaleBleed, ASlowBleedIsNamedAfterFiveHalvingsWithAForecast) {
  ScaleBleed bleed;
  double scale = 32768;
  std::optional<uint64_t> named;
  for (uint64_t s = 1; s <= 3000; ++s) {
    if (s >= 1000 && (s - 1000) % 150 == 0) scale /= 2;
    bleed.Add(s, scale);
    if (!named && bleed.bleed(5, 1.0).has_value()) named = s;
  }
  ASSERT_TRUE(named.has_value());
  EXPECT_EQ(*named, 1600u);  // halvings at 1000, 1150, ..., 1600
  ScaleBleed again;
  scale = 32768;
  for (uint64_t s = 1; s <= 1600; ++s) {
    if (s >= 1000 && (s - 1000) % 150 == 0) scale /= 2;
    again.Add(s, scale);
  }
  auto b = again.bleed(5, 1.0);
  ASSERT_TRUE(b.has_value());
  EXPECT_DOUBLE_EQ(b->steps_per_halving, 150.0);
  // 1024 after five halvings: ten more at 150 steps each.
  ASSERT_TRUE(b->forecast_step.has_value());
  EXPECT_EQ(*b->forecast_step, 1600u + 11 * 150);
}

TEST(ScaleBleed, TheHealthySawtoothIsNotABleed) {
  ScaleBleed bleed;
  double scale = 65536;
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  uint32_t clean = 0;
  for (uint64_t s = 1; s <= 40000; ++s) {
    // Overflows above 2^15; a stray overflow every ~10,000 steps.
    const bool overflow = (scale > 32768 && u(rng) < 0.01) || u(rng) < 0.0001;
    if (overflow) {
      scale /= 2;
      clean = 0;
    } else if (++clean == 2000) {
      scale *= 2;
      clean = 0;
    }
    bleed.Add(s, scale, s > 10);
    ASSERT_FALSE(bleed.bleed(5, 1.0).has_value()) << s;
  }
}

struct Digest {
  float norm = 0;
  uint16_t ranks = 0;
};

TEST(StepDigests, JudgesEachStepOnceInStepOrderWithBoundedMemory) {
  StepDigests<Digest> d(100000);
  for (uint64_t s = 1; s <= 100000; ++s) {
    Digest* g = d.Get(0, s);
    ASSERT_NE(g, nullptr);
    g->norm = static_cast<float>(s);
    ++g->ranks;
  }
  EXPECT_EQ(d.size(), 100000u);
  for (uint64_t s = 1; s <= 100000; ++s) ++d.Get(0, s)->ranks;
  std::vector<uint64_t> judged;
  d.JudgeThrough(100000, [&](uint64_t step, const Digest& g) {
    EXPECT_EQ(g.ranks, 2u);
    EXPECT_EQ(g.norm, static_cast<float>(step));
    judged.push_back(step);
  });
  ASSERT_EQ(judged.size(), 100000u);
  EXPECT_TRUE(std::is_sorted(judged.begin(), judged.end()));
  EXPECT_EQ(d.size(), 0u);
  // A judged step is not taken again.
  EXPECT_EQ(d.Get(0, 500), nullptr);
  // Nothing is held beyond the lag bound.
  StepDigests<Digest> small(10);
  ASSERT_NE(small.Get(0, 1), nullptr);
  EXPECT_EQ(small.Get(0, 11), nullptr);
  EXPECT_NE(small.Get(0, 10), nullptr);
  // A newer attempt starts afresh; an older one is ignored.
  EXPECT_NE(small.Get(1, 50), nullptr);
  EXPECT_EQ(small.Get(0, 51), nullptr);
  EXPECT_EQ(small.size(), 1u);
}

// Found by ingest_fuzzer: a rank reporting step 2^64 - 1 (a client's -1),
// then another rank step 0 (or any step far below): the distance back plus
// the steps held wrapped past 2^64 and passed the lag check.
TEST(StepDigests, AStepFarBelowAStepNearTheTopOfUint64IsDropped) {
  constexpr uint64_t kTop = std::numeric_limits<uint64_t>::max();
  StepDigests<Digest> d(64);
  ASSERT_NE(d.Get(0, kTop - 1), nullptr);
  ASSERT_NE(d.Get(0, kTop), nullptr);
  EXPECT_EQ(d.size(), 2u);
  EXPECT_EQ(d.Get(0, 0), nullptr);
  EXPECT_EQ(d.Get(0, kTop - 100), nullptr);  // more than the lag back
  EXPECT_NE(d.Get(0, kTop - 10), nullptr);   // within it: held
  EXPECT_EQ(d.size(), 11u);  // kTop - 10 .. kTop
}

}  // namespace
}  // namespace trainwatch
