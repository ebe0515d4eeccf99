// The norm detectors (ClipFractionHigh, GradNormSpike, GradNormDrift,
// PostClipNormReported, AttentionLogitGrowth, LogZDrift) on synthetic runs,
// through the real RunHealth, detectors and alert tracker. Expected steps are
// computed here from what was fed, never hard-coded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <numbers>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "health/alert_catalog.h"
#include "health_test_util.h"

namespace trainwatch {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::trainwatch::testing::HealthHarness;
using ::trainwatch::testing::Rec;

constexpr AlertKind kNormKinds[] = {
    AlertKind::kClipFractionHigh,     AlertKind::kGradNormSpike,
    AlertKind::kGradNormDrift,        AlertKind::kPostClipNormReported,
    AlertKind::kAttentionLogitGrowth, AlertKind::kLogZDrift,
};

// A typical norm of 0.35 whose 99th percentile is near 0.8.
constexpr double kTypicalNorm = 0.35;
const double kTypicalSigma = std::log(0.8 / 0.35) / 2.326;

RunInfo Bf16Run(uint64_t warmup_steps, double max_norm = 1.0) {
  return RunInfo{.run_id = "test-run",
                 .precision = v1::BF16,
                 .max_norm = max_norm,
                 .warmup_steps = warmup_steps};
}

// Seeded noise.
class Noise {
 public:
  explicit Noise(uint64_t seed) : rng_(seed) {}
  double Normal(double mean, double sd) { return mean + sd * z_(rng_); }
  // Lognormal with the given median and log-space sigma.
  double Lognormal(double median, double sigma) {
    return median * std::exp(sigma * z_(rng_));
  }

 private:
  std::mt19937_64 rng_;
  std::normal_distribution<double> z_;
};

// The last `capacity` values of a series, the slow way.
class SlowWindow {
 public:
  explicit SlowWindow(size_t capacity) : capacity_(capacity) {}
  void Push(double value) {
    values_.push_back(value);
    if (values_.size() > capacity_) values_.pop_front();
  }
  size_t size() const { return values_.size(); }
  bool full() const { return values_.size() == capacity_; }
  // Nearest rank, as OrderStatWindow defines it.
  double Median() const {
    std::vector<double> v(values_.begin(), values_.end());
    size_t rank = static_cast<size_t>(std::ceil(0.5 * v.size()));
    auto nth = v.begin() + (rank == 0 ? 0 : rank - 1);
    std::nth_element(v.begin(), nth, v.end());
    return *nth;
  }
  size_t Count(const std::function<bool(double)>& pred) const {
    return std::count_if(values_.begin(), values_.end(), pred);
  }

 private:
  size_t capacity_;
  std::deque<double> values_;
};

// The episodes the alert tracker should make of a condition: it fires on the
// first step it holds and resolves resolve_after steps after it last held.
class EpisodeModel {
 public:
  explicit EpisodeModel(
      uint64_t resolve_after = HealthConfig{}.resolve_after_steps)
      : resolve_after_(resolve_after) {}

  void Step(uint64_t step, bool holds) {
    if (holds) {
      if (!firing_) fired.push_back(step);
      firing_ = true;
      last_true_ = step;
    }
    if (firing_ && step >= last_true_ + resolve_after_) {
      resolved.push_back(step);
      firing_ = false;
    }
  }

  std::vector<uint64_t> fired;
  std::vector<uint64_t> resolved;

