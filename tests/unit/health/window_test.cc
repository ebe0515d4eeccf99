// StepRing, OrderStatWindow, ValueWindow, FlagWindow and SelectKth against
// brute force.
#include "health/signals/window.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "health/signals/select.h"

namespace trainwatch {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The nearest-rank q-quantile of `values`, by sorting.
std::optional<double> BruteQuantile(std::vector<double> values, double q) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  size_t rank = static_cast<size_t>(std::ceil(q * values.size()));
  return values[rank == 0 ? 0 : rank - 1];
}

// A window kept the slow way: every (step, value) in order.
class BruteWindow {
 public:
  explicit BruteWindow(size_t capacity) : capacity_(capacity) {}
  void Push(uint64_t step, double value) {
    entries_.emplace_back(step, value);
    if (entries_.size() > capacity_) entries_.pop_front();
  }
  void RewindTo(uint64_t step) {
    while (!entries_.empty() && entries_.back().first >= step) {
      entries_.pop_back();
    }
  }
  std::vector<double> Finite() const {
    std::vector<double> out;
    for (const auto& [step, value] : entries_) {
      if (std::isfinite(value)) out.push_back(value);
    }
    return out;
  }
  size_t slots() const { return entries_.size(); }

 private:
  size_t capacity_;
  std::deque<std::pair<uint64_t, double>> entries_;
};

template <typename Window>
void ExpectSame(const Window& window, const BruteWindow& brute) {
  std::vector<double> finite = brute.Finite();
  ASSERT_EQ(window.slots(), brute.slots());
  ASSERT_EQ(window.ranked(), finite.size());
  for (double q : {0.0, 0.01, 0.25, 0.5, 0.75, 0.98, 1.0}) {
    EXPECT_EQ(window.Quantile(q), BruteQuantile(finite, q)) << "q=" << q;
  }
  EXPECT_EQ(window.Median(), BruteQuantile(finite, 0.5));
  EXPECT_EQ(window.Max(), BruteQuantile(finite, 1.0));
}

// The two value windows answer alike: OrderStatWindow from its sorted copy,
// ValueWindow by selection.
template <typename Window>
class BothWindows : public testing::Test {};
using WindowTypes = testing::Types<OrderStatWindow, ValueWindow>;
TYPED_TEST_SUITE(BothWindows, WindowTypes);

// SelectKth is nth_element's value without reordering its input: sizes
// around its small-range cutoff, ties everywhere, one value, heavy tails,
// floats as well as doubles.
TEST(SelectKth, EqualsNthElementAndLeavesItsInputAlone) {
  std::mt19937_64 rng(5);
  std::cauchy_distribution<double> cauchy(0.0, 1.0);
  for (int i = 0; i < 20000; ++i) {
    const size_t n = 1 + rng() % (i % 10 == 0 ? 3000 : 60);
    std::vector<double> v(n);
    for (double& x : v) {
      switch (i % 4) {
        case 0: x = static_cast<double>(rng() % 5); break;  // many ties
        case 1: x = cauchy(rng); break;
        case 2: x = 1.0; break;
        default: x = static_cast<double>(rng() % 100000) - 50000; break;
      }
    }
    const size_t k = rng() % n;
    const std::vector<double> input = v;
    std::vector<double> expected = v;
    std::nth_element(expected.begin(), expected.begin() + k, expected.end());
    ASSERT_EQ(SelectKth(v.data(), n, k), expected[k]) << "n=" << n << " k=" << k;
    ASSERT_EQ(v, input);
    std::vector<float> f(v.begin(), v.end());
    std::vector<float> fe = f;
    std::nth_element(fe.begin(), fe.begin() + n / 2, fe.end());
    ASSERT_EQ(MedianOf(f.data(), n), fe[n / 2]) << "n=" << n;
  }
}

