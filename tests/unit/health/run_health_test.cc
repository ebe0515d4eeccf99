// RunHealth (docs/detectors.md) with the real detectors and
// alert tracker: level shifts named within tens of steps at their change
// point, hysteresis, forecasts, the slow scale bleed, LossSpike, caused_by,
// ranks compared whatever their arrival order, and the healthy shapes that
// must stay silent.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health_test_util.h"

namespace trainwatch {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using ::trainwatch::testing::HealthHarness;
using ::trainwatch::testing::Rec;

RunInfo Bf16(uint64_t warmup = 100, double max_norm = 1.0) {
  return RunInfo{.run_id = "r", .precision = v1::BF16, .max_norm = max_norm,
                 .warmup_steps = warmup};
}

// Lognormal norms with a mild heavy tail, seeded.
class Norms {
 public:
  explicit Norms(uint64_t seed, double sigma = 0.15) : rng_(seed), sigma_(sigma) {}
  double Next(double median) {
    const double s = u_(rng_) < 0.03 ? 2.2 * sigma_ : sigma_;
    return median * std::exp(s * z_(rng_));
  }
  double Loss(double level) { return level * std::exp(0.01 * z_(rng_)); }

 private:
  std::mt19937_64 rng_;
  double sigma_;
  std::normal_distribution<double> z_;
  std::uniform_real_distribution<double> u_{0.0, 1.0};
};

TEST(GradNormDrift, NamesASudden3xShiftWithinTensOfStepsAtItsChangePoint) {
  HealthHarness h(Bf16());
  Norms n(1);
  for (uint64_t s = 1; s <= 3000; ++s) {
    h.Lead(Rec(s, n.Next(s >= 2500 ? 0.75 : 0.25), /*max_norm=*/10.0));
  }
  auto fired = h.Fired(AlertKind::kGradNormDrift);
  ASSERT_THAT(fired, SizeIs(1));
  EXPECT_GE(fired[0].step, 2500u);
  EXPECT_LE(fired[0].step, 2540u);
  EXPECT_NEAR(static_cast<double>(fired[0].onset_step), 2500.0, 5.0);
  EXPECT_THAT(fired[0].description, HasSubstr("since step"));
}

TEST(GradNormDrift, TheRiseAsTheLrDecaysToItsFloorIsNotDrift) {
  HealthHarness h(Bf16());
  Norms n(2);
  for (uint64_t s = 1; s <= 10000; ++s) {
    const double p = s / 10000.0;
    const double lr = 3e-4 * (0.01 + 0.99 * 0.5 * (1 + std::cos(M_PI * p)));
    const double rise = p > 0.85 ? std::pow(2.5, (p - 0.85) / 0.15) : 1.0;
    v1::StepRecord r = Rec(s, n.Next(0.3 * rise), 10.0);
    r.set_lr(lr);
    h.Lead(r);
  }
  EXPECT_THAT(h.FiredNames(), IsEmpty());
}

TEST(ClipFractionHigh, NamesAJumpTo20PercentInTensOfStepsAndHoversAsOneAlert) {
  HealthHarness h(Bf16());
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double p = 0.0;
  for (uint64_t s = 1; s <= 12000; ++s) {
    if (s == 2000) p = 0.2;
    if (s >= 3000 && s % 300 == 0) p = 0.046 + 0.024 * u(rng);  // hover
    h.Lead(Rec(s, u(rng) < p ? 1.5 : 0.4));
  }
  auto fired = h.Fired(AlertKind::kClipFractionHigh);
  ASSERT_THAT(fired, SizeIs(1));
  EXPECT_LE(fired[0].step - 2000, 90u);
  EXPECT_NEAR(static_cast<double>(fired[0].onset_step), 2000.0, 30.0);
}

// The held-out lab's healthy runs clip while they settle after warmup:
// hard batches on 9% of the first 100 post-warmup steps, or half of the
// steps of a noisy language's first hundred, then rarely. Not a page.
TEST(ClipFractionHigh, ASettlingRunsEarlyClippingIsNotNamed) {
  for (double early : {0.09, 0.5}) {
    HealthHarness h(Bf16());
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (uint64_t s = 1; s <= 3000; ++s) {
      // Warmup clips most steps; the settling stretch fades out by step 300.
      const double p = s <= 100 ? 0.8 : s <= 200 ? early : s <= 300 ? early / 4 : 0.01;
      h.Lead(Rec(s, u(rng) < p ? 1.5 : 0.4));
    }
    EXPECT_THAT(h.Fired(AlertKind::kClipFractionHigh), IsEmpty()) << early;
  }
}

// Clipping on every step since the start is the clip acting as the LR:
// named once the run has settled (clip_fraction.settle_steps), not before.
TEST(ClipFractionHigh, ClippingSinceTheStartIsNamedOnceTheRunHasSettled) {
  HealthHarness h(Bf16());
  for (uint64_t s = 1; s <= 1500; ++s) h.Lead(Rec(s, 2.0));
  auto fired = h.Fired(AlertKind::kClipFractionHigh);
  ASSERT_THAT(fired, SizeIs(1));
  // Post-warmup from step 100: its 1000th step.
  EXPECT_EQ(fired[0].step, 100u + 999u);
  EXPECT_THAT(fired[0].description, HasSubstr("of the first 100 post-warmup steps"));
}

// A rise over the run's own early share is named at once, settled or not:
// 9% early, then 30% from post-warmup step 150.
TEST(ClipFractionHigh, ARiseOverTheRunsOwnEarlyShareIsNamedBeforeItSettles) {
  HealthHarness h(Bf16());
  std::mt19937_64 rng(8);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (uint64_t s = 1; s <= 600; ++s) {
    const double p = s <= 100 ? 0.8 : s <= 250 ? 0.09 : 0.3;
    h.Lead(Rec(s, u(rng) < p ? 1.5 : 0.4));
  }
  auto fired = h.Fired(AlertKind::kClipFractionHigh);
  ASSERT_THAT(fired, SizeIs(1));
  EXPECT_GE(fired[0].step, 250u);
  EXPECT_LE(fired[0].step, 350u);
}

// A run (warmup 100) whose steps from 101 on clip, or for fp16 skip, with
// probability rate(step), seeded: a clipped step's norm is 1.5 at max_norm
// 1, a skipped one's is Inf.
template <typename Rate>
void FeedRate(HealthHarness& h, uint64_t steps, uint64_t seed, Rate rate) {
  const bool fp16 = h.health().info().precision == v1::FP16;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (uint64_t s = 1; s <= steps; ++s) {
    const bool hit = s > 100 && u(rng) < rate(s);
    v1::StepRecord r = Rec(s, hit ? (fp16 ? INFINITY : 1.5) : 0.4);
    if (fp16) {
      r.set_loss_scale(65536);
      r.set_skipped(hit);
    }
    h.Lead(r);
  }
}

// "fired at 812, 2249; resolved at 2242": the steps of `kind`'s transitions.
std::string Episodes(const HealthHarness& h, AlertKind kind) {
  std::string out = "fired at";
  for (const auto& t : h.Fired(kind)) absl::StrAppend(&out, " ", t.step);
  absl::StrAppend(&out, "; resolved at");
  for (const auto& t : h.Resolved(kind)) absl::StrAppend(&out, " ", t.step);
  return out;
}

// A clip rate at its threshold, i.i.d. over 5000 post-warmup steps: one
// alert that stays firing (the window's share crosses 0.05 and the 0.04
// line again and again).
TEST(ClipFractionHigh, ARateHoveringAtTheThresholdIsOneAlertThatStaysFiring) {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    HealthHarness h(Bf16());
    FeedRate(h, 5100, seed, [](uint64_t) { return 0.05; });
    EXPECT_EQ(h.Fired(AlertKind::kClipFractionHigh).size(), 1u)
        << "seed " << seed << ": " << Episodes(h, AlertKind::kClipFractionHigh);
    EXPECT_THAT(h.Resolved(AlertKind::kClipFractionHigh), IsEmpty())
        << "seed " << seed << ": " << Episodes(h, AlertKind::kClipFractionHigh);
  }
}