 private:
  uint64_t resolve_after_;
  bool firing_ = false;
  uint64_t last_true_ = 0;
};

std::vector<uint64_t> Steps(
    const std::vector<::trainwatch::testing::Transition>& ts) {
  std::vector<uint64_t> out;
  for (const auto& t : ts) out.push_back(t.step);
  return out;
}

void ExpectEpisodes(const HealthHarness& h, AlertKind kind,
                    const EpisodeModel& model) {
  EXPECT_EQ(Steps(h.Fired(kind)), model.fired) << Spec(kind).name;
  EXPECT_EQ(Steps(h.Resolved(kind)), model.resolved) << Spec(kind).name;
}

void ExpectNoNormAlert(const HealthHarness& h) {
  for (AlertKind kind : kNormKinds) {
    EXPECT_THAT(h.Fired(kind), IsEmpty()) << Spec(kind).name;
  }
}

// ---------------------------------------------------------------- spikes

TEST(GradNormSpike, FiresOnceOnAnIsolatedSpikeAndResolves) {
  constexpr uint64_t kSpikeStep = 41'200;
  HealthHarness h(Bf16Run(/*warmup_steps=*/1000));
  Noise noise(1);
  for (uint64_t step = 0; step < 45'000; ++step) {
    double norm = noise.Lognormal(kTypicalNorm, kTypicalSigma);
    h.Lead(Rec(step, step == kSpikeStep ? 9.6 : norm));
  }

  auto fired = h.Fired(AlertKind::kGradNormSpike);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].step, kSpikeStep);
  EXPECT_EQ(fired[0].batch_ids,
            std::vector<int64_t>{static_cast<int64_t>(kSpikeStep) * 10});
  EXPECT_DOUBLE_EQ(fired[0].peak, 9.6);

  ASSERT_EQ(h.spikes.size(), 1u);
  const SpikeInfo& spike = h.spikes[0];
  EXPECT_EQ(spike.step, kSpikeStep);
  EXPECT_DOUBLE_EQ(spike.grad_norm, 9.6);
  EXPECT_EQ(spike.batch_ids, fired[0].batch_ids);
  // 9.6 / 0.35 = 27.4; the EMA's geometric mean is near the median 0.35.
  EXPECT_NEAR(spike.ratio_to_ema, 9.6 / kTypicalNorm, 2.0);
  EXPECT_NEAR(spike.sigmas, std::log(9.6 / kTypicalNorm) / kTypicalSigma, 1.5);
  EXPECT_THAT(fired[0].description,
              HasSubstr(absl::StrFormat(
                  "grad norm 9.6 at step 41200 is %.1fx the EMA geometric "
                  "mean %.3g (%.1f sd above in log space)",
                  spike.ratio_to_ema, 9.6 / spike.ratio_to_ema, spike.sigmas)));

  auto resolved = h.Resolved(AlertKind::kGradNormSpike);
  ASSERT_EQ(resolved.size(), 1u);
  EXPECT_EQ(resolved[0].step, kSpikeStep + h.config().resolve_after_steps);

  // max_norm 1.0 clips about 0.15% of these steps.
  EXPECT_THAT(h.Fired(AlertKind::kClipFractionHigh), IsEmpty());
  EXPECT_GT(h.health().window().clipped.count(), 0u);
}

TEST(GradNormSpike, SilentOnHealthyLognormalNoise) {
  for (uint64_t seed : {1, 2, 3, 4, 5}) {
    HealthHarness h(Bf16Run(/*warmup_steps=*/1000));
    Noise noise(seed);
    for (uint64_t step = 0; step < 45'000; ++step) {
      h.Lead(Rec(step, noise.Lognormal(kTypicalNorm, kTypicalSigma)));
    }
    EXPECT_THAT(h.spikes, IsEmpty()) << "seed " << seed;
    ExpectNoNormAlert(h);
  }
}

// The first spike enters the EMA clamped to 3 sd, so a smaller spike right
// after it is still seen. Unclamped, the 100x spike would raise the sd from
// 0.2 to about 0.5 and hide the 6x one (under 6 sd and under 10x).
TEST(GradNormSpike, AFollowingSpikeIsNotMaskedByTheFirst) {
  constexpr uint64_t kFirst = 2000, kSecond = 2010;
  HealthHarness h(Bf16Run(/*warmup_steps=*/100));
  Noise noise(11);
  for (uint64_t step = 0; step < 3000; ++step) {
    double norm = noise.Lognormal(kTypicalNorm, 0.2);
    if (step == kFirst) norm = 100 * kTypicalNorm;
    if (step == kSecond) norm = 6 * kTypicalNorm;
    h.Lead(Rec(step, norm));
  }
  ASSERT_EQ(h.spikes.size(), 2u);
  EXPECT_EQ(h.spikes[0].step, kFirst);
  EXPECT_EQ(h.spikes[1].step, kSecond);
  EXPECT_GT(h.spikes[1].sigmas, 6.0);
  // One episode, extended by the second spike.
  auto fired = h.Fired(AlertKind::kGradNormSpike);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].step, kFirst);
  EXPECT_EQ(Steps(h.Resolved(AlertKind::kGradNormSpike)),
            std::vector<uint64_t>{kSecond + h.config().resolve_after_steps});
  EXPECT_EQ(h.health().tracker().episode(AlertKind::kGradNormSpike).batch_ids,
            (std::vector<int64_t>{kFirst * 10, kSecond * 10}));
}