TEST(StepRing, KeepsTheLastStepsOldestFirstAcrossWrapAround) {
  StepRing ring(4);
  for (uint64_t step = 10; step < 17; ++step) ring.Append(step);
  ASSERT_EQ(ring.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(ring.StepAt(ring.Slot(i)), 13 + i);
  ring.PopNewest();
  EXPECT_EQ(ring.StepAt(ring.newest_slot()), 15u);
  EXPECT_EQ(ring.StepAt(ring.Append(20)), 20u);
  EXPECT_EQ(ring.StepAt(ring.oldest_slot()), 13u);
}

TEST(StepRing, KeepsAnyStepOrderExactlyAcrossRebasesAndSpansPastTwoToThe32) {
  StepRing ring(3);
  const uint64_t big = uint64_t{1} << 32;
  ring.Append(100);
  ring.Append(7);            // below the base: rebases
  ring.Append(big + 6);      // 2^32 - 1 past step 7: still 32-bit
  EXPECT_EQ(ring.StepAt(ring.Slot(0)), 100u);
  EXPECT_EQ(ring.StepAt(ring.Slot(1)), 7u);
  EXPECT_EQ(ring.StepAt(ring.Slot(2)), big + 6);
  ring.Append(~uint64_t{0});  // evicts 100; 7 .. 2^64-1: 64-bit steps
  EXPECT_EQ(ring.StepAt(ring.Slot(0)), 7u);
  EXPECT_EQ(ring.StepAt(ring.Slot(1)), big + 6);
  EXPECT_EQ(ring.StepAt(ring.Slot(2)), ~uint64_t{0});
  ring.Clear();
  ring.Append(5);
  EXPECT_EQ(ring.StepAt(ring.newest_slot()), 5u);
}

TEST(StepRing, RebasesItsSixteenBitOffsetsAndWidensPastTwoToThe16) {
  StepRing ring(3);
  ring.Append(10);
  ring.Append(10 + 65535);  // the widest 16-bit offset
  ring.Append(70000);       // 69,990 past the oldest: 32-bit offsets
  EXPECT_EQ(ring.StepAt(ring.Slot(0)), 10u);
  EXPECT_EQ(ring.StepAt(ring.Slot(1)), 65545u);
  EXPECT_EQ(ring.StepAt(ring.Slot(2)), 70000u);
  // Steps that move on by 1,000 a push: every slot exact over 2^20 steps,
  // through rebases of whichever width the ring holds.
  ring.Clear();
  for (uint64_t s = 0; s < (uint64_t{1} << 20); s += 1000) {
    ring.Append(s);
    EXPECT_EQ(ring.StepAt(ring.newest_slot()), s);
    if (ring.size() == 3) ASSERT_EQ(ring.StepAt(ring.oldest_slot()), s - 2000);
  }
}

// What the engine can do: steps that go down when the lead moves to a lower
// rank, and steps anywhere in 64 bits. The window stays exact throughout.
TYPED_TEST(BothWindows, MatchesBruteForceWithStepsInAnyOrder) {
  std::mt19937_64 rng(11);
  const size_t kCapacity = 16;
  TypeParam window(kCapacity);
  BruteWindow brute(kCapacity);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t r = rng() % 100;
    uint64_t step = rng() % 50;
    if (r < 10) step = ~uint64_t{0} - rng() % 50;
    if (r >= 10 && r < 15) step = (uint64_t{1} << 32) + rng() % 50;
    if (r >= 15 && r < 20) step = (uint64_t{1} << 16) + rng() % 50;
    if (r < 3) {
      window.RewindTo(step);
      brute.RewindTo(step);
    } else {
      const double v = r < 20 ? kNaN : static_cast<double>(rng() % 20);
      window.Push(step, v);
      brute.Push(step, v);
    }
    ExpectSame(window, brute);
    if (this->HasFatalFailure()) return;
  }
}

// Windows larger than SortedBlocks' blocks: splits, merges and emptied
// blocks on noise, ties, a ramp (every value lands in the last block) and
// rewinds of up to a thousand steps.
TYPED_TEST(BothWindows, MatchesBruteForceAcrossManyBlocks) {
  std::mt19937_64 rng(9);
  std::lognormal_distribution<double> noise(0.0, 1.0);
  const size_t kCapacity = 1000;
  TypeParam window(kCapacity);
  BruteWindow brute(kCapacity);
  uint64_t step = 0;
  for (int i = 0; i < 60000; ++i) {
    const int phase = (i / 5000) % 4;
    if (rng() % 1000 == 0 && step > 0) {
      step -= 1 + rng() % std::min<uint64_t>(step, 1000);
      window.RewindTo(step);
      brute.RewindTo(step);
    } else {
      double v = noise(rng);
      if (phase == 1) v = static_cast<double>(rng() % 3);  // ties
      if (phase == 2) v = static_cast<double>(i);          // a ramp up
      if (phase == 3) v = -static_cast<double>(i);         // and down
      window.Push(step, v);
      brute.Push(step, v);
      ++step;
    }
    if (i % 97 == 0) {
      ExpectSame(window, brute);
      if (this->HasFatalFailure()) return;
    }
  }
  ExpectSame(window, brute);
}

