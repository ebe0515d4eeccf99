// The fp16 detectors (detectors/fp16.cc) on simulated GradScaler runs, through
// the real RunHealth and alert tracker.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health/signals/change_detection.h"
#include "health_test_util.h"

namespace trainwatch {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::trainwatch::testing::HealthHarness;
using ::trainwatch::testing::Rec;

constexpr double kInf = std::numeric_limits<double>::infinity();

// A healthy fp16 run as torch.cuda.amp.GradScaler drives it: the scale halves
// on the overflowing steps of its start (it begins too high), then doubles
// every growth_interval clean steps; a scale grown past 2^17 overflows within
// ~100 steps and halves back. Norms are lognormal around a median that falls
// as the LR decays; layer stats come every 100 steps.
class Fp16Run {
 public:
  struct Options {
    uint64_t seed = 1;
    uint64_t warmup_steps = 2000;
    uint64_t total_steps = 60000;  // the LR schedule length
    double initial_scale = 65536;
    // Steps that overflow (skipped, inf norm, the scale halves). By default
    // the scaler's search for its starting scale, and one more in warmup.
    std::set<uint64_t> overflows_at = {0, 1, 2, 3, 40};
    double random_overflow_p = 0.0;  // an overflow out of the blue, per step
  };

  explicit Fp16Run(Options options) : o_(std::move(options)), rng_(o_.seed) {
    scale_ = o_.initial_scale;
  }

  RunInfo Info() const {
    RunInfo info;
    info.run_id = "fp16-run";
    info.precision = v1::FP16;
    info.max_norm = kMaxNorm;
    info.warmup_steps = o_.warmup_steps;
    info.scaler_growth_interval = kGrowthInterval;
    info.adam_eps = 1e-8;
    return info;
  }

  uint64_t step() const { return step_; }
  double scale() const { return scale_; }

  // The next step of the healthy run (an overflow when one is due).
  v1::StepRecord Next() {
    if (o_.overflows_at.contains(step_) || step_ == growth_overflow_ ||
        std::bernoulli_distribution(o_.random_overflow_p)(rng_)) {
      return Overflow();
    }
    const double norm = HealthyNorm();
    if (++clean_steps_ == kGrowthInterval) {
      clean_steps_ = 0;
      scale_ *= 2;
      if (scale_ > kHighestSafeScale) {
        growth_overflow_ =
            step_ + std::uniform_int_distribution<uint64_t>(1, 100)(rng_);
      }
    }
    return Make(norm, /*skipped=*/false);
  }

  // An overflowing step: skipped, inf norm. A correct scaler halves the scale
  // (update_scale); one whose update() runs only on clean steps keeps it.
  v1::StepRecord Overflow(bool update_scale = true) {
    HealthyNorm();  // keeps the noise of later steps the same
    if (update_scale) {
      scale_ /= 2;
      clean_steps_ = 0;
    }
    return Make(kInf, /*skipped=*/true);
  }

 private:
  static constexpr double kMaxNorm = 1.0;
  static constexpr uint32_t kGrowthInterval = 2000;
  static constexpr double kHighestSafeScale = 131072;  // 2^17

  double HealthyNorm() {
    const double progress = static_cast<double>(step_) / o_.total_steps;
    const double median =
        step_ < o_.warmup_steps ? 0.5 : 0.45 * (1.0 - 0.5 * progress);
    return median * std::exp(0.25 * normal_(rng_));
  }

  v1::StepRecord Make(double norm, bool skipped) {
    v1::StepRecord r = Rec(step_, norm, kMaxNorm);
    r.set_loss_scale(scale_);
    r.set_skipped(skipped);
    r.set_loss(2.0 + std::exp(-static_cast<double>(step_) / 10000) +
               0.05 * normal_(rng_));
    if (step_ % 100 == 0) {
      for (const char* layer : {"blocks.0.attn", "blocks.0.mlp", "lm_head"}) {
        v1::LayerStats& stats = (*r.mutable_layer_stats())[layer];
        stats.set_grad_rms(1e-4 * std::exp(0.2 * normal_(rng_)));
        stats.set_grad_norm(stats.grad_rms() * 1000);
        stats.set_g_over_sqrt_v_rms(std::exp(0.15 * normal_(rng_)));
      }
    }
    ++step_;
    return r;
  }

