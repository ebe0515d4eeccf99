// The per-layer Adam detectors (detectors_layers.cc) on a simulated run that
// sends layer_stats every 100 steps, through the real RunHealth and tracker.
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>

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

}  // namespace
}  // namespace trainwatch