TEST(ClipFractionHigh, ARateAlternating4And6PercentIsOneAlert) {
  for (uint64_t block : {100, 300, 500}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      HealthHarness h(Bf16());
      FeedRate(h, 5100, seed,
               [block](uint64_t s) { return (s / block) % 2 ? 0.06 : 0.04; });
      EXPECT_EQ(h.Fired(AlertKind::kClipFractionHigh).size(), 1u)
          << "blocks of " << block << ", seed " << seed << ": "
          << Episodes(h, AlertKind::kClipFractionHigh);
      EXPECT_THAT(h.Resolved(AlertKind::kClipFractionHigh), IsEmpty())
          << "blocks of " << block << ", seed " << seed << ": "
          << Episodes(h, AlertKind::kClipFractionHigh);
    }
  }
}

// Hysteresis both ways: 4.5% after 6% is not clearly below (the same
// episode), 1% is (resolved within a thousand steps).
TEST(ClipFractionHigh, ResolvesOnlyOnceTheRateIsClearlyBelow) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    HealthHarness h(Bf16());
    FeedRate(h, 8000, seed, [](uint64_t s) { return s <= 3000 ? 0.06 : 0.045; });
    EXPECT_EQ(h.Fired(AlertKind::kClipFractionHigh).size(), 1u)
        << "seed " << seed << ": " << Episodes(h, AlertKind::kClipFractionHigh);
    EXPECT_THAT(h.Resolved(AlertKind::kClipFractionHigh), IsEmpty())
        << "seed " << seed << ": " << Episodes(h, AlertKind::kClipFractionHigh);

    HealthHarness clear(Bf16());
    FeedRate(clear, 8000, seed, [](uint64_t s) { return s <= 3000 ? 0.06 : 0.01; });
    EXPECT_EQ(clear.Fired(AlertKind::kClipFractionHigh).size(), 1u)
        << "seed " << seed << ": " << Episodes(clear, AlertKind::kClipFractionHigh);
    auto resolved = clear.Resolved(AlertKind::kClipFractionHigh);
    ASSERT_EQ(resolved.size(), 1u)
        << "seed " << seed << ": " << Episodes(clear, AlertKind::kClipFractionHigh);
    EXPECT_GT(resolved[0].step, 3000u) << seed;
    EXPECT_LE(resolved[0].step, 4000u) << seed;
  }
}