  Options o_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> normal_;
  uint64_t step_ = 0;
  double scale_ = 0.0;
  uint32_t clean_steps_ = 0;  // since the last overflow or growth
  uint64_t growth_overflow_ = std::numeric_limits<uint64_t>::max();
};

// Sets a record's norm as a client would, re-deriving clipped and clip_coef.
void SetNorm(v1::StepRecord& r, double norm, double max_norm = 1.0) {
  const v1::StepRecord derived = Rec(r.step(), norm, max_norm);
  r.set_grad_norm(norm);
  r.set_clipped(derived.clipped());
  if (derived.has_clip_coef()) {
    r.set_clip_coef(derived.clip_coef());
  } else {
    r.clear_clip_coef();
  }
}

// The nearest-rank median, as OrderStatWindow::Median() takes it.
double Median(std::vector<double> values) {
  const size_t index = (values.size() + 1) / 2 - 1;
  std::nth_element(values.begin(), values.begin() + index, values.end());
  return values[index];
}

TEST(LossScaleCollapse, FiresOnHalvingsOnConsecutiveSteps) {
  Fp16Run run({.warmup_steps = 500, .initial_scale = 64, .overflows_at = {}});
  HealthHarness h(run.Info());
  const auto& cfg = h.config().loss_scale;
  while (run.step() < 1000) h.Lead(run.Next());
  ASSERT_EQ(run.scale(), 64);
  // 64 on step 999, then 32, 16, 8, 4, 2 on steps 1000..1004.
  std::vector<uint64_t> halvings;
  for (int i = 0; i < 5; ++i) {
    halvings.push_back(run.step());
    h.Lead(run.Overflow());
  }
  ASSERT_EQ(run.scale(), 2);
  while (run.step() < 1400) h.Lead(run.Next());

  const auto fired = h.Fired(AlertKind::kLossScaleCollapse);
  ASSERT_EQ(fired.size(), 1u);
  const uint64_t fire_step = halvings[cfg.halvings - 1];
  EXPECT_EQ(fired[0].step, fire_step);
  EXPECT_THAT(fired[0].description,
              HasSubstr(absl::StrFormat(
                  "loss scale fell 64 -> %g in %d halvings over %d steps "
                  "(steps 999..%d), no growth between",
                  64 / std::pow(2.0, cfg.halvings), cfg.halvings,
                  fire_step - 999, fire_step)));
  // Holds while `halvings` of them are within the last within_steps steps.
  const uint64_t last_hold =
      halvings[halvings.size() - cfg.halvings] + cfg.within_steps - 1;
  const auto resolved = h.Resolved(AlertKind::kLossScaleCollapse);
  ASSERT_EQ(resolved.size(), 1u);
  EXPECT_EQ(resolved[0].step, last_hold + h.config().resolve_after_steps);
}

TEST(LossScaleCollapse, SilentOnFewerHalvingsWithTheSameNoise) {
  Fp16Run run({.warmup_steps = 500, .initial_scale = 64, .overflows_at = {}});
  HealthHarness h(run.Info());
  while (run.step() < 1000) h.Lead(run.Next());
  for (uint32_t i = 0; i + 1 < h.config().loss_scale.halvings; ++i) {
    h.Lead(run.Overflow());
  }
  while (run.step() < 1400) h.Lead(run.Next());
  EXPECT_THAT(h.transitions, IsEmpty());
}

TEST(LossScaleCollapse, FiresWhenTheScaleFallsBelowMinScale) {
  // Halvings too far apart to count, down to 0.5.
  Fp16Run run({.warmup_steps = 500,
               .initial_scale = 4,
               .overflows_at = {1000, 1150, 1300}});
  HealthHarness h(run.Info());
  const double min_scale = h.config().loss_scale.min_scale;
  uint64_t first_low = 0, last_low = 0;
  while (run.step() < 4000) {
    const v1::StepRecord r = run.Next();
    if (r.loss_scale() < min_scale) {
      if (first_low == 0) first_low = r.step();
      last_low = r.step();
    }
    h.Lead(r);
  }
  ASSERT_GT(first_low, 0u);
  ASSERT_LT(last_low + h.config().resolve_after_steps, 4000u);  // it grew back

  const auto fired = h.Fired(AlertKind::kLossScaleCollapse);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].step, first_low);
  EXPECT_THAT(fired[0].description,
              HasSubstr(absl::StrFormat("loss scale 0.5 at step %d is below %g",
                                        first_low, min_scale)));
  const auto resolved = h.Resolved(AlertKind::kLossScaleCollapse);
  ASSERT_EQ(resolved.size(), 1u);
  EXPECT_EQ(resolved[0].step, last_low + h.config().resolve_after_steps);
}

