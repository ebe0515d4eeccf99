// The per-layer Adam detectors (detectors/layers.cc) on a simulated run that
// sends layer_stats every 100 steps, through the real RunHealth and tracker.
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <numbers>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health_test_util.h"

namespace trainwatch {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::trainwatch::testing::HealthHarness;
using ::trainwatch::testing::Rec;

constexpr uint64_t kReportEvery = 100;

RunInfo AdamInfo(std::optional<double> adam_eps = 1e-8) {
  RunInfo info;
  info.run_id = "adam-run";
  info.precision = v1::BF16;
  info.max_norm = 1.0;
  info.warmup_steps = 500;
  info.adam_eps = adam_eps;
  info.adam_beta2 = 0.95;
  return info;
}

// A healthy run: lognormal norms; every kReportEvery steps, per-layer stats
// with g/sqrt(v) RMS about 1 and gradient RMS about 1e-4, far above eps.
// `corrupt` may change a report's stats before it is sent.
class LayerRun {
 public:
  using Corrupt = std::function<void(v1::StepRecord&)>;

  explicit LayerRun(HealthHarness& h, uint64_t seed = 5,
                    uint64_t first_step = 0)
      : h_(h), rng_(seed), step_(first_step) {}

  void Feed(uint64_t end, const Corrupt& corrupt = nullptr) {
    std::lognormal_distribution<double> norm(std::log(0.4), 0.25);
    std::lognormal_distribution<double> ratio(0.0, 0.15);
    std::lognormal_distribution<double> rms(std::log(1e-4), 0.2);
    for (; step_ < end; ++step_) {
      v1::StepRecord r = Rec(step_, norm(rng_));
      if (step_ % kReportEvery == 0) {
        for (const char* layer :
             {"blocks.0.attn", "blocks.0.mlp", "blocks.1.attn", "lm_head"}) {
          v1::LayerStats& stats = (*r.mutable_layer_stats())[layer];
          stats.set_grad_rms(rms(rng_));
          stats.set_grad_norm(stats.grad_rms() * 2000);
          stats.set_g_over_sqrt_v_rms(ratio(rng_));
        }
        if (corrupt) corrupt(r);
      }
      h_.Lead(r);
    }
  }

 private:
  HealthHarness& h_;
  std::mt19937_64 rng_;
  uint64_t step_;
};

TEST(AdamStaleSecondMoment, FiresOnALayerFarAboveItsSecondMoment) {
  HealthHarness h(AdamInfo());
  LayerRun run(h);
  const uint64_t stale_step = 2000;
  run.Feed(3000, [&](v1::StepRecord& r) {
    if (r.step() == stale_step) {
      (*r.mutable_layer_stats())["blocks.1.attn"].set_g_over_sqrt_v_rms(7.5);
    }
  });

  const auto fired = h.Fired(AlertKind::kAdamStaleSecondMoment);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].step, stale_step);
  EXPECT_DOUBLE_EQ(fired[0].peak, 7.5);
  EXPECT_THAT(
      fired[0].description,
      HasSubstr(absl::StrFormat(
          "step %d: g/sqrt(v) RMS >= %g and >= %gx the layer's recent "
          "median in 1 layer(s): blocks.1.attn 7.5",
          stale_step, h.config().adam.g_over_sqrt_v, h.config().adam.jump_ratio)));
  const auto resolved = h.Resolved(AlertKind::kAdamStaleSecondMoment);
  ASSERT_EQ(resolved.size(), 1u);
  EXPECT_EQ(resolved[0].step, stale_step + h.config().resolve_after_steps);
}

TEST(AdamStaleSecondMoment, SilentOnTheSameNoise) {
  HealthHarness h(AdamInfo());
  LayerRun run(h);
  run.Feed(3000);
  EXPECT_THAT(h.transitions, IsEmpty());
}

TEST(AdamStaleSecondMoment, SilentInWarmupWhileTheSecondMomentFillsUp) {
  HealthHarness h(AdamInfo());
  LayerRun run(h);
  // On the first step v_{t-1} is 0: g/sqrt(v) is huge by construction.
  run.Feed(1000, [&](v1::StepRecord& r) {
    if (r.step() == 0) {
      (*r.mutable_layer_stats())["lm_head"].set_g_over_sqrt_v_rms(1e6);
    }
  });
  EXPECT_THAT(h.transitions, IsEmpty());
}