// NaN, Inf and zero norms are neither spikes nor EMA input: a later spike is
// still measured against the healthy EMA.
TEST(GradNormSpike, NonFiniteAndZeroNormsAreNotSpikes) {
  constexpr uint64_t kSpike = 5000;
  HealthHarness h(Bf16Run(/*warmup_steps=*/100));
  Noise noise(5);
  for (uint64_t step = 0; step < 6000; ++step) {
    double norm = noise.Lognormal(kTypicalNorm, kTypicalSigma);
    if (step % 500 == 250) norm = std::numeric_limits<double>::quiet_NaN();
    if (step % 500 == 260) norm = std::numeric_limits<double>::infinity();
    if (step % 500 == 270) norm = 0.0;
    if (step == kSpike) norm = 9.6;
    h.Lead(Rec(step, norm));
  }
  ASSERT_EQ(h.spikes.size(), 1u);
  EXPECT_EQ(h.spikes[0].step, kSpike);
  EXPECT_NEAR(h.spikes[0].ratio_to_ema, 9.6 / kTypicalNorm, 2.0);
}

// Warmup norms and the first spike.min_steps post-warmup norms (which start
// the EMA) are never flagged; the same norm later is.
TEST(GradNormSpike, NotJudgedDuringWarmupOrBeforeTheEmaStarts) {
  const HealthConfig config;
  constexpr uint64_t kWarmup = 500;
  HealthHarness h(Bf16Run(kWarmup));
  Noise noise(9);
  const uint64_t during_init = kWarmup + config.spike.min_steps / 2;
  constexpr uint64_t kJudged = 2500;
  for (uint64_t step = 0; step < 3000; ++step) {
    double norm = noise.Lognormal(kTypicalNorm, kTypicalSigma);
    if (step == 10 || step == during_init || step == kJudged) norm = 50.0;
    h.Lead(Rec(step, norm));
  }
  ASSERT_EQ(h.spikes.size(), 1u);
  EXPECT_EQ(h.spikes[0].step, kJudged);
  EXPECT_EQ(Steps(h.Fired(AlertKind::kGradNormSpike)),
            std::vector<uint64_t>{kJudged});
}

// ------------------------------------------------- clip fraction and drift

