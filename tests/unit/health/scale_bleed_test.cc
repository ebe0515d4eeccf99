// ScaleBleed, LossScaleCollapse's slow-bleed rule (docs/detectors.md), on
// synthetic loss-scale traces.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "health/signals/scale_bleed.h"

namespace trainwatch {
namespace {

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

}  // namespace
}  // namespace trainwatch