// The same rule for fp16 skips at their 1% threshold, where 0.8x over W is
// only 0.6 sd of the window's share below it.
TEST(SkipRateHigh, ARateHoveringAtTheThresholdIsOneAlertThatStaysFiring) {
  const RunInfo fp16{.run_id = "r", .precision = v1::FP16, .max_norm = 1.0,
                     .warmup_steps = 100};
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    for (bool alternating : {false, true}) {
      HealthHarness h(fp16);
      FeedRate(h, 5100, seed, [alternating](uint64_t s) {
        return !alternating ? 0.01 : (s / 300) % 2 ? 0.012 : 0.008;
      });
      EXPECT_EQ(h.Fired(AlertKind::kSkipRateHigh).size(), 1u)
          << (alternating ? "0.8%/1.2%" : "1%") << ", seed " << seed << ": "
          << Episodes(h, AlertKind::kSkipRateHigh);
      EXPECT_THAT(h.Resolved(AlertKind::kSkipRateHigh), IsEmpty())
          << (alternating ? "0.8%/1.2%" : "1%") << ", seed " << seed << ": "
          << Episodes(h, AlertKind::kSkipRateHigh);
    }
  }
}

TEST(AttentionLogitGrowth, ForecastsTheCapWellBeforeTheCrossing) {
  HealthHarness h(Bf16());
  Norms n(4);
  std::optional<uint64_t> crossed;
  for (uint64_t s = 1; s <= 7000; ++s) {
    v1::StepRecord r = Rec(s, n.Next(0.3));
    const double level = 60.0 + (s > 1500 ? 0.008 * (s - 1500) : 0.0);
    r.set_max_attn_logit(level * std::exp(0.02 * std::sin(s * 0.7)));
    if (!crossed && r.max_attn_logit() >= 100) crossed = s;
    h.Lead(r);
  }
  ASSERT_TRUE(crossed.has_value());
  auto fired = h.Fired(AlertKind::kAttentionLogitGrowth);
  ASSERT_THAT(fired, SizeIs(1));
  EXPECT_LE(fired[0].step + 1000, *crossed);
  EXPECT_THAT(fired[0].description, HasSubstr("forecast"));
  const Trends& t = h.health().trends();
  ASSERT_TRUE(t.max_attn_logit.trend().has_value());
  EXPECT_NEAR(t.max_attn_logit.trend()->slope, 0.008, 0.002);
}