// The clip fraction climbs from 1% to 40% over 20,000 steps while the median
// norm creeps from 0.35 to 1.3 (geometrically), then the run recovers. With
// one lognormal sigma for the whole run, both endpoints fix max_norm: the
// 99th percentile of the start and the 60th of the end. (At max_norm 1.0 a
// median of 1.3 would clip more than half of the steps.)
TEST(ClipFractionHigh, NamesACreepNoLaterThanTheWindowFractionWithoutFlapping) {
  constexpr double kStartMedian = 0.35, kEndMedian = 1.3;
  constexpr double kZ99 = 2.326348, kZ60 = 0.253347;
  const double sigma = std::log(kEndMedian / kStartMedian) / (kZ99 - kZ60);
  const double max_norm = kStartMedian * std::exp(kZ99 * sigma);
  constexpr uint64_t kWarmup = 1000, kFlat = 2000, kRamp = 20'000, kHold = 500,
                     kRecover = 3000;

  HealthHarness h(Bf16Run(kWarmup, max_norm));
  const HealthConfig& config = h.config();
  Noise noise(21);
  SlowWindow clipped(config.window_steps), norms(config.window_steps);
  EpisodeModel clip_model, drift_model;
  std::optional<double> baseline;
  uint64_t baseline_through = 0;
  size_t count_at_fire = 0;
  for (uint64_t step = 0; step < kWarmup + kFlat + kRamp + kHold + kRecover;
       ++step) {
    double median = kStartMedian;
    if (step >= kWarmup + kFlat && step < kWarmup + kFlat + kRamp + kHold) {
      double t = std::min(1.0, (step - kWarmup - kFlat) / double(kRamp));
      median = kStartMedian * std::pow(kEndMedian / kStartMedian, t);
    }
    const v1::StepRecord r =
        Rec(step, noise.Lognormal(median, sigma), max_norm);
    h.Lead(r);
    if (step < kWarmup) continue;

    clipped.Push(r.clipped() ? 1 : 0);
    norms.Push(r.grad_norm());
    const size_t count = clipped.Count([](double c) { return c > 0; });
    const bool clip_holds = clipped.size() >= config.clip_fraction.min_steps &&
                            static_cast<double>(count) / clipped.size() >
                                config.clip_fraction.threshold;
    if (clip_holds && clip_model.fired.empty()) count_at_fire = count;
    clip_model.Step(step, clip_holds);

    if (!baseline.has_value() && norms.full()) {
      baseline = norms.Median();
      baseline_through = step;
    }
    drift_model.Step(step,
                     baseline.has_value() && step > baseline_through &&
                         norms.Median() / *baseline >= config.drift.ratio);
  }

  // The fraction climbs by ~0.3% per 100 steps, less than its noise: the
  // windowed fraction alone would flap around 5% (the model). Change
  // detection names the creep no later, and hysteresis keeps it to at most
  // two episodes, the last resolving after the recovery.
  ASSERT_FALSE(clip_model.fired.empty());
  (void)count_at_fire;
  auto fired = h.Fired(AlertKind::kClipFractionHigh);
  ASSERT_FALSE(fired.empty());
  EXPECT_GT(fired[0].step, kWarmup + kFlat);  // during the ramp
  EXPECT_LE(fired[0].step, clip_model.fired[0]);
  EXPECT_LE(fired.size(), 2u);
  ASSERT_EQ(h.Resolved(AlertKind::kClipFractionHigh).size(), fired.size());
  EXPECT_GT(h.Resolved(AlertKind::kClipFractionHigh).back().step,
            kWarmup + kFlat + kRamp + kHold);
  EXPECT_THAT(fired[0].description,
              HasSubstr(absl::StrFormat("clipped at max_norm %g", max_norm)));
  EXPECT_THAT(fired[0].description, HasSubstr("; recommended max_norm (p98) "));
  // The peak of the last episode: the window fraction near the end, ~40%.
  EXPECT_GE(h.Resolved(AlertKind::kClipFractionHigh).back().peak, 0.3);

  // The norm's level passes 2x during the ramp: named once, no later than
  // the window median.
  ASSERT_FALSE(drift_model.fired.empty());
  (void)baseline_through;
  auto drift = h.Fired(AlertKind::kGradNormDrift);
  ASSERT_THAT(drift, ::testing::SizeIs(1));
  EXPECT_GT(drift[0].step, kWarmup + kFlat);
  EXPECT_LE(drift[0].step, drift_model.fired[0]);
  EXPECT_THAT(drift[0].description,
              HasSubstr(absl::StrFormat("x the baseline median %.2g", *baseline)));
  EXPECT_GE(h.Resolved(AlertKind::kGradNormDrift).back().peak, 2.0);

  // With a log-space sigma of 0.63, 10x the geometric mean is only 3.6 sd:
  // the hard-ratio rule flags a few tail values (about 1 in 7000 steps).
  for (const SpikeInfo& spike : h.spikes) {
    EXPECT_GE(spike.ratio_to_ema, 10.0);
    EXPECT_LT(spike.sigmas, 6.0);
  }
}

TEST(ClipFractionHigh, SilentOnAHealthyRunWithTheSameNoise) {
  HealthHarness h(Bf16Run(/*warmup_steps=*/1000));
  Noise noise(21);
  for (uint64_t step = 0; step < 26'500; ++step) {
    h.Lead(Rec(step, noise.Lognormal(kTypicalNorm, kTypicalSigma)));
  }
  ExpectNoNormAlert(h);
}

// ------------------------------------------------------- post-clip norms

// The post-clip norm a trainer would log: norm * max_norm / (norm + 1e-6)
// when clipped, recomputed in fp32.
double PostClipNorm(double norm, double max_norm) {
  double coef = std::min(1.0, max_norm / (norm + 1e-6));
  return static_cast<float>(norm * coef);
}