TEST(LossScaleCollapse, IgnoresTheScalerFindingItsStartingScale) {
  // 65536 -> 256 on the first eight steps, before any clean step.
  Fp16Run run({.warmup_steps = 500, .overflows_at = {0, 1, 2, 3, 4, 5, 6, 7}});
  HealthHarness h(run.Info());
  while (run.step() < 1000) h.Lead(run.Next());
  EXPECT_EQ(run.scale(), 256);
  EXPECT_THAT(h.transitions, IsEmpty());
}

TEST(SkipRateHigh, FiresWhenOneStepInTenOverflows) {
  Fp16Run run({.warmup_steps = 200, .overflows_at = {}});
  HealthHarness h(run.Info());
  const auto& cfg = h.config().skip_rate;
  const uint64_t w = h.config().window_steps;
  std::vector<uint64_t> skips;
  while (run.step() < 3000) {
    const bool overflow =
        run.step() >= 1200 && run.step() < 1600 && run.step() % 10 == 0;
    if (overflow) skips.push_back(run.step());
    h.Lead(overflow ? run.Overflow() : run.Next());
  }
  // The window is full of post-warmup steps from step 1199 on, so its rule
  // holds from the skip that takes the count above threshold * W; the CUSUM
  // names the jump to 10% sooner, with its change point. Once firing, it
  // holds while the window is above resolve_ratio x threshold, and until the
  // downward test is convinced the rate is clearly below (hysteresis).
  const size_t needed = static_cast<size_t>(cfg.threshold * w) + 1;
  const uint64_t fire_step = skips[needed - 1];
  const size_t resolve_needed =
      static_cast<size_t>(h.config().change.resolve_ratio * cfg.threshold * w) + 1;
  const uint64_t window_last_hold = skips[skips.size() - resolve_needed] + w - 1;

  const auto fired = h.Fired(AlertKind::kSkipRateHigh);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_GT(fired[0].step, 1200u);
  EXPECT_LT(fired[0].step, fire_step);
  EXPECT_EQ(fired[0].onset_step, 1200u);
  EXPECT_THAT(fired[0].description, HasSubstr("since step 1200 (the change point"));
  RateFallTest fall(cfg.threshold, h.config().change.resolve_ratio,
                    h.config().change.arl0);
  const std::set<uint64_t> skipped(skips.begin(), skips.end());
  uint64_t fallen_from = 0;
  for (uint64_t step = fired[0].step; step < 3000; ++step) {
    if (!fall.Add(step, skipped.count(step) > 0)) {
      fallen_from = 0;
    } else if (fallen_from == 0) {
      fallen_from = step;
    }
  }
  ASSERT_GT(fallen_from, skips.back());
  // At a 1% threshold the test needs ~1250 clean steps after the last skip:
  // it resolves later than the window alone would.
  const uint64_t last_hold = std::max(window_last_hold, fallen_from - 1);
  EXPECT_GT(last_hold, window_last_hold);
  const auto resolved = h.Resolved(AlertKind::kSkipRateHigh);
  ASSERT_EQ(resolved.size(), 1u);
  EXPECT_EQ(resolved[0].step, last_hold + h.config().resolve_after_steps);
}

TEST(SkipRateHigh, SilentWhenOneStepInTwoHundredOverflows) {
  Fp16Run run({.warmup_steps = 200, .overflows_at = {}});
  HealthHarness h(run.Info());
  while (run.step() < 3000) {
    const bool overflow =
        run.step() >= 1200 && run.step() < 1600 && run.step() % 200 == 0;
    h.Lead(overflow ? run.Overflow() : run.Next());
  }
  EXPECT_THAT(h.transitions, IsEmpty());
}