TYPED_TEST(BothWindows, QuantilesAreNearestRank) {
  TypeParam window(10);
  EXPECT_EQ(window.Median(), std::nullopt);
  EXPECT_EQ(window.Max(), std::nullopt);
  for (uint64_t step = 0; step < 4; ++step) window.Push(step, 4.0 - step);
  // Values 1 2 3 4: the median is the 2nd smallest (ceil(0.5 * 4) = 2).
  EXPECT_EQ(window.Median(), 2.0);
  EXPECT_EQ(window.Quantile(0.0), 1.0);
  EXPECT_EQ(window.Quantile(0.26), 2.0);
  EXPECT_EQ(window.Quantile(1.0), 4.0);
  EXPECT_EQ(window.Quantile(-1.0), 1.0);  // q is clamped to [0, 1]
  EXPECT_EQ(window.Quantile(2.0), 4.0);
  window.Push(4, 5.0);
  EXPECT_EQ(window.Median(), 3.0);  // 1 2 3 4 5
}

TYPED_TEST(BothWindows, NonFiniteValuesTakeASlotButAreNotRanked) {
  TypeParam window(3);
  window.Push(0, kNaN);
  EXPECT_EQ(window.slots(), 1u);
  EXPECT_EQ(window.ranked(), 0u);
  EXPECT_EQ(window.Median(), std::nullopt);
  window.Push(1, 2.0);
  window.Push(2, kInf);
  EXPECT_EQ(window.slots(), 3u);
  EXPECT_EQ(window.ranked(), 1u);
  EXPECT_EQ(window.Max(), 2.0);
  // Pushing evicts the NaN (oldest), not a ranked value.
  window.Push(3, 1.0);
  EXPECT_EQ(window.slots(), 3u);
  EXPECT_EQ(window.ranked(), 2u);
  EXPECT_EQ(window.Quantile(0.0), 1.0);
  window.Push(4, -kInf);
  window.Push(5, kNaN);
  EXPECT_EQ(window.ranked(), 1u);  // 1.0, -Inf, NaN
  EXPECT_EQ(window.Max(), 1.0);
  window.Push(6, kNaN);
  EXPECT_EQ(window.slots(), 3u);
  EXPECT_EQ(window.ranked(), 0u);
  EXPECT_EQ(window.Max(), std::nullopt);
}

TYPED_TEST(BothWindows, MatchesBruteForceWithEvictionAndRewind) {
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> norm(std::log(0.35), 0.4);
  const size_t kCapacity = 64;
  TypeParam window(kCapacity);
  BruteWindow brute(kCapacity);
  uint64_t step = 0;
  int rewinds = 0;
  for (int i = 0; i < 5000; ++i) {
    const uint64_t r = rng() % 100;
    if (r < 2 && step > 0) {
      // A restart from a checkpoint up to 100 steps back, then resume there.
      uint64_t back = 1 + rng() % std::min<uint64_t>(step, 100);
      step -= back;
      window.RewindTo(step);
      brute.RewindTo(step);
      ++rewinds;
    } else {
      double v;
      if (r < 6) {
        v = kNaN;
      } else if (r < 8) {
        v = (r % 2 ? 1 : -1) * kInf;
      } else if (r < 20) {
        v = 1.0;  // repeated values: ties broken by step
      } else {
        v = norm(rng);
      }
      window.Push(step, v);
      brute.Push(step, v);
      ++step;
    }
    ExpectSame(window, brute);
    if (this->HasFatalFailure()) return;
  }
  EXPECT_GT(rewinds, 50);
  window.Clear();
  EXPECT_EQ(window.slots(), 0u);
  EXPECT_EQ(window.ranked(), 0u);
  window.Push(step, 3.0);
  EXPECT_EQ(window.Median(), 3.0);
}