// With max_norm 0.01 the 1e-6 in clip_grad_norm_'s coefficient leaves the
// capped norms up to 1e-4 (relative) under max_norm: still "at max_norm".
TEST(PostClipNormReported, FiresOnNormsCappedAtMaxNormAndResolvesOnceFixed) {
  constexpr uint64_t kWarmup = 100, kCapped = 3000, kFixed = 3000;
  for (double max_norm : {1.0, 0.01}) {
    SCOPED_TRACE(absl::StrFormat("max_norm %g", max_norm));
    HealthHarness h(Bf16Run(kWarmup, max_norm));
    const HealthConfig& config = h.config();
    Noise noise(31);
    // What the test knows: which reported norms were capped, and which real
    // ones exceed max_norm.
    SlowWindow capped(config.window_steps), above(config.window_steps);
    EpisodeModel model;
    size_t pile_at_fire = 0;
    for (uint64_t step = 0; step < kWarmup + kCapped + kFixed; ++step) {
      // About 29% of these norms exceed max_norm.
      const double norm = noise.Lognormal(0.8 * max_norm, 0.4);
      const bool capping = step < kWarmup + kCapped;
      h.Lead(
          Rec(step, capping ? PostClipNorm(norm, max_norm) : norm, max_norm));
      if (step < kWarmup) continue;
      capped.Push(capping && norm > max_norm);
      above.Push(!capping && norm > max_norm);
      const size_t pile = capped.Count([](double c) { return c > 0; });
      const bool holds = capped.size() >= config.post_clip.min_steps &&
                         above.Count([](double a) { return a > 0; }) == 0 &&
                         pile >= config.post_clip.min_pile &&
                         static_cast<double>(pile) / capped.size() >=
                             config.post_clip.pile_fraction;
      if (holds && model.fired.empty()) pile_at_fire = pile;
      model.Step(step, holds);
    }
    ASSERT_EQ(model.fired.size(), 1u);
    EXPECT_EQ(model.fired[0], kWarmup + config.post_clip.min_steps - 1);
    ASSERT_EQ(model.resolved.size(), 1u);
    ExpectEpisodes(h, AlertKind::kPostClipNormReported, model);
    auto fired = h.Fired(AlertKind::kPostClipNormReported);
    ASSERT_EQ(fired.size(), 1u);
    EXPECT_THAT(fired[0].description,
                HasSubstr(absl::StrFormat(
                    "none of the last 100 post-warmup norms exceeds max_norm "
                    "%g",
                    max_norm)));
    EXPECT_THAT(fired[0].description,
                HasSubstr(absl::StrFormat("and %d of them (%.1f%%) sit at "
                                          "max_norm",
                                          pile_at_fire, pile_at_fire * 1.0)));
    // Capped norms hide clipping: ClipFractionHigh (29% of real norms clip)
    // only fires once the real norms are reported.
    auto clip = h.Fired(AlertKind::kClipFractionHigh);
    ASSERT_EQ(clip.size(), 1u);
    EXPECT_GE(clip[0].step, kWarmup + kCapped);
  }
}

TEST(PostClipNormReported, SilentOnRealPreClipNorms) {
  HealthHarness h(Bf16Run(/*warmup_steps=*/100));
  Noise noise(31);
  // Same noise as above, reported as it is: norms sometimes exceed max_norm.
  for (uint64_t step = 0; step < 6100; ++step) {
    h.Lead(Rec(step, noise.Lognormal(0.8, 0.4)));
  }
  EXPECT_THAT(h.Fired(AlertKind::kPostClipNormReported), IsEmpty());
}

TEST(PostClipNormReported, SilentWhenNormsStayWellBelowMaxNorm) {
  HealthHarness h(Bf16Run(/*warmup_steps=*/100));
  Noise noise(32);
  for (uint64_t step = 0; step < 5000; ++step) {
    h.Lead(Rec(step, noise.Lognormal(kTypicalNorm, 0.1)));
  }
  std::optional<double> largest = h.health().window().grad_norm.Max();
  ASSERT_TRUE(largest.has_value());
  EXPECT_LT(*largest, 1.0);
  EXPECT_THAT(h.Fired(AlertKind::kPostClipNormReported), IsEmpty());
}