// From stall_from on, blocks.0.mlp reports a gradient RMS of 5e-8, under
// 10 x eps (1e-7), until recovered_at.
class LayerUpdateStallTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kStallFrom = 3000;
  static constexpr uint64_t kRecoveredAt = 3500;

  static void Stall(v1::StepRecord& r) {
    if (r.step() >= kStallFrom && r.step() < kRecoveredAt) {
      (*r.mutable_layer_stats())["blocks.0.mlp"].set_grad_rms(5e-8);
    }
  }
};

TEST_F(LayerUpdateStallTest, FiresAfterReportsInARowNearEps) {
  HealthHarness h(AdamInfo(1e-8));
  LayerRun run(h);
  run.Feed(4000, Stall);
  const auto& cfg = h.config().adam;
  const uint64_t fire_step =
      kStallFrom + (cfg.stall_reports - 1) * kReportEvery;
  const uint64_t last_hold = kRecoveredAt - kReportEvery;

  const auto fired = h.Fired(AlertKind::kLayerUpdateStall);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].step, fire_step);
  EXPECT_THAT(fired[0].description,
              HasSubstr(absl::StrFormat(
                  "step %d: 1 layer(s) with grad RMS <= %g x adam_eps (1e-08) "
                  "on %d reports in a row: blocks.0.mlp 5e-08",
                  fire_step, cfg.eps_multiple, cfg.stall_reports)));
  const auto resolved = h.Resolved(AlertKind::kLayerUpdateStall);
  ASSERT_EQ(resolved.size(), 1u);
  EXPECT_EQ(resolved[0].step, last_hold + h.config().resolve_after_steps);
}

TEST_F(LayerUpdateStallTest, SilentWithoutAdamEps) {
  HealthHarness h(AdamInfo(std::nullopt));
  LayerRun run(h);
  run.Feed(4000, Stall);
  EXPECT_THAT(h.transitions, IsEmpty());
}

TEST_F(LayerUpdateStallTest, SilentOnFewerReportsInARow) {
  HealthHarness h(AdamInfo(1e-8));
  LayerRun run(h);
  const uint32_t reports = h.config().adam.stall_reports;
  run.Feed(4000, [&](v1::StepRecord& r) {
    // Stalls on reports-1 reports, recovers on one, stalls again.
    const uint64_t report = r.step() / kReportEvery;
    if (r.step() >= kStallFrom && report % reports != 0) {
      (*r.mutable_layer_stats())["blocks.0.mlp"].set_grad_rms(5e-8);
    }
  });
  EXPECT_THAT(h.transitions, IsEmpty());
}

TEST_F(LayerUpdateStallTest, ForgetsTheReportsOfRewoundSteps) {
  HealthHarness h(AdamInfo(1e-8));
  const uint32_t reports = h.config().adam.stall_reports;
  const uint64_t short_of_firing = kStallFrom + (reports - 1) * kReportEvery;
  LayerRun(h).Feed(short_of_firing, Stall);
  // The job restarts from the checkpoint of kStallFrom; the replay stalls on
  // the same reports, then recovers. The reports before the rewind must not
  // add to the replay's.
  h.health().Rewind(kStallFrom);
  LayerRun(h, /*seed=*/6, /*first_step=*/kStallFrom)
      .Feed(kRecoveredAt, [&](v1::StepRecord& r) {
        if (r.step() < short_of_firing) Stall(r);
      });
  EXPECT_THAT(h.transitions, IsEmpty());
}