TYPED_TEST(BothWindows, RewindBeforeEveryStepEmptiesIt) {
  TypeParam window(10);
  for (uint64_t step = 100; step < 120; ++step) window.Push(step, step * 1.0);
  window.RewindTo(115);
  EXPECT_EQ(window.slots(), 5u);  // 110..114
  EXPECT_EQ(window.Max(), 114.0);
  EXPECT_EQ(window.Quantile(0.0), 110.0);
  window.RewindTo(0);
  EXPECT_EQ(window.slots(), 0u);
  EXPECT_EQ(window.ranked(), 0u);
}

// Found by ingest_fuzzer: when the lead moves to a lower rank, the engine
// pushes that rank's steps, which may repeat a step (and, the norm being
// global, its value) already in the window. Evicting one copy must keep the
// other ranked.
TYPED_TEST(BothWindows, TheSameStepAndValueTwiceAreTwoValues) {
  TypeParam window(2);
  window.Push(5, 1.0);
  window.Push(5, 1.0);
  window.Push(6, 2.0);  // evicts one (5, 1.0)
  EXPECT_EQ(window.slots(), 2u);
  EXPECT_EQ(window.ranked(), 2u);
  EXPECT_EQ(window.Quantile(0.0), 1.0);
  window.Push(7, 3.0);  // evicts the other
  EXPECT_EQ(window.ranked(), 2u);
  EXPECT_EQ(window.Quantile(0.0), 2.0);
  window.RewindTo(0);
  EXPECT_EQ(window.ranked(), 0u);
}

TYPED_TEST(BothWindows, ZeroCapacityHoldsNothing) {
  TypeParam window(0);
  window.Push(0, 1.0);
  EXPECT_EQ(window.slots(), 0u);
  EXPECT_EQ(window.Median(), std::nullopt);
}

TEST(FlagWindow, CountMatchesBruteForceWithEvictionAndRewind) {
  std::mt19937_64 rng(3);
  const size_t kCapacity = 100;
  FlagWindow window(kCapacity);
  std::deque<std::pair<uint64_t, bool>> brute;
  uint64_t step = 0;
  for (int i = 0; i < 20000; ++i) {
    if (rng() % 100 == 0 && step > 0) {
      step -= 1 + rng() % std::min<uint64_t>(step, 150);
      window.RewindTo(step);
      while (!brute.empty() && brute.back().first >= step) brute.pop_back();
    } else {
      bool flag = rng() % 10 < 3;
      window.Push(step, flag);
      brute.emplace_back(step, flag);
      if (brute.size() > kCapacity) brute.pop_front();
      ++step;
    }
    size_t count = std::count_if(brute.begin(), brute.end(),
                                 [](const auto& e) { return e.second; });
    ASSERT_EQ(window.size(), brute.size());
    ASSERT_EQ(window.count(), count);
    ASSERT_DOUBLE_EQ(window.fraction(),
                     brute.empty() ? 0.0 : double(count) / brute.size());
  }
  window.Clear();
  EXPECT_EQ(window.size(), 0u);
  EXPECT_EQ(window.count(), 0u);
  EXPECT_EQ(window.fraction(), 0.0);
}

TEST(RunWindow, RewindToRewindsEverySeries) {
  RunWindow w(10);
  for (uint64_t step = 0; step < 10; ++step) {
    w.grad_norm.Push(step, 1.0);
    w.clipped.Push(true);
    w.skipped.Push(step % 2 == 0);
    w.max_attn_logit.Push(step, 2.0);
    w.log_z.Push(step, 3.0);
  }
  w.RewindTo(6);
  EXPECT_EQ(w.grad_norm.slots(), 6u);
  EXPECT_EQ(w.clipped.count(), 6u);
  EXPECT_EQ(w.skipped.count(), 3u);  // steps 0, 2, 4
  EXPECT_EQ(w.skipped.size(), 6u);
  EXPECT_EQ(w.max_attn_logit.slots(), 6u);
  EXPECT_EQ(w.log_z.slots(), 6u);
}

}  // namespace
}  // namespace trainwatch