// A rewind drops the forgotten steps from the detector's count of norms at
// max_norm, as it does from the window: only the 10 kept steps still count,
// so the pile falls under 2% of the window at 500 slots.
TEST(PostClipNormReported, RewindForgetsThePileOfDroppedSteps) {
  constexpr uint64_t kKept = 10;
  HealthHarness h(Bf16Run(/*warmup_steps=*/0));
  Noise noise(33);
  for (uint64_t step = 0; step < 500; ++step) {
    h.Lead(Rec(step, PostClipNorm(noise.Lognormal(3.0, 0.1), 1.0)));
  }
  ASSERT_EQ(h.Fired(AlertKind::kPostClipNormReported).size(), 1u);
  h.health().Rewind(kKept);
  for (uint64_t step = kKept; step < 2000; ++step) {
    h.Lead(Rec(step, noise.Lognormal(0.5, 0.1)));
  }
  // Holds while 10 >= 2% of step + 1 slots, i.e. through step 499.
  const HealthConfig& config = h.config();
  const uint64_t last_hold =
      std::llround(kKept / config.post_clip.pile_fraction) - 1;
  EXPECT_EQ(Steps(h.Resolved(AlertKind::kPostClipNormReported)),
            std::vector<uint64_t>{last_hold + config.resolve_after_steps});
}

// ---------------------------------------------------- attention logits

// Feeds `logit(step)` with the typical norm; returns the expected episodes.
EpisodeModel FeedLogits(HealthHarness& h, uint64_t steps,
                        const std::function<double(uint64_t)>& logit) {
  const HealthConfig& config = h.config();
  const uint64_t warmup = h.health().info().warmup_steps;
  Noise noise(41);
  SlowWindow window(config.window_steps);
  EpisodeModel model;
  std::optional<double> baseline;
  uint64_t through = 0;
  for (uint64_t step = 0; step < steps; ++step) {
    v1::StepRecord r = Rec(step, noise.Lognormal(kTypicalNorm, kTypicalSigma));
    const double value = logit(step);
    r.set_max_attn_logit(value);
    h.Lead(r);
    bool holds = value >= config.attention.cap;
    if (step >= warmup) {
      window.Push(value);
      if (!baseline.has_value() && window.full()) {
        baseline = window.Median();
        through = step;
      }
      holds |= baseline.has_value() && step > through &&
               window.Median() / *baseline >= config.attention.ratio;
    }
    model.Step(step, holds);
  }
  return model;
}

TEST(AttentionLogitGrowth, FiresWhenTheMedianDoublesFromItsBaseline) {
  constexpr uint64_t kSteps = 30'000;
  HealthHarness h(Bf16Run(/*warmup_steps=*/1000));
  Noise noise(42);
  EpisodeModel model = FeedLogits(h, kSteps, [&](uint64_t step) {
    return 10.0 + 20.0 * step / (kSteps - 1) + noise.Normal(0, 0.3);
  });
  ASSERT_EQ(model.fired.size(), 1u);
  EXPECT_THAT(model.resolved, IsEmpty());  // still growing at the end
  // Change detection names the level no later than the window median.
  auto fired = h.Fired(AlertKind::kAttentionLogitGrowth);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_LE(fired[0].step, model.fired[0]);
  EXPECT_THAT(h.Resolved(AlertKind::kAttentionLogitGrowth), IsEmpty());
  EXPECT_THAT(fired[0].description, HasSubstr("(growth rule, >= 2x;"));
  const double baseline = *h.health().baselines().max_attn_logit_median;
  EXPECT_THAT(fired[0].description,
              HasSubstr(absl::StrFormat("its baseline median %.3g", baseline)));
  EXPECT_GE(fired[0].peak, 1.8 * baseline);
}

TEST(AttentionLogitGrowth, FiresOnOneValueAtTheCapAndResolves) {
  constexpr uint64_t kCapStep = 5000;
  HealthHarness h(Bf16Run(/*warmup_steps=*/1000));
  Noise noise(43);
  EpisodeModel model = FeedLogits(h, 8000, [&](uint64_t step) {
    return step == kCapStep ? 120.0 : noise.Normal(10.0, 0.3);
  });
  EXPECT_EQ(model.fired, std::vector<uint64_t>{kCapStep});
  EXPECT_EQ(model.resolved,
            std::vector<uint64_t>{kCapStep + h.config().resolve_after_steps});
  ExpectEpisodes(h, AlertKind::kAttentionLogitGrowth, model);
  auto fired = h.Fired(AlertKind::kAttentionLogitGrowth);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_THAT(fired[0].description,
              HasSubstr("max attention logit 120 at step 5000 is at or above "
                        "the cap 100 (cap rule)"));
  EXPECT_DOUBLE_EQ(fired[0].peak, 120.0);
}