TEST(LossSpike, ABloomLikeSpikeIsNamedOnceAndTheNormSpikeIsItsConsequence) {
  HealthHarness h(Bf16());
  Norms n(5);
  for (uint64_t s = 1; s <= 3000; ++s) {
    double bump = 0;
    if (s >= 2000 && s < 2008) bump = (s - 1999) / 8.0;
    if (s >= 2008 && s < 2038) bump = (2038 - s) / 30.0;
    v1::StepRecord r = Rec(s, n.Next(0.24) * std::pow(4000.0, bump));
    r.set_loss(n.Loss(2.2) * std::pow(5.1 / 2.2, bump));
    h.Lead(r);
  }
  auto loss = h.Fired(AlertKind::kLossSpike);
  ASSERT_THAT(loss, SizeIs(1));
  EXPECT_LE(loss[0].step, 2008u);
  // Recorded, not paged: the loss came back.
  EXPECT_EQ(Spec(AlertKind::kLossSpike).severity, v1::SEVERITY_INFO);
  EXPECT_THAT(h.Fired(AlertKind::kLossDivergence), IsEmpty());
  EXPECT_FALSE(loss[0].batch_ids.empty());
  for (AlertKind k : {AlertKind::kGradNormSpike, AlertKind::kClipFractionHigh,
                      AlertKind::kGradNormDrift}) {
    for (const auto& t : h.Fired(k)) {
      EXPECT_EQ(t.caused_by, "LossSpike") << Spec(k).name << " at " << t.step;
    }
  }
  EXPECT_THAT(h.Fired(AlertKind::kGradNormSpike), SizeIs(1));
  EXPECT_EQ(Spec(AlertKind::kGradNormSpike).severity, v1::SEVERITY_INFO);
  // The spike list has it, for its restart plan.
  bool listed = false;
  for (const SpikeInfo& s : h.spikes) listed |= s.step >= 2000 && s.step <= 2004;
  EXPECT_TRUE(listed);
}

TEST(LossSpike, AnAbsorbedNormSpikeIsNotALossSpike) {
  HealthHarness h(Bf16());
  Norms n(6);
  for (uint64_t s = 1; s <= 3000; ++s) {
    v1::StepRecord r = Rec(s, n.Next(0.3) * (s == 2000 ? 12.0 : 1.0));
    r.set_loss(n.Loss(2.4));
    h.Lead(r);
  }
  EXPECT_THAT(h.FiredNames(), ::testing::ElementsAre("GradNormSpike"));
}

