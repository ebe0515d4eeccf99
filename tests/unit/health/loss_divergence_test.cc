// LossDivergence and LossSpike (detectors/loss.cc) through the real
// detectors and alert tracker: a spike that stays, a slow rise with no
// single spike, a spike that recovers (info, no page), a hard batch, and
// the conventions that must never page (noise, RL, DPO).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health_test_util.h"

namespace trainwatch {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using testing::HealthHarness;
using testing::Rec;

RunInfo Lm() {
  return RunInfo{.run_id = "r", .precision = v1::BF16, .max_norm = 1.0, .warmup_steps = 100};
}

// A language-model loss: falling slowly, 2% multiplicative noise.
double Loss(std::mt19937& rng, uint64_t step) {
  std::normal_distribution<double> g(0.0, 0.02);
  return (2.2 + 2.0 * std::exp(-static_cast<double>(step) / 300.0)) * std::exp(g(rng));
}

template <typename LossAt>
void Feed(HealthHarness& h, uint64_t steps, LossAt loss_at) {
  std::mt19937 rng(7);
  std::lognormal_distribution<double> norm(std::log(0.3), 0.1);
  for (uint64_t s = 0; s < steps; ++s) {
    v1::StepRecord r = Rec(s, norm(rng));
    r.set_loss(loss_at(rng, s));
    h.Lead(r);
  }
}

TEST(LossDivergence, ASpikeThatDoesNotComeBackIsCriticalWithin100Steps) {
  HealthHarness h(Lm());
  // From step 1000 the loss jumps to 3x and stays there.
  Feed(h, 1400, [](std::mt19937& rng, uint64_t s) {
    return Loss(rng, s) * (s >= 1000 ? 3.0 : 1.0);
  });
  const auto spikes = h.Fired(AlertKind::kLossSpike);
  ASSERT_THAT(spikes, SizeIs(1));
  EXPECT_EQ(spikes[0].onset_step, 1000u);
  const auto div = h.Fired(AlertKind::kLossDivergence);
  ASSERT_THAT(div, SizeIs(1));
  EXPECT_EQ(div[0].onset_step, 1000u);
  EXPECT_GE(div[0].step, 1000u);
  EXPECT_LE(div[0].step, 1100u);
  EXPECT_EQ(div[0].caused_by, "LossSpike");
  EXPECT_THAT(div[0].description, HasSubstr("did not come back"));
  EXPECT_THAT(div[0].description, HasSubstr("last checkpoint before step 1000"));
  EXPECT_THAT(div[0].description, HasSubstr("lower the learning rate"));
  EXPECT_EQ(Spec(AlertKind::kLossDivergence).severity, v1::SEVERITY_CRITICAL);
}

TEST(LossDivergence, ASlowRiseWithNoSingleSpikeIsNamedWithin100StepsOfItsOnset) {
  HealthHarness h(Lm());
  // From step 800 the loss drifts up 1% a step, never a jump: 2x by ~870.
  Feed(h, 1200, [](std::mt19937& rng, uint64_t s) {
    const double drift = s >= 800 ? std::exp(0.01 * static_cast<double>(s - 800)) : 1.0;
    return Loss(rng, s) * std::min(drift, 5.0);
  });
  const auto div = h.Fired(AlertKind::kLossDivergence);
  ASSERT_THAT(div, SizeIs(1));
  EXPECT_LE(div[0].step, 900u);
  EXPECT_GE(div[0].onset_step, 780u);
  EXPECT_LE(div[0].onset_step, 840u);
  EXPECT_THAT(div[0].description, HasSubstr("restart plan: the last checkpoint before step"));
}

// An LR too high for the run: the loss leaves a level of 0.45 at step 800
// and climbs 3.3x in 150 steps (log-linear: it doubles only ~87 steps in),
// then on to ~6x. Named while it climbs, within 100 steps of the onset.
TEST(LossDivergence, ALossClimbing3xIn150StepsIsNamedBeforeItDoubles) {
  HealthHarness h(Lm());
  Feed(h, 1600, [](std::mt19937& rng, uint64_t s) {
    std::normal_distribution<double> g(0.0, 0.03);
    const double t = s >= 800 ? static_cast<double>(s - 800) : 0.0;
    const double climb = t <= 150 ? std::exp(std::log(1.5 / 0.45) * t / 150)
                                  : (1.5 / 0.45) * std::exp(0.001 * (t - 150));
    return 0.45 * climb * std::exp(g(rng));
  });
  const auto div = h.Fired(AlertKind::kLossDivergence);
  ASSERT_THAT(div, SizeIs(1));
  EXPECT_GE(div[0].step, 810u);
  EXPECT_LE(div[0].step, 900u);
  EXPECT_GE(div[0].onset_step, 770u);
  EXPECT_LE(div[0].onset_step, 840u);
  // The climb is the cause: the LossSpike the rule saw on the way names it
  // late, and its batches are not the cause.
  EXPECT_THAT(div[0].description, HasSubstr("still climbing"));
  EXPECT_THAT(div[0].description, ::testing::Not(HasSubstr("skip the spike's batches")));
}

// The same climb, smoother (no step far above the recent level: no
// LossSpike first): named by the climb itself, before the level doubles.
TEST(LossDivergence, ASmoothClimbIsNamedWhileItClimbs) {
  HealthHarness h(Lm());
  Feed(h, 1600, [](std::mt19937& rng, uint64_t s) {
    std::normal_distribution<double> g(0.0, 0.03);
    const double t = s >= 800 ? static_cast<double>(s - 800) : 0.0;
    return 0.45 * std::exp(std::min(t, 300.0) * std::log(1.5 / 0.45) / 300) *
           std::exp(g(rng));
  });
  EXPECT_THAT(h.Fired(AlertKind::kLossSpike), IsEmpty());
  const auto div = h.Fired(AlertKind::kLossDivergence);
  ASSERT_THAT(div, SizeIs(1));
  // 1.5x at ~step 900 (the level lags ~10), doubled only at ~975.
  EXPECT_LE(div[0].step, 930u);
  EXPECT_THAT(div[0].description, HasSubstr("still climbing"));
  EXPECT_EQ(div[0].caused_by, "");
}

// A small run with no warmup and an LR a little too high: its loss falls
// 30x in 60 steps, dips to its lowest there, settles on a level 1.25x
// higher with 10% noise, and from step 300 drifts up to 3x that level in
// 200 steps. Its best is the settled level's, not the dip's, and the lines
// are drawn with the settled noise, not the spread of the steep fall (which
// put the 1.5x line at 3.8x the dip for good).
TEST(LossDivergence, ADriftAfterASteepStartIsJudgedOnTheSettledLevelAndNoise) {
  HealthHarness h(RunInfo{.run_id = "r", .precision = v1::BF16, .max_norm = 1.0});
  Feed(h, 700, [](std::mt19937& rng, uint64_t s) {
    std::normal_distribution<double> g(0.0, 0.1);
    const double t = static_cast<double>(s);
    const double level = s < 60    ? 5.0 * std::exp(-t * std::log(5.0 / 0.16) / 60)
                         : s < 300 ? 0.2
                                   : 0.2 * std::exp(std::min(t - 300, 200.0) * std::log(3.0) / 200);
    return level * std::exp(g(rng));
  });
  const auto div = h.Fired(AlertKind::kLossDivergence);
  ASSERT_THAT(div, SizeIs(1));
  EXPECT_GE(div[0].step, 300u);
  EXPECT_LE(div[0].step, 400u);
  EXPECT_THAT(div[0].description, HasSubstr("best level 0.19"));
}

TEST(LossDivergence, AnEvenSlowerRiseIsJudgedAgainstTheBestLevel) {
  HealthHarness h(Lm());
  // 0.3% a step from step 800: 2x by ~1030, never 1.5x its last 100 steps.
  Feed(h, 1600, [](std::mt19937& rng, uint64_t s) {
    const double drift = s >= 800 ? std::exp(0.003 * static_cast<double>(s - 800)) : 1.0;
    return Loss(rng, s) * std::min(drift, 4.0);
  });
  EXPECT_THAT(h.Fired(AlertKind::kLossSpike), IsEmpty());
  const auto div = h.Fired(AlertKind::kLossDivergence);
  ASSERT_THAT(div, SizeIs(1));
  EXPECT_THAT(div[0].description, HasSubstr("best level"));
  EXPECT_EQ(div[0].caused_by, "");
  // Named while it climbs, once the level is 1.5x the best (~935, the
  // level ~10 steps behind), before it doubles (~1030).
  EXPECT_GE(div[0].step, 940u);
  EXPECT_LE(div[0].step, 1030u);
  EXPECT_THAT(div[0].description, HasSubstr("still climbing"));
}

// A divergence inside warmup: the loss falls steeply for 150 steps of a
// 500-step warmup, then, as the rising LR passes what the run tolerates,
// its level climbs 0.5 -> 0.9 -> 1.5 -> 2.0 -> 2.5 over steps 150-500.
// Named within 100 steps of where the climb began: the best level is the
// one before the climb, not one counted from after warmup (from the climb
// itself, 2x of which comes late or never).
TEST(LossDivergence, ADivergenceInsideWarmupIsNamedWithin100StepsOfItsOnset) {
  HealthHarness h(RunInfo{.run_id = "r", .precision = v1::BF16, .max_norm = 0.0,
                          .warmup_steps = 500});
  const auto level = [](uint64_t s) {
    const double t = static_cast<double>(s);
    if (s < 150) return 0.5 + 4.5 * std::exp(-t / 30.0);  // 5.0 down to ~0.53
    // Log-linear between the waypoints, one every 87.5 steps.
    constexpr double kAt[] = {0.53, 0.9, 1.5, 2.0, 2.5};
    const double x = std::min((t - 150.0) / 87.5, 3.999);
    const int i = static_cast<int>(x);
    return kAt[i] * std::pow(kAt[i + 1] / kAt[i], x - i);
  };
  Feed(h, 700, [&](std::mt19937& rng, uint64_t s) {
    std::normal_distribution<double> g(0.0, 0.05);
    return level(s) * std::exp(g(rng));
  });
  const auto div = h.Fired(AlertKind::kLossDivergence);
  ASSERT_THAT(div, SizeIs(1));
  EXPECT_GE(div[0].step, 140u);
  EXPECT_LE(div[0].step, 250u);  // onset 150, +100
  EXPECT_GE(div[0].onset_step, 120u);
  EXPECT_LE(div[0].onset_step, 200u);
  std::printf("warmup divergence from step 150 named at step %llu (onset %llu)\n",
              static_cast<unsigned long long>(div[0].step),
              static_cast<unsigned long long>(div[0].onset_step));
}

// Through a long warmup the loss falls steeply and noisily (a 1000-step
// warmup, a loss from 5.5 to 1.8 with 8% noise and a hard batch every ~50
// steps): nothing pages.
TEST(LossDivergence, ALossStillFallingThroughALongWarmupDoesNotPage) {
  HealthHarness h(RunInfo{.run_id = "r", .precision = v1::BF16, .max_norm = 1.0,
                          .warmup_steps = 1000});
  Feed(h, 1500, [](std::mt19937& rng, uint64_t s) {
    std::normal_distribution<double> g(0.0, 0.08);
    const double t = static_cast<double>(s);
    const double hard = s % 50 == 17 ? 1.8 : 1.0;
    return (1.8 + 3.7 * std::exp(-t / 250.0)) * hard * std::exp(g(rng));
  });
  EXPECT_THAT(h.Fired(AlertKind::kLossDivergence), IsEmpty());
}

// The loss's bump as the LR warms up (it rises ~25% for 100 steps, then
// falls on): not a divergence.
TEST(LossDivergence, AWarmupBumpIsNotADivergence) {
  HealthHarness h(RunInfo{.run_id = "r", .precision = v1::BF16, .max_norm = 1.0,
                          .warmup_steps = 400});
  Feed(h, 1200, [](std::mt19937& rng, uint64_t s) {
    const double t = static_cast<double>(s);
    const double bump = 1.0 + 0.25 * std::exp(-std::pow((t - 300.0) / 60.0, 2));
    return Loss(rng, s) * bump;
  });
  EXPECT_THAT(h.Fired(AlertKind::kLossDivergence), IsEmpty());
}

TEST(LossDivergence, ASpikeThatRecoversIsInfoAndPagesNothing) {
  HealthHarness h(Lm());
  // 2.5x for 12 steps, then back.
  Feed(h, 1500, [](std::mt19937& rng, uint64_t s) {
    return Loss(rng, s) * (s >= 1000 && s < 1012 ? 2.5 : 1.0);
  });
  const auto spikes = h.Fired(AlertKind::kLossSpike);
  ASSERT_THAT(spikes, SizeIs(1));
  EXPECT_EQ(Spec(AlertKind::kLossSpike).severity, v1::SEVERITY_INFO);
  EXPECT_THAT(h.Fired(AlertKind::kLossDivergence), IsEmpty());
}

TEST(LossSpike, ThreeHighStepsOfFiveAreASpikeAndOneIsAHardBatch) {
  HealthHarness h(Lm());
  Feed(h, 2000, [](std::mt19937& rng, uint64_t s) {
    double l = Loss(rng, s);
    if (s == 700) l *= 4.0;                            // a hard batch
    if (s == 1200 || s == 1201 || s == 1203) l *= 2.0;  // 3 of 5, a dip between
    return l;
  });
  const auto spikes = h.Fired(AlertKind::kLossSpike);
  ASSERT_THAT(spikes, SizeIs(1));
  EXPECT_EQ(spikes[0].onset_step, 1200u);
  EXPECT_EQ(spikes[0].step, 1203u);
}

TEST(LossDivergence, NoiseAHealthyDpoLossAndAnRlLossNeverPage) {
  {
    HealthHarness h(Lm());
    Feed(h, 5000, [](std::mt19937& rng, uint64_t s) { return Loss(rng, s); });
    EXPECT_THAT(h.FiredNames(), IsEmpty());
  }
  {
    // DPO: -log sigmoid(margin) averaged over 32 pairs, margins growing
    // from 0 to ~3 and noisy: 0.69 down to ~0.1, jumpy near its floor.
    HealthHarness h(Lm());
    Feed(h, 4000, [](std::mt19937& rng, uint64_t s) {
      const double mean = 3.0 * (1.0 - std::exp(-static_cast<double>(s) / 800.0));
      std::normal_distribution<double> margin(mean, 2.0);
      double sum = 0;
      for (int i = 0; i < 32; ++i) sum += std::log1p(std::exp(-margin(rng)));
      return sum / 32;
    });
    EXPECT_THAT(h.Fired(AlertKind::kLossDivergence), IsEmpty());
  }
  {
    // An RL policy loss around 0, both signs, which doubles in spread.
    HealthHarness h(Lm());
    Feed(h, 4000, [](std::mt19937& rng, uint64_t s) {
      std::normal_distribution<double> g(0.0, s > 2000 ? 0.02 : 0.01);
      return g(rng);
    });
    EXPECT_THAT(h.Fired(AlertKind::kLossDivergence), IsEmpty());
  }
}

TEST(LossDivergence, ResolvesOnceTheLossIsBackAndARestartStartsAfresh) {
  HealthHarness h(Lm());
  Feed(h, 2600, [](std::mt19937& rng, uint64_t s) {
    return Loss(rng, s) * (s >= 1000 && s < 1300 ? 3.0 : 1.0);
  });
  ASSERT_THAT(h.Fired(AlertKind::kLossDivergence), SizeIs(1));
  const auto resolved = h.Resolved(AlertKind::kLossDivergence);
  ASSERT_THAT(resolved, SizeIs(1));
  EXPECT_GT(resolved[0].step, 1300u);
}

}  // namespace
}  // namespace trainwatch