// The collapse rule: a run whose layers report every step, their update/
// weight RMS `update(step)` (with 10% noise) and the LR `lr(step)` (none
// when it returns NaN), warmup 100.
std::vector<::trainwatch::testing::Transition> FeedUpdates(
    HealthHarness& h, uint64_t steps, const std::function<double(uint64_t)>& lr,
    const std::function<double(uint64_t)>& update) {
  std::mt19937_64 rng(11);
  std::lognormal_distribution<double> norm(std::log(0.4), 0.25);
  std::lognormal_distribution<double> noise(0.0, 0.1);
  for (uint64_t step = 0; step < steps; ++step) {
    v1::StepRecord r = Rec(step, norm(rng));
    if (std::isfinite(lr(step))) r.set_lr(lr(step));
    for (const char* layer : {"model.layers.0.self_attn.q_proj.weight",
                              "model.layers.0.mlp.up_proj.weight",
                              "model.layers.1.mlp.down_proj.weight",
                              "model.embed_tokens.weight", "model.norm.weight"}) {
      v1::LayerStats& stats = (*r.mutable_layer_stats())[layer];
      stats.set_grad_rms(1e-3 * noise(rng));
      stats.set_g_over_sqrt_v_rms(noise(rng));
      stats.set_update_rms_ratio(update(step) * noise(rng));
    }
    h.Lead(r);
  }
  return h.Fired(AlertKind::kLayerUpdateStall);
}

RunInfo CollapseInfo(std::optional<double> adam_eps) {
  RunInfo info = AdamInfo(adam_eps);
  info.warmup_steps = 100;
  return info;
}

// The lab's held-out LR-decay stall: the LR 10x lower every 50 steps from
// step 200 (1e-8 of its peak by step 600), the updates with it.
TEST(LayerUpdateCollapse, FiresWhenTheScheduleTakesTheLrToZeroMidRun) {
  HealthHarness h(CollapseInfo(1e-8));
  const auto lr = [](uint64_t step) {
    return step < 200 ? 1e-3 : 1e-3 * std::pow(0.1, (step - 200) / 50 + 1);
  };
  const auto fired = FeedUpdates(h, 700, lr, [&](uint64_t step) { return 10 * lr(step); });
  ASSERT_EQ(fired.size(), 1u);
  // 100x below the start from step 250 (at the line: its last 10 reports'
  // median under it by ~300), held for 20% of the post-warmup steps and 20
  // steps.
  EXPECT_GE(fired[0].step, 270u);
  EXPECT_LE(fired[0].step, 380u);
  EXPECT_THAT(fired[0].description, HasSubstr("the schedule took it to ~0"));
}

// Without an LR or Adam (SGD): the updates collapse 1000x at step 400 while
// nothing else changes.
TEST(LayerUpdateCollapse, FiresOnUpdatesThatCollapseWithoutTheLr) {
  HealthHarness h(CollapseInfo(std::nullopt));
  const auto fired = FeedUpdates(
      h, 900, [](uint64_t) { return std::nan(""); },
      [](uint64_t step) { return step < 400 ? 1e-2 : 1e-5; });
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_GE(fired[0].step, 470u);
  EXPECT_LE(fired[0].step, 500u);
  EXPECT_THAT(fired[0].description, HasSubstr("the LR has not fallen as far"));
}

// A healthy run: cosine from the peak to exactly 0 at its last step, and a
// linear decay to 0, the updates with the LR and falling 3x more as the
// weights grow. The end of a schedule is not a collapse.
TEST(LayerUpdateCollapse, SilentThroughSchedulesThatEndAtZero) {
  constexpr uint64_t kSteps = 5000;
  const auto cosine = [](uint64_t step) {
    if (step < 100) return 1e-3 * (step + 1) / 100.0;
    const double t = (step - 100) / double(kSteps - 1 - 100);
    return 1e-3 * 0.5 * (1 + std::cos(std::numbers::pi * t));
  };
  const auto linear = [](uint64_t step) {
    if (step < 100) return 1e-3 * (step + 1) / 100.0;
    return 1e-3 * (1 - (step - 100) / double(kSteps - 1 - 100));
  };
  for (const auto& lr : {std::function<double(uint64_t)>(cosine),
                         std::function<double(uint64_t)>(linear)}) {
    HealthHarness h(CollapseInfo(1e-8));
    const auto fired = FeedUpdates(h, kSteps, lr, [&](uint64_t step) {
      return 10 * lr(step) / (1 + 2.0 * step / kSteps);
    });
    EXPECT_THAT(fired, IsEmpty());
    for (const auto& f : fired) ADD_FAILURE() << f.step << ": " << f.description;
  }
}

}  // namespace
}  // namespace trainwatch