TEST(LossScaleCollapse, ASlowBleedIsNamedAtTheSixthHalvingWithItsForecastAndTheSawtoothIsNot) {
  RunInfo info = Bf16();
  info.precision = v1::FP16;
  HealthHarness h(info);
  Norms n(7);
  double scale = 32768;
  for (uint64_t s = 1; s <= 4000; ++s) {
    const bool overflow = s > 2000 && (s - 2000) % 150 == 0;
    if (overflow) scale /= 2;
    v1::StepRecord r = Rec(s, overflow ? INFINITY : n.Next(0.3));
    r.set_skipped(overflow);
    r.set_loss_scale(scale);
    h.Lead(r);
  }
  auto fired = h.Fired(AlertKind::kLossScaleCollapse);
  ASSERT_THAT(fired, SizeIs(1));
  EXPECT_EQ(fired[0].step, 2900u);  // the 6th halving
  EXPECT_THAT(fired[0].description, HasSubstr("falls below 1 at step"));
  EXPECT_EQ(fired[0].onset_step, 2150u);

  HealthHarness saw(info);
  scale = 16384;
  uint32_t clean = 0;
  std::mt19937_64 rng(8);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (uint64_t s = 1; s <= 30000; ++s) {
    const bool overflow = (scale > 32768 && u(rng) < 0.01) || u(rng) < 0.0002;
    if (overflow) {
      scale /= 2;
      clean = 0;
    } else if (++clean == 1000) {
      scale *= 2;
      clean = 0;
    }
    v1::StepRecord r = Rec(s, overflow ? INFINITY : n.Next(0.3));
    r.set_skipped(overflow);
    r.set_loss_scale(scale);
    saw.Lead(r);
  }
  EXPECT_THAT(saw.FiredNames(), IsEmpty());
}

TEST(CausedBy, SkipsUnderACollapsingScaleAreItsConsequence) {
  RunInfo info = Bf16();
  info.precision = v1::FP16;
  HealthHarness h(info);
  Norms n(9);
  double scale = 65536;
  for (uint64_t s = 1; s <= 2100; ++s) {
    const bool overflow = s >= 2000;
    if (overflow) scale /= 2;
    v1::StepRecord r = Rec(s, overflow ? INFINITY : n.Next(0.3));
    r.set_skipped(overflow);
    r.set_loss_scale(scale);
    h.Lead(r);
  }
  ASSERT_THAT(h.Fired(AlertKind::kLossScaleCollapse), SizeIs(1));
  auto skips = h.Fired(AlertKind::kSkipRateHigh);
  ASSERT_THAT(skips, SizeIs(1));
  EXPECT_EQ(skips[0].caused_by, "LossScaleCollapse");
}

TEST(AdamStaleSecondMoment, AdaptingAfterWarmupIsSilentAJumpAtASpikeIsItsConsequence) {
  HealthHarness h(Bf16(20));
  Norms n(10);
  for (uint64_t s = 1; s <= 400; ++s) {
    const bool corrupt = s == 300;
    v1::StepRecord r = Rec(s, corrupt ? 300.0 : n.Next(0.3));
    if (s % 50 == 0) {
      v1::LayerStats stats;
      // Adam still adapting after warmup: 9, 7, 5.5, then ~1.5.
      double v = s <= 150 ? 10.5 - 0.03 * s : 1.5;
      if (corrupt) v = 400.0;
      stats.set_g_over_sqrt_v_rms(v);
      (*r.mutable_layer_stats())["blocks.0.attn"] = stats;
    }
    h.Lead(r);
  }
  auto stale = h.Fired(AlertKind::kAdamStaleSecondMoment);
  ASSERT_THAT(stale, SizeIs(1));
  EXPECT_EQ(stale[0].step, 300u);
  EXPECT_EQ(stale[0].caused_by, "GradNormSpike");
}

TEST(RankNormMismatch, RanksArrivingFarApartAreComparedFromTheFirstStep) {
  RunInfo info = Bf16();
  info.world_size = 2;
  HealthHarness h(info);
  Norms n(11);
  std::vector<double> norms;
  for (uint64_t s = 1; s <= 20000; ++s) {
    norms.push_back(n.Next(0.3));
    h.Lead(Rec(s, norms.back()));
  }
  // Rank 1 catches up after rank 0 finished: it disagrees from step 1500.
  for (uint64_t s = 1; s <= 20000; ++s) {
    h.Rank(1, Rec(s, norms[s - 1] * (s >= 1500 ? 0.8 : 1.0)));
  }
  auto fired = h.Fired(AlertKind::kRankNormMismatch);
  ASSERT_THAT(fired, SizeIs(1));
  EXPECT_EQ(fired[0].step, 1500u);
}

}  // namespace
}  // namespace trainwatch