TEST(ScalerStuck, FiresWhenOverflowsLeaveTheScaleUnchanged) {
  Fp16Run run({.warmup_steps = 500});
  HealthHarness h(run.Info());
  const uint32_t consecutive = h.config().scaler_stuck.consecutive;
  while (run.step() < 3000) h.Lead(run.Next());
  const double stuck_scale = run.scale();
  // update() only on clean steps: the scale never drops.
  for (int i = 0; i < 20; ++i) h.Lead(run.Overflow(/*update_scale=*/false));
  const uint64_t last_skip = run.step() - 1;
  while (run.step() < 3300) h.Lead(run.Next());

  const auto fired = h.Fired(AlertKind::kScalerStuck);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].step, 3000u + consecutive - 1);
  EXPECT_THAT(fired[0].description,
              HasSubstr(absl::StrFormat(
                  "%d skipped steps in a row (steps 3000..%d) with the loss "
                  "scale stuck at %g",
                  consecutive, 3000 + consecutive - 1, stuck_scale)));
  const auto resolved = h.Resolved(AlertKind::kScalerStuck);
  ASSERT_EQ(resolved.size(), 1u);
  EXPECT_EQ(resolved[0].step, last_skip + h.config().resolve_after_steps);
}

TEST(ScalerStuck, SilentWhenTheScaleHalvesOnEachOverflow) {
  Fp16Run run({.warmup_steps = 500});
  HealthHarness h(run.Info());
  while (run.step() < 3000) h.Lead(run.Next());
  for (int i = 0; i < 3; ++i) h.Lead(run.Overflow());
  while (run.step() < 3300) h.Lead(run.Next());
  EXPECT_THAT(h.transitions, IsEmpty());
}

TEST(NonFiniteUpdate, FiresOnAppliedNanNormOrInfLoss) {
  // A bf16 run: nothing skips non-finite steps.
  RunInfo info;
  info.run_id = "bf16-run";
  info.precision = v1::BF16;
  info.max_norm = 1.0;
  info.warmup_steps = 200;
  HealthHarness h(info);
  const uint32_t resolve_after = h.config().resolve_after_steps;
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> noise(std::log(0.4), 0.25);
  const uint64_t nan_step = 1500, inf_loss_step = 2000;
  for (uint64_t step = 0; step < 2300; ++step) {
    v1::StepRecord r = Rec(step, noise(rng));
    r.set_loss(2.5);
    if (step == nan_step) SetNorm(r, std::nan(""));
    if (step == inf_loss_step) r.set_loss(kInf);
    h.Lead(r);
  }

  const auto fired = h.Fired(AlertKind::kNonFiniteUpdate);
  ASSERT_EQ(fired.size(), 2u);
  EXPECT_EQ(fired[0].step, nan_step);
  EXPECT_THAT(
      fired[0].description,
      HasSubstr(absl::StrFormat(
          "step %d was applied (not skipped) with grad_norm nan", nan_step)));
  EXPECT_THAT(fired[0].batch_ids,
              ::testing::ElementsAre(static_cast<int64_t>(nan_step) * 10));
  EXPECT_EQ(fired[1].step, inf_loss_step);
  EXPECT_THAT(fired[1].description, HasSubstr("and loss inf"));
  const auto resolved = h.Resolved(AlertKind::kNonFiniteUpdate);
  ASSERT_EQ(resolved.size(), 2u);
  EXPECT_EQ(resolved[0].step, nan_step + resolve_after);
  EXPECT_EQ(resolved[1].step, inf_loss_step + resolve_after);
}