TEST(AttentionLogitGrowth, SilentOnFlatLogits) {
  HealthHarness h(Bf16Run(/*warmup_steps=*/1000));
  Noise noise(44);
  EpisodeModel model =
      FeedLogits(h, 30'000, [&](uint64_t) { return noise.Normal(10.0, 1.0); });
  EXPECT_THAT(model.fired, IsEmpty());
  ExpectNoNormAlert(h);
}

// ----------------------------------------------------------------- log Z

const double kLogVocab = std::log(50257.0);  // 10.8

// Feeds `log_z(step)`; returns the expected episodes.
EpisodeModel FeedLogZ(HealthHarness& h, uint64_t steps,
                      const std::function<double(uint64_t)>& log_z) {
  const HealthConfig& config = h.config();
  const uint64_t warmup = h.health().info().warmup_steps;
  Noise noise(51);
  SlowWindow window(config.window_steps);
  EpisodeModel model;
  std::optional<double> baseline;
  uint64_t through = 0;
  for (uint64_t step = 0; step < steps; ++step) {
    v1::StepRecord r = Rec(step, noise.Lognormal(kTypicalNorm, kTypicalSigma));
    const double value = log_z(step);
    r.set_log_z(value);
    h.Lead(r);
    bool holds = false;
    if (step >= warmup) {
      window.Push(value);
      if (!baseline.has_value() && window.full()) {
        baseline = window.Median();
        through = step;
      }
      holds = baseline.has_value() && step > through &&
              std::abs(window.Median() - *baseline) >= config.log_z.nats;
    }
    model.Step(step, holds);
  }
  return model;
}

TEST(LogZDrift, SilentNearLogVocabWithoutZLoss) {
  HealthHarness h(Bf16Run(/*warmup_steps=*/1000));
  Noise noise(52);
  EpisodeModel model = FeedLogZ(
      h, 30'000, [&](uint64_t) { return noise.Normal(kLogVocab, 0.05); });
  EXPECT_THAT(model.fired, IsEmpty());
  ExpectNoNormAlert(h);
}

// log Z drifts 8 nats away from 0 over 10,000 steps (up from log V, or down
// from a negative baseline), holds, then a z-loss brings it back.
TEST(LogZDrift, FiresOnAnEightNatDriftAwayFromZeroAndResolves) {
  constexpr uint64_t kWarmup = 1000, kStart = 3000, kDrift = 10'000,
                     kBack = kStart + kDrift + 2000, kSteps = kBack + 2000;
  for (auto [base, direction] : {std::pair{kLogVocab, 1.0}, std::pair{-2.0, -1.0}}) {
    SCOPED_TRACE(direction > 0 ? "up from log V" : "down from -2");
    HealthHarness h(Bf16Run(kWarmup));
    Noise noise(53);
    EpisodeModel model = FeedLogZ(h, kSteps, [&](uint64_t step) {
      double shift = 0;
      if (step >= kStart && step < kBack) {
        shift = 8.0 * std::min(1.0, (step - kStart) / double(kDrift));
      }
      return base + direction * shift + noise.Normal(0, 0.05);
    });
    ASSERT_EQ(model.fired.size(), 1u);
    ASSERT_EQ(model.resolved.size(), 1u);
    EXPECT_GT(model.resolved[0], kBack);
    // Named no later than the window median (the forecast names it first),
    // once, resolved once log Z is back.
    auto fired = h.Fired(AlertKind::kLogZDrift);
    ASSERT_EQ(fired.size(), 1u);
    EXPECT_GT(fired[0].step, kStart);
    EXPECT_LE(fired[0].step, model.fired[0]);
    auto resolved = h.Resolved(AlertKind::kLogZDrift);
    ASSERT_EQ(resolved.size(), 1u);
    EXPECT_GT(resolved[0].step, kBack);
    EXPECT_THAT(fired[0].description,
                HasSubstr(absl::StrFormat(
                    "baseline median %.3g", *h.health().LogZBaseline())));
    // The peak: log Z's mean distance since the change point, ~7 of the 8.
    EXPECT_GE(resolved[0].peak, 6.5);
  }
}

// A short run, as in the lab: warmup 100, log Z's baseline its first 200
// post-warmup steps. A healthy run's log Z climbs from log V (5.5) to ~11
// over its first 300 steps and settles: silent. A drift from 20 to 35 from
// step 300 on: named within 150 steps of crossing 5 nats.
TEST(LogZDrift, NamesADriftWithinAShortRunAndNotASettlingLogZ) {
  constexpr uint64_t kWarmup = 100, kSteps = 3000;
  {
    HealthHarness h(Bf16Run(kWarmup));
    Noise noise(55);
    FeedLogZ(h, kSteps, [&](uint64_t step) {
      return 5.5 + 5.5 * (1 - std::exp(-double(step) / 100)) + noise.Normal(0, 0.3);
    });
    EXPECT_THAT(h.Fired(AlertKind::kLogZDrift), IsEmpty());
  }
  HealthHarness h(Bf16Run(kWarmup));
  Noise noise(56);
  FeedLogZ(h, 700, [&](uint64_t step) {
    return 20 + (step < 300 ? 0.0 : 0.05 * double(step - 300)) + noise.Normal(0, 1.0);
  });
  const auto fired = h.Fired(AlertKind::kLogZDrift);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_GT(fired[0].step, 300u);
  EXPECT_LE(fired[0].step, 550u);  // 5 nats out at step 400
}

// A z-loss switched on pulls log Z from log V toward 0 (8 nats): what it is
// for, not a drift (docs/detectors.md).
TEST(LogZDrift, SilentWhileZLossPullsLogZTowardZero) {
  constexpr uint64_t kWarmup = 1000, kStart = 3000, kSteps = 20'000;
  HealthHarness h(Bf16Run(kWarmup));
  Noise noise(54);
  FeedLogZ(h, kSteps, [&](uint64_t step) {
    const double pulled = step < kStart ? 0.0 : 8.0 * std::min(1.0, (step - kStart) / 4000.0);
    return kLogVocab - pulled + noise.Normal(0, 0.05);
  });
  EXPECT_THAT(h.Fired(AlertKind::kLogZDrift), IsEmpty());
}

// ------------------------------------------------------- a healthy run

// A healthy bf16 run: warmup 2000 with higher norms, then lognormal norms
// whose median falls slowly as the LR decays (cosine), attention logits and
// log Z that move a little; max_norm 1.0. Nothing may fire.
TEST(HealthyRun, Bf16RunRaisesNoAlertAtAll) {
  constexpr uint64_t kWarmup = 2000, kSteps = 60'000;
  HealthHarness h(Bf16Run(kWarmup));
  Noise noise(61);
  for (uint64_t step = 0; step < kSteps; ++step) {
    double median;
    if (step < kWarmup) {
      median = 2.5 * std::pow(0.45 / 2.5, step / double(kWarmup));
    } else {
      double progress = (step - kWarmup) / double(kSteps - kWarmup);
      median = 0.25 + 0.2 * 0.5 * (1 + std::cos(std::numbers::pi * progress));
    }
    const double t = step / double(kSteps);
    v1::StepRecord r = Rec(step, noise.Lognormal(median, 0.3));
    r.set_lr(3e-4 * (step < kWarmup ? step / double(kWarmup) : 1 - t));
    r.set_loss(2.5 + 8.0 * std::exp(-static_cast<double>(step) / 3000.0) +
               noise.Normal(0, 0.05));
    r.set_max_attn_logit(12.0 + 3.0 * t + noise.Normal(0, 0.5));
    r.set_log_z(kLogVocab - 1.5 * t + noise.Normal(0, 0.05));
    h.Lead(r);
  }
  EXPECT_THAT(h.FiredNames(), IsEmpty());
  EXPECT_THAT(h.transitions, IsEmpty());
  EXPECT_THAT(h.spikes, IsEmpty());
}

}  // namespace
}  // namespace trainwatch
