// LossSpikeRule and the LossSpike detector (docs/detectors.md) on every loss
// convention: a language-model loss (log space), losses near zero or below
// and losses printed with few digits (RL policy losses, DPO, reward models),
// on synthetic signals with fixed seeds and on a real GRPO log.
#include "health/signals/loss_spike.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health_test_util.h"
#include "shared_data.h"
#include "import/import_files.h"
#include "import/import_log.h"

namespace trainwatch {
namespace {

using ::testing::HasSubstr;
using testing::HealthHarness;
using ::testing::Not;
using testing::Rec;
using ::testing::SizeIs;

// A loss as a log prints it with `decimals` digits after the point.
double Printed(double loss, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(loss * scale) / scale;
}

// A language-model loss curve: falling slowly, 1.5% multiplicative noise.
double Loss(std::mt19937& rng, uint64_t step) {
  std::normal_distribution<double> g(0.0, 0.015);
  return (2.1 + 3.0 * std::exp(-static_cast<double>(step) / 2000.0)) *
         std::exp(g(rng));
}

// A pairwise loss (DPO, a reward model): the mean over a batch of
// -log sigmoid(margin), each pair's margin ~ N(mean, sd). 0.693 at a margin
// of 0, falling as the margins grow.
double PairwiseLoss(std::mt19937& rng, int batch, double mean, double sd) {
  std::normal_distribution<double> margin(mean, sd);
  double sum = 0;
  for (int i = 0; i < batch; ++i) sum += std::log1p(std::exp(-margin(rng)));
  return sum / batch;
}

// What the rule said about a series.
struct Fires {
  std::vector<uint64_t> at;                    // the steps it fired at
  std::vector<uint64_t> onsets;                // and the onsets it named
  std::optional<LossSpikeRule::Result> first;  // the first firing step's
  uint64_t high_steps = 0;
};

template <typename LossAt>
Fires Feed(LossSpikeRule& rule, uint64_t steps, LossAt loss_at) {
  Fires f;
  for (uint64_t s = 1; s <= steps; ++s) {
    std::optional<LossSpikeRule::Result> r = rule.Add(s, loss_at(s));
    if (!r) continue;
    f.high_steps += r->high;
    if (r->fired_now) {
      f.at.push_back(s);
      f.onsets.push_back(r->onset_step);
      if (!f.first) f.first = r;
    }
  }
  return f;
}

// --- Language-model losses: log space. ---

TEST(LossSpikeRule, NamesABloomLikeSpikeAtItsOnset) {
  LossSpikeRule rule(LossSpikeRule::Options{});
  std::mt19937 rng(3);
  std::optional<uint64_t> fired, onset;
  for (uint64_t s = 1; s <= 3000; ++s) {
    double loss = Loss(rng, s);
    // 2.2 -> 5.1 over 8 steps, back over ~30.
    if (s >= 2000 && s < 2008) loss *= 1.0 + 1.35 * (s - 1999) / 8.0;
    if (s >= 2008 && s < 2040) loss *= 1.0 + 1.35 * (2040 - s) / 32.0;
    auto r = rule.Add(s, loss);
    if (r && r->fired_now) {
      ASSERT_FALSE(fired.has_value()) << "fired twice";
      fired = s;
      onset = r->onset_step;
      EXPECT_TRUE(r->log_space);
      EXPECT_GT(r->ratio, 1.25);
    }
  }
  ASSERT_TRUE(fired.has_value());
  EXPECT_LE(*fired, 2010u);
  EXPECT_GE(*onset, 2000u);
  EXPECT_LE(*onset, 2003u);
}

TEST(LossSpikeRule, OneOrTwoHighStepsAndNoiseAreNotASpike) {
  LossSpikeRule rule(LossSpikeRule::Options{});
  std::mt19937 rng(4);
  for (uint64_t s = 1; s <= 20000; ++s) {
    double loss = Loss(rng, s);
    if (s == 5000) loss *= 3.0;               // a corrupted batch
    if (s == 9000 || s == 9001) loss *= 1.3;  // two steps
    auto r = rule.Add(s, loss);
    ASSERT_FALSE(r && r->fired_now) << s;
  }
}

TEST(LossSpikeRule, ALanguageModelLossPrintedWithFourDigitsIsStillInLogSpace) {
  LossSpikeRule rule(LossSpikeRule::Options{});
  std::mt19937 rng(8);
  const Fires f = Feed(rule, 3000, [&](uint64_t s) {
    const double spike = s >= 2000 && s < 2010 ? 1.6 : 1.0;
    return Printed(Loss(rng, s) * spike, 4);
  });
  ASSERT_TRUE(rule.recent().has_value());
  EXPECT_TRUE(rule.recent()->log_space);
  EXPECT_NEAR(rule.recent()->resolution, 1e-4, 1e-9);
  EXPECT_THAT(f.at, ::testing::ElementsAre(2002u));
  EXPECT_THAT(f.onsets, ::testing::ElementsAre(2000u));
}

// --- Losses near zero, negative, or printed with few digits. ---

TEST(LossSpikeRule, QuantizationStepsOfAPolicyLossNearZeroNeverFire) {
  // A GRPO-like policy loss printed with 4 decimals: 0.0 (or -0.0) on most
  // steps, a few 1e-4 either side on the rest, with runs of one to six
  // quanta up for five steps; and a stretch of exact zeros followed by a
  // run of one and two quanta.
  LossSpikeRule rule(LossSpikeRule::Options{});
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<double> g(-0.5e-4, 2e-4);
  const Fires f = Feed(rule, 20000, [&](uint64_t s) {
    if (s > 1000 && s % 1000 < 5) return (s / 1000 % 6 + 1) * 1e-4;
    if (s >= 12000 && s < 12300) return s % 2 ? 0.0 : -0.0;
    if (s >= 12300 && s < 12306) return s < 12303 ? 1e-4 : 2e-4;
    return u(rng) < 0.25 ? Printed(g(rng), 4) : 0.0;
  });
  EXPECT_EQ(f.high_steps, 0u);
  ASSERT_TRUE(rule.recent().has_value());
  EXPECT_FALSE(rule.recent()->log_space);
}

TEST(LossSpikeRule, APositiveLossOfAFewQuantaIsNotJudgedByItsRatioAlone) {
  // Printed as 0.0001 on most steps and 0.0002 on the rest, with runs of
  // 0.0002: in log space alone (a MAD of 0) those runs are doublings. And
  // 0.0001 .. 0.0004 with runs of 0.0006.
  for (bool wide : {false, true}) {
    SCOPED_TRACE(wide ? "1..4 quanta" : "1 or 2 quanta");
    LossSpikeRule rule(LossSpikeRule::Options{});
    std::mt19937 rng(6);
    std::uniform_int_distribution<int> quanta(1, 4);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const Fires f = Feed(rule, 5000, [&](uint64_t s) {
      if (s % 500 < 5) return wide ? 6e-4 : 2e-4;
      if (wide) return quanta(rng) * 1e-4;
      return u(rng) < 0.1 ? 2e-4 : 1e-4;
    });
    EXPECT_EQ(f.high_steps, 0u);
    ASSERT_TRUE(rule.recent().has_value());
    EXPECT_TRUE(rule.recent()->log_space);
  }
}

TEST(LossSpikeRule, AJumpOfANegativeLossFiresOnceAtItsOnset) {
  // Level -0.02, sd 0.003, printed with 4 decimals; +0.2 for 10 steps.
  LossSpikeRule rule(LossSpikeRule::Options{});
  std::mt19937 rng(7);
  std::normal_distribution<double> g(-0.02, 0.003);
  const Fires f = Feed(rule, 4000, [&](uint64_t s) {
    return s >= 2000 && s < 2010 ? 0.2 : Printed(g(rng), 4);
  });
  EXPECT_THAT(f.at, ::testing::ElementsAre(2002u));
  EXPECT_THAT(f.onsets, ::testing::ElementsAre(2000u));
  EXPECT_EQ(f.high_steps, 10u);
  ASSERT_TRUE(f.first.has_value());
  EXPECT_FALSE(f.first->log_space);
  EXPECT_NEAR(f.first->level, -0.02, 0.001);
  EXPECT_NEAR(f.first->sd, 0.003, 0.0008);
  EXPECT_NEAR(f.first->resolution, 1e-4, 1e-9);
}

TEST(LossSpikeRule, DpoAndRewardModelLossesDoNotFireOnTheirHealthyShapes) {
  struct Shape {
    const char* name;
    int batch;
    double final_margin;  // the mean margin the training approaches
    double margin_sd;
  };
  // DPO from 0.693 down to ~0.5; a reward model (accuracy ~0.7) to ~0.65;
  // DPO runs that overfit, their loss falling to ~0.0017 and ~0.00001 with a
  // long right tail (a batch with one badly ranked pair), the second printed
  // as 0.0000 on many steps (so not in log space).
  for (const Shape& shape :
       {Shape{"dpo", 32, 1.5, 2.0}, Shape{"reward model", 64, 0.6, 1.5},
        Shape{"dpo overfitting", 32, 9.0, 2.5},
        Shape{"dpo overfitting more", 32, 14.0, 2.5}}) {
    for (int decimals : {4, 16}) {
      SCOPED_TRACE(::testing::Message()
                   << shape.name << ", " << decimals << " decimals");
      LossSpikeRule rule(LossSpikeRule::Options{});
      std::mt19937 rng(9);
      const Fires f = Feed(rule, 6000, [&](uint64_t s) {
        const double mean = shape.final_margin * (1 - std::exp(-1e-3 * s));
        return Printed(PairwiseLoss(rng, shape.batch, mean, shape.margin_sd),
                       decimals);
      });
      EXPECT_THAT(f.at, ::testing::IsEmpty());
    }
  }
}

TEST(LossSpikeRule, ADivergingDpoLossFires) {
  // From ~0.17 (a batch-to-batch sd of 35%) to ~3, the policy preferring
  // the rejected answers for 20 steps.
  LossSpikeRule rule(LossSpikeRule::Options{});
  std::mt19937 rng(10);
  const Fires f = Feed(rule, 3000, [&](uint64_t s) {
    const double mean = s >= 2000 && s < 2020 ? -3.0 : 3.0;
    return Printed(PairwiseLoss(rng, 32, mean, 2.0), 4);
  });
  EXPECT_THAT(f.at, ::testing::ElementsAre(2002u));
  EXPECT_THAT(f.onsets, ::testing::ElementsAre(2000u));
}

TEST(LossSpikeRule, AConstantLossGivesNothingToJudgeAJumpAgainst) {
  LossSpikeRule rule(LossSpikeRule::Options{});
  const Fires f = Feed(
      rule, 1000, [](uint64_t s) { return s > 500 && s < 510 ? 0.3 : 0.0; });
  EXPECT_EQ(f.high_steps, 0u);
}

TEST(LossSpikeRule, IgnoresNonFiniteLossesOnly) {
  LossSpikeRule rule(LossSpikeRule::Options{.min_steps = 1});
  EXPECT_FALSE(rule.Add(1, NAN).has_value());
  EXPECT_FALSE(rule.Add(2, INFINITY).has_value());
  EXPECT_FALSE(rule.recent().has_value());
  EXPECT_FALSE(rule.Add(3, -0.5).has_value());  // the first: history only
  EXPECT_TRUE(rule.Add(4, -0.5).has_value());
  ASSERT_TRUE(rule.recent().has_value());
  EXPECT_EQ(rule.recent()->median, -0.5);
  EXPECT_FALSE(rule.recent()->log_space);
}

// The median and log statistics of a history of positive losses, as the
// rule defines them.
struct LogStatistics {
  double median, log_median, log_sd;
};
LogStatistics ExactLogStatistics(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size() / 2;
  std::vector<double> dev;
  for (double x : v) dev.push_back(std::abs(std::log(x) - std::log(v[k])));
  std::sort(dev.begin(), dev.end());
  return {v[k], std::log(v[k]), 1.4826 * dev[k]};
}

// The statistics come from a sorted copy of the history, updated at each
// refresh (the median read, each deviation quantile found by a binary
// search): exactly those of the history then, with ties, heavy tails,
// signed and mostly-zero losses, the history not yet full, and refreshes
// further apart than the history is long.
void ExpectExactStatistics(uint32_t recent_steps, uint32_t refresh_steps) {
  SCOPED_TRACE(::testing::Message() << "history " << recent_steps
                                    << ", refresh every " << refresh_steps);
  LossSpikeRule::Options o;
  o.recent_steps = recent_steps;
  o.min_steps = 1;
  o.refresh_steps = refresh_steps;
  // Nothing is high, so every loss enters the history.
  o.sigmas = 1e300;
  o.min_quanta = 1e300;
  o.min_ratio = 1e300;
  o.min_sd = 0.0;
  LossSpikeRule rule(o);
  std::mt19937 rng(11);
  std::cauchy_distribution<double> tail(0.0, 0.3);
  std::uniform_int_distribution<int> level(1, 6);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<double> policy(0.0, 2e-4), negative(-0.02, 0.003);
  std::vector<double> history;
  size_t log_space = 0, mad_zero = 0, q90_wider = 0, all_equal = 0;
  for (uint64_t s = 1; s <= 9000; ++s) {
    const uint64_t phase = s % 3000;
    double loss;
    if (phase < 600) {
      loss = 0.5 * level(rng);  // few digits: many ties
    } else if (phase < 1200) {
      loss = std::exp(1.0 + tail(rng));  // heavy-tailed, log space
    } else if (phase < 1800) {
      loss = u(rng) < 0.2 ? Printed(policy(rng), 4) : 0.0;  // MAD 0
    } else if (phase < 2100) {
      loss = u(rng) < 0.05 ? (u(rng) < 0.5 ? 1e-4 : -1e-4) : 0.0;  // q90 0
    } else if (phase < 2200) {
      loss = 0.0;  // all equal
    } else {
      loss = negative(rng);  // continuous, below 0
    }
    rule.Add(s, loss);
    history.push_back(loss);
    if (history.size() > o.recent_steps) history.erase(history.begin());
    if ((s - 1) % refresh_steps != 0) continue;  // refreshes: 1, 1 + R, ...
    std::vector<double> v = history;
    std::sort(v.begin(), v.end());
    const size_t n = v.size(), k = n / 2;
    const double m = v[k];
    double gap = INFINITY;
    for (size_t i = 1; i < n; ++i) {
      if (v[i] > v[i - 1]) gap = std::min(gap, v[i] - v[i - 1]);
    }
    std::vector<double> dev;
    for (double x : v) dev.push_back(std::abs(x - m));
    std::sort(dev.begin(), dev.end());
    const double by_mad = 1.4826 * dev[k];
    const double by_q90 = (1.0 / 1.6449) * dev[n * 9 / 10];
    ASSERT_TRUE(rule.recent().has_value()) << s;
    const LossSpikeRule::Recent& r = *rule.recent();
    ASSERT_EQ(r.median, m) << s;
    ASSERT_EQ(r.sd, std::max(by_mad, by_q90)) << s;
    ASSERT_EQ(r.resolution, std::isinf(gap) ? 0.0 : gap) << s;
    mad_zero += by_mad == 0;
    q90_wider += by_q90 > by_mad;
    all_equal += std::isinf(gap);
    ASSERT_EQ(r.log_space, v[0] > 0) << s;
    if (!r.log_space) continue;
    ++log_space;
    const LogStatistics e = ExactLogStatistics(v);
    ASSERT_EQ(r.log_median, e.log_median) << s;
    ASSERT_EQ(r.log_sd, e.log_sd) << s;
  }
  // Each kind of history came up.
  EXPECT_GT(log_space, 0u);
  EXPECT_GT(q90_wider, mad_zero);
  EXPECT_GT(mad_zero, all_equal);
  EXPECT_GT(all_equal, 0u);
}

TEST(LossSpikeRule, StatisticsAreExactlyThoseOfTheHistory) {
  ExpectExactStatistics(100, 8);  // the defaults
  ExpectExactStatistics(100, 1);
  ExpectExactStatistics(7, 3);
  ExpectExactStatistics(10, 25);  // values enter and leave in between
}

void ExpectStatistics(const LossSpikeRule& rule, const std::vector<double>& history) {
  ASSERT_TRUE(rule.recent().has_value());
  const LogStatistics e = ExactLogStatistics(history);
  EXPECT_EQ(rule.recent()->median, e.median);
  EXPECT_EQ(rule.recent()->log_median, e.log_median);
  EXPECT_EQ(rule.recent()->log_sd, e.log_sd);
}

// A loss that falls 10x over its 100-step history moves the median and the
// spread within the 8 steps between refreshes: a step near the line (here
// 1.3x the level, half-way to the 1.5x line) is judged on the statistics of
// the history as it is, not as it was at the last refresh.
TEST(LossSpikeRule, AStepNearTheLineIsJudgedOnTheHistoryAsItIsNow) {
  LossSpikeRule rule(LossSpikeRule::Options{});
  std::mt19937 rng(5);
  std::normal_distribution<double> noise(0.0, 0.02);
  std::vector<double> history;  // the last 100 losses
  const auto falling = [&](uint64_t s) {
    return 5.0 * std::exp(-static_cast<double>(s) / 43.0) * std::exp(noise(rng));
  };
  for (uint64_t s = 1; s <= 203; ++s) {  // 203: 3 steps after a refresh
    const double loss = falling(s);
    rule.Add(s, loss);
    history.push_back(loss);
    if (history.size() > 100) history.erase(history.begin());
  }
  const LossSpikeRule::Recent stale = *rule.recent();
  ASSERT_GT(stale.median, ExactLogStatistics(history).median);  // stale: higher
  // 3/4 of the way to the line as it was.
  const double line = std::max(std::log(1.5), 4.0 * stale.log_sd);
  ASSERT_TRUE(rule.Add(204, stale.median * std::exp(0.75 * line)).has_value());
  ExpectStatistics(rule, history);
}

// A spike's aftermath, the loss back under the spike line but still well
// above its level (1.4x, past the calm line at 1.31x), stays out of the
// history until calm_steps steps in a row are calm; then those enter. The
// spike's recovery tail would otherwise widen the spread the next spike is
// judged against.
TEST(LossSpikeRule, ASpikesAftermathEntersTheHistoryOnlyOnceTheLossIsCalm) {
  LossSpikeRule::Options o;
  o.refresh_steps = 1;  // the statistics are those of the history at each step
  LossSpikeRule rule(o);
  std::mt19937 rng(9);
  std::normal_distribution<double> noise(0.0, 0.01);
  std::vector<double> all, calm;  // every loss; those that should enter
  uint64_t s = 0;
  const auto feed = [&](int steps, double factor, bool enters) {
    for (int i = 0; i < steps; ++i) {
      const double loss = factor * std::exp(noise(rng));
      rule.Add(++s, loss);
      all.push_back(loss);
      if (enters) calm.push_back(loss);
    }
  };
  feed(150, 1.0, true);
  feed(4, 5.0, false);    // a spike, named on its third step
  feed(30, 1.4, false);   // its aftermath
  feed(4, 1.0, false);    // calm, held back ...
  ExpectStatistics(rule, std::vector<double>(calm.end() - 100, calm.end()));
  calm.insert(calm.end(), all.end() - 4, all.end());
  feed(1, 1.0, true);     // ... until the fifth in a row: all five enter
  const std::vector<double> history(calm.end() - 100, calm.end());
  ExpectStatistics(rule, history);
  // Had the aftermath entered, the spread would differ.
  const std::vector<double> with_tail(all.end() - 100, all.end());
  EXPECT_GT(ExactLogStatistics(with_tail).log_sd, 2 * ExactLogStatistics(history).log_sd);
}

// --- The detector, through RunHealth. ---

TEST(LossSpikeRule, AHardBatchIsReportedWhenItsWindowCloses) {
  LossSpikeRule rule(LossSpikeRule::Options{});
  std::mt19937 rng(5);
  std::vector<std::pair<uint64_t, LossSpikeRule::HardBatch>> hard;
  for (uint64_t s = 1; s <= 3000; ++s) {
    double loss = Loss(rng, s);
    if (s == 1000) loss *= 3.0;                // one high step
    if (s == 2000 || s == 2002) loss *= 2.5;   // two of five
    auto r = rule.Add(s, loss);
    ASSERT_FALSE(r && r->fired_now) << s;
    if (r && r->hard_batch) hard.emplace_back(s, *r->hard_batch);
  }
  ASSERT_THAT(hard, SizeIs(2));
  EXPECT_EQ(hard[0].first, 1004u);  // the window's fifth loss closes it
  EXPECT_EQ(hard[0].second.onset_step, 1000u);
  EXPECT_EQ(hard[0].second.high_steps, 1u);
  EXPECT_NEAR(hard[0].second.peak, 3.0, 0.15);
  EXPECT_EQ(hard[1].second.onset_step, 2000u);
  EXPECT_EQ(hard[1].second.high_steps, 2u);
}

TEST(LossSpikeRule, ASpikeRightAfterAHardBatchIsNamed) {
  // The hard batch's window passes with one high step; the spike starts at
  // its last loss's successor and is an episode of its own.
  LossSpikeRule rule(LossSpikeRule::Options{});
  std::mt19937 rng(6);
  const Fires f = Feed(rule, 3000, [&](uint64_t s) {
    double loss = Loss(rng, s);
    if (s == 2000) loss *= 3.0;
    if (s >= 2005 && s < 2015) loss *= 3.0;
    return loss;
  });
  ASSERT_THAT(f.onsets, SizeIs(1));
  EXPECT_EQ(f.onsets[0], 2005u);
}

TEST(LossSpikeRule, ASparselyLoggedLossCountsItsRecords) {
  // A loss logged every 10 steps: 3 of its 5 records from the first high
  // one make a spike (50 steps of the run), 1 of 5 a hard batch.
  LossSpikeRule rule(LossSpikeRule::Options{});
  std::mt19937 rng(7);
  std::optional<uint64_t> onset;
  int hard = 0;
  for (uint64_t s = 10; s <= 30000; s += 10) {
    double loss = Loss(rng, s);
    if (s == 10000) loss *= 3.0;
    if (s >= 20000 && s <= 20020) loss *= 3.0;
    auto r = rule.Add(s, loss);
    if (r && r->fired_now) onset = r->onset_step;
    if (r && r->hard_batch) ++hard;
  }
  EXPECT_EQ(onset, std::optional<uint64_t>(20000));
  EXPECT_EQ(hard, 1);
}

RunInfo Bf16() {
  return RunInfo{.run_id = "r",
                 .precision = v1::BF16,
                 .max_norm = 1.0,
                 .warmup_steps = 100};
}

TEST(LossSpikeDetector, ANegativeLossJumpPagesOnceInLinearTerms) {
  HealthHarness h(Bf16());
  std::mt19937 rng(12);
  std::lognormal_distribution<double> norm(std::log(0.3), 0.15);
  std::normal_distribution<double> g(-0.02, 0.003);
  for (uint64_t s = 1; s <= 3000; ++s) {
    v1::StepRecord r = Rec(s, norm(rng));
    r.set_loss(s >= 2000 && s < 2010 ? 0.2 : Printed(g(rng), 4));
    h.Lead(r);
  }
  auto fired = h.Fired(AlertKind::kLossSpike);
  ASSERT_THAT(fired, SizeIs(1));
  EXPECT_EQ(fired[0].onset_step, 2000u);
  EXPECT_NEAR(fired[0].peak, 0.22, 0.002);  // the jump, not a ratio
  EXPECT_THAT(fired[0].description, HasSubstr("above its recent level -0.02"));
  EXPECT_THAT(fired[0].description, HasSubstr("resolution 0.0001"));
  EXPECT_THAT(fired[0].description, Not(HasSubstr("x its recent level")));
  EXPECT_THAT(fired[0].description, HasSubstr("restart plan"));
  bool listed = false;
  for (const SpikeInfo& s : h.spikes) listed |= s.step == 2000;
  EXPECT_TRUE(listed);
}

TEST(LossSpikeDetector, AHardBatchIsListedApartWithItsBatchIds) {
  HealthHarness h(Bf16());
  std::mt19937 rng(13);
  std::lognormal_distribution<double> norm(std::log(0.3), 0.15);
  for (uint64_t s = 1; s <= 2000; ++s) {
    v1::StepRecord r = Rec(s, norm(rng));
    r.set_loss(Loss(rng, s) * (s == 1500 ? 4.0 : 1.0));  // Rec's batch id: 10 s
    h.Lead(r);
  }
  EXPECT_THAT(h.Fired(AlertKind::kLossSpike), SizeIs(0));
  std::vector<SpikeInfo> hard;
  for (const SpikeInfo& s : h.spikes) {
    if (s.kind == SpikeInfo::Kind::kHardBatch) hard.push_back(s);
  }
  ASSERT_THAT(hard, SizeIs(1));
  EXPECT_EQ(hard[0].step, 1500u);
  EXPECT_EQ(hard[0].high_steps, 1u);
  EXPECT_TRUE(hard[0].peak_is_ratio);
  EXPECT_NEAR(hard[0].loss_peak, 4.0, 0.2);
  EXPECT_THAT(hard[0].batch_ids, ::testing::ElementsAre(15000));
}

TEST(LossSpikeDetector, SpikesOfALossThatLeftItsLevelLongAgoAreTheDivergences) {
  // The loss's level climbs 3x over steps 1000-1200 and stays there
  // (LossDivergence); a spike soon after the climb is still listed, one
  // 400 steps later is the divergence's.
  HealthHarness h(Bf16());
  std::mt19937 rng(14);
  std::lognormal_distribution<double> norm(std::log(0.3), 0.15);
  for (uint64_t s = 1; s <= 2000; ++s) {
    const double climb = std::clamp((static_cast<double>(s) - 1000.0) / 200.0, 0.0, 1.0);
    double loss = Loss(rng, s) * std::exp(climb * std::log(3.0));
    if ((s >= 1230 && s < 1240) || (s >= 1600 && s < 1610)) loss *= 3.0;
    v1::StepRecord r = Rec(s, norm(rng));
    r.set_loss(loss);
    h.Lead(r);
  }
  const auto divergences = h.Fired(AlertKind::kLossDivergence);
  ASSERT_THAT(divergences, SizeIs(1));
  EXPECT_LT(divergences[0].step, 1230u);
  std::vector<uint64_t> onsets;
  for (const auto& f : h.Fired(AlertKind::kLossSpike)) onsets.push_back(f.onset_step);
  EXPECT_THAT(onsets, ::testing::Contains(1230u));
  EXPECT_THAT(onsets, Not(::testing::Contains(1600u)));
}

// The policy loss of a real GRPO fine-tune (trainer_state.json, printed with
// 4 decimals: 0.0 on most steps, down to -0.0012 and up to 0.0006). Log space
// read one quantum as a doubling and paged 4 times ("loss 0.0002 at step
// 1610 is 2.00x its recent level 0.0001").
std::string RealGrpoPath() {
  return std::string(TW_SHARED_TESTDATA) +
         "/real-logs/Learned-Remasking-Policy-for-dLLM__pretrained_checkpoint-"
         "2000_trainer_state.json";
}

std::vector<v1::StepRecord> RealGrpoRecords(cli::ImportPlan* plan) {
  cli::LoggedRun run;
  const std::string path = RealGrpoPath();
  absl::Status read = cli::ImportFile(path, cli::ImportFormat::kHf, {}, &run);
  EXPECT_TRUE(read.ok()) << read;
  absl::StatusOr<cli::ImportPlan> p = PlanImport(run, {});
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return {};
  *plan = *p;
  return p->records;
}

TEST(LossSpikeRule, ARealGrpoPolicyLossHasNoHighStep) {
  TW_SKIP_WITHOUT_SHARED(RealGrpoPath());
  cli::ImportPlan plan;
  const std::vector<v1::StepRecord> records = RealGrpoRecords(&plan);
  ASSERT_EQ(records.size(), 2000u);
  LossSpikeRule rule(LossSpikeRule::Options{});
  uint64_t judged = 0, high = 0;
  for (const v1::StepRecord& r : records) {
    ASSERT_TRUE(r.has_loss());
    auto s = rule.Add(r.step(), r.loss());
    judged += s.has_value();
    high += s && s->high;
  }
  EXPECT_GT(judged, 1900u);
  EXPECT_EQ(high, 0u);
  ASSERT_TRUE(rule.recent().has_value());
  EXPECT_FALSE(rule.recent()->log_space);
  EXPECT_NEAR(rule.recent()->resolution, 1e-4, 1e-9);
}

TEST(LossSpikeDetector, ARealGrpoPolicyLossDoesNotPage) {
  TW_SKIP_WITHOUT_SHARED(RealGrpoPath());
  cli::ImportPlan plan;
  const std::vector<v1::StepRecord> records = RealGrpoRecords(&plan);
  ASSERT_FALSE(records.empty());
  HealthHarness h(
      RunInfo{.run_id = "grpo",
              .precision = static_cast<v1::Precision>(plan.precision),
              .max_norm = plan.max_norm,
              .warmup_steps = plan.warmup_steps});
  for (const v1::StepRecord& r : records) h.Lead(r);
  EXPECT_THAT(h.Fired(AlertKind::kLossSpike), ::testing::IsEmpty());
}

}  // namespace
}  // namespace trainwatch