// A diverging fp16 run: the scale collapses (every step overflows and
// halves it), then steps are applied with Inf norms and a NaN loss. That is
// one cause: LossScaleCollapse and NonFiniteUpdate page; the Inf norms are
// not clipped steps, and nothing else pages without a caused_by.
TEST(NonFiniteUpdate, ADivergingFp16RunIsOneCauseNotAClipFractionPage) {
  Fp16Run run({.warmup_steps = 200});
  HealthHarness h(run.Info());
  while (run.step() < 2000) h.Lead(run.Next());
  for (int i = 0; i < 20; ++i) h.Lead(run.Overflow());
  for (int i = 0; i < 300; ++i) {
    v1::StepRecord r = run.Next();
    SetNorm(r, kInf);
    r.set_loss(std::nan(""));
    r.set_skipped(false);
    h.Lead(r);
  }
  EXPECT_FALSE(h.Fired(AlertKind::kLossScaleCollapse).empty());
  EXPECT_FALSE(h.Fired(AlertKind::kNonFiniteUpdate).empty());
  EXPECT_THAT(h.Fired(AlertKind::kClipFractionHigh), IsEmpty());
  for (const auto& t : h.transitions) {
    if (!t.firing || Spec(t.kind).severity == v1::SEVERITY_INFO) continue;
    if (t.kind == AlertKind::kLossScaleCollapse || t.kind == AlertKind::kScalerStuck) {
      continue;
    }
    EXPECT_FALSE(t.caused_by.empty())
        << Spec(t.kind).name << " at " << t.step << " pages on its own: "
        << t.description;
  }
}

TEST(NonFiniteUpdate, SilentOnSkippedOverflowSteps) {
  Fp16Run run({.warmup_steps = 200});
  HealthHarness h(run.Info());
  while (run.step() < 1500) h.Lead(run.Next());
  h.Lead(run.Overflow());  // inf norm, skipped: normal fp16 behaviour
  while (run.step() < 1700) h.Lead(run.Next());
  EXPECT_THAT(h.transitions, IsEmpty());
}

// Clipping scaled gradients: the norm clip_grad_norm_ sees is the loss scale
// times the true norm, so every step clips.
class ClipBeforeUnscaleTest : public ::testing::Test {
 protected:
  // Feeds steps [0, end); the bug is live on [0, fixed_at).
  void Feed(HealthHarness& h, Fp16Run& run, uint64_t fixed_at, uint64_t end) {
    const uint32_t steps = h.config().clip_before_unscale.steps;
    while (run.step() < end) {
      v1::StepRecord r = run.Next();
      if (!r.skipped()) {
        if (r.step() < fixed_at) SetNorm(r, r.grad_norm() * r.loss_scale());
        recent_.push_back(
            {r.step(), r.grad_norm(), r.loss_scale(), r.clipped()});
        if (recent_.size() > steps) recent_.pop_front();
        // The rule, as the test's oracle: a full window, clipped on at least
        // clip_fraction of it, median norm / scale at least min_norm_to_scale.
        if (recent_.size() == steps && Holds(h.config())) {
          if (fire_step_ == 0) Snapshot(r.step());
          last_hold_ = r.step();
        }
      }
      h.Lead(r);
    }
  }

  struct Applied {
    uint64_t step;
    double norm;
    double scale;
    bool clipped;
  };

  bool Holds(const HealthConfig& config) const {
    size_t clipped = 0;
    std::vector<double> ratios;
    for (const Applied& a : recent_) {
      clipped += a.clipped ? 1 : 0;
      ratios.push_back(a.norm / a.scale);
    }
    const auto& cfg = config.clip_before_unscale;
    return static_cast<double>(clipped) / recent_.size() >= cfg.clip_fraction &&
           Median(ratios) >= cfg.min_norm_to_scale;
  }

  void Snapshot(uint64_t step) {
    fire_step_ = step;
    std::vector<double> norms, scales, ratios;
    for (const Applied& a : recent_) {
      norms.push_back(a.norm);
      scales.push_back(a.scale);
      ratios.push_back(a.norm / a.scale);
    }
    median_norm_ = Median(norms);
    median_scale_ = Median(scales);
    median_ratio_ = Median(ratios);
  }

  std::deque<Applied> recent_;
  uint64_t fire_step_ = 0;
  uint64_t last_hold_ = 0;
  double median_norm_ = 0.0;
  double median_scale_ = 0.0;
  double median_ratio_ = 0.0;
};

