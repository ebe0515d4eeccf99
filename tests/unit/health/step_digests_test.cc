// StepDigests: the per-step digests the cross-rank checks judge once, in step
// order (docs/architecture.md#arrival-order).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "health/signals/step_digests.h"

namespace trainwatch {
namespace {

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
