// TrendForecaster (docs/detectors.md: the forecasts of AttentionLogitGrowth
// and LogZDrift) on synthetic signals with fixed seeds.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "health/signals/trend_forecast.h"

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

}  // namespace
}  // namespace trainwatch