TEST_F(ClipBeforeUnscaleTest, FiresWhenNormsTrackTheLossScale) {
  Fp16Run run({.warmup_steps = 500});
  HealthHarness h(run.Info());
  Feed(h, run, /*fixed_at=*/800, /*end=*/1100);
  ASSERT_GT(fire_step_, 0u);
  ASSERT_GE(last_hold_, 800u);

  const auto fired = h.Fired(AlertKind::kClipBeforeUnscale);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].step, fire_step_);
  EXPECT_THAT(fired[0].description,
              HasSubstr(absl::StrFormat(
                  "clipped on 100%% of the last %d fp16 steps; median "
                  "grad_norm %.3g at a median loss scale %.3g: norm/scale %.3g",
                  h.config().clip_before_unscale.steps, median_norm_,
                  median_scale_, median_ratio_)));
  const auto resolved = h.Resolved(AlertKind::kClipBeforeUnscale);
  ASSERT_EQ(resolved.size(), 1u);
  EXPECT_EQ(resolved[0].step, last_hold_ + h.config().resolve_after_steps);
}

TEST_F(ClipBeforeUnscaleTest, SilentWhenUnscaledFirst) {
  Fp16Run run({.warmup_steps = 500});
  HealthHarness h(run.Info());
  Feed(h, run, /*fixed_at=*/0, /*end=*/1100);
  EXPECT_EQ(fire_step_, 0u);
  EXPECT_THAT(h.transitions, IsEmpty());
}

TEST(Fp16WithoutScaler, FiresWhenNoRecordCarriesALossScale) {
  Fp16Run run({.warmup_steps = 200});
  HealthHarness h(run.Info());
  const uint32_t steps = h.config().fp16_scaler.steps;
  const uint64_t scaler_from = 500;
  while (run.step() < 800) {
    v1::StepRecord r = run.Next();
    if (r.step() < scaler_from) r.clear_loss_scale();
    h.Lead(r);
  }
  const auto fired = h.Fired(AlertKind::kFp16WithoutScaler);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].step, steps - 1);
  EXPECT_THAT(fired[0].description,
              HasSubstr(absl::StrFormat(
                  "all of its first %d steps (steps 0..%d) carried no loss "
                  "scale",
                  steps, steps - 1)));
  const auto resolved = h.Resolved(AlertKind::kFp16WithoutScaler);
  ASSERT_EQ(resolved.size(), 1u);
  EXPECT_EQ(resolved[0].step, scaler_from - 1 + h.config().resolve_after_steps);
}

TEST(Fp16WithoutScaler, FiresOnAScaleFixedAtOne) {
  Fp16Run run({.warmup_steps = 200, .overflows_at = {}});
  HealthHarness h(run.Info());
  while (run.step() < 300) {
    v1::StepRecord r = run.Next();
    r.set_loss_scale(1.0);
    h.Lead(r);
  }
  const auto fired = h.Fired(AlertKind::kFp16WithoutScaler);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_THAT(fired[0].description,
              HasSubstr("kept the loss scale fixed at 1"));
}

TEST(Fp16WithoutScaler, SilentForBf16WithoutAScale) {
  Fp16Run run({.warmup_steps = 200, .overflows_at = {}});
  RunInfo info = run.Info();
  info.precision = v1::BF16;
  HealthHarness h(info);
  while (run.step() < 300) {
    v1::StepRecord r = run.Next();
    r.clear_loss_scale();
    h.Lead(r);
  }
  EXPECT_THAT(h.transitions, IsEmpty());
}

TEST(HealthyFp16Run, SixtyThousandStepsRaiseNoAlert) {
  Fp16Run run({.seed = 42, .random_overflow_p = 2e-4});
  HealthHarness h(run.Info());
  uint64_t skipped = 0;
  double highest_scale = 0;
  while (run.step() < 60000) {
    const v1::StepRecord r = run.Next();
    skipped += r.skipped() ? 1 : 0;
    highest_scale = std::max(highest_scale, r.loss_scale());
    h.Lead(r);
  }
  // The stream did what a real scaler does: early and post-growth overflows.
  EXPECT_GE(skipped, 20u);
  EXPECT_GE(highest_scale, 262144);
  EXPECT_THAT(h.FiredNames(), IsEmpty());
  EXPECT_THAT(h.transitions, IsEmpty());
}

}  // namespace
}  // namespace trainwatch
