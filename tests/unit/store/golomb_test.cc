// BestGolomb against pricing every choice by brute force: the cost it
// returns is what its codes take, and no other k (or zero flags) is cheaper.
#include "store/codec/golomb.h"

#include <algorithm>
#include <cstdint>
#include <random>

#include "gtest/gtest.h"

namespace trainwatch::codec {
namespace {

// PutGolomb's length for a value of bit width w at order k.
uint64_t CodeBits(int w, int k) {
  const int n = std::max(0, w - k);
  return n == 0 ? k + 1 : 2 * n + k;
}

// The bits of every value of `hist` (widths before the shift) under (k, flags).
uint64_t Cost(const WidthHistogram& hist, int shift, int k, bool zero_flags) {
  uint64_t bits = 0;
  for (int b = 0; b <= 64; ++b) {
    const int w = b == 0 ? 0 : std::max(0, b - shift);
    const uint64_t each = zero_flags ? (w == 0 ? 1 : 1 + CodeBits(w, k)) : CodeBits(w, k);
    bits += hist[b] * each;
  }
  return bits;
}

TEST(BestGolomb, IsTheCheapestOfEveryChoicePricedByBruteForce) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 20000; ++trial) {
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    WidthHistogram hist{};
    const int shift = trial % 4 == 0 ? static_cast<int>(rng() % 8) : 0;
    // Values around one width (a column's residuals), sometimes many zeros,
    // sometimes an outlier, sometimes nothing at all.
    const int centre = static_cast<int>(rng() % 65);
    const int values = static_cast<int>(rng() % 200);
    for (int i = 0; i < values; ++i) {
      int w = std::clamp(centre + static_cast<int>(rng() % 7) - 3, 0, 64);
      if (rng() % 20 == 0) w = static_cast<int>(rng() % 65);
      if (w > 0 && w <= shift) w = shift + 1;  // a shifted column's values keep `shift` bits
      ++hist[w];
    }
    if (rng() % 3 == 0) hist[0] += static_cast<uint32_t>(rng() % 300);
    const bool allow = rng() % 4 != 0;
    const GolombChoice got = BestGolomb(hist, shift, allow);
    ASSERT_EQ(got.cost, Cost(hist, shift, got.k, got.zero_flags));
    ASSERT_TRUE(allow || !got.zero_flags);
    for (int k = 0; k <= 63; ++k) {
      ASSERT_LE(got.cost, Cost(hist, shift, k, false)) << "k " << k;
      if (allow && hist[0] > 0) {
        ASSERT_LE(got.cost, Cost(hist, shift, k, true)) << "k " << k;
      }
    }
  }
}

}  // namespace
}  // namespace trainwatch::codec
