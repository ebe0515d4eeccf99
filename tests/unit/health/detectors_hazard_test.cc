// SpikeHazard (detectors/hazard.cc) on layer stats sent every step, through
// the real RunHealth and alert tracker.
#include <cmath>
#include <cstdint>
#include <random>
#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health_test_util.h"

namespace trainwatch {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::trainwatch::testing::HealthHarness;
using ::trainwatch::testing::Rec;

RunInfo HazardInfo() {
  RunInfo info;
  info.run_id = "hazard-run";
  info.precision = v1::BF16;
  info.max_norm = 1.0;
  info.warmup_steps = 100;
  info.adam_beta2 = 0.999;
  return info;
}

// Layer stats every `every` steps with lognormal noise; at `jump_step` the
// layers in `jumpers` report `factor` x their level of `stat`.
void Feed(HealthHarness& h, uint64_t steps, uint64_t jump_step,
          const std::vector<std::string>& jumpers, double factor, bool update_ratio,
          uint64_t every = 1) {
  std::mt19937_64 rng(4);
  std::lognormal_distribution<double> noise(0.0, 0.1);
  for (uint64_t step = 0; step < steps; ++step) {
    v1::StepRecord r = Rec(step, 0.5);
    if (step % every == 0) {
      for (const char* layer : {"tok", "blocks.0.attn", "blocks.0.mlp", "blocks.1.attn",
                                "blocks.1.mlp", "lm_head"}) {
        v1::LayerStats& s = (*r.mutable_layer_stats())[layer];
        s.set_grad_rms(1e-3);
        double g = noise(rng), u = 1e-3 * noise(rng);
        const bool jumps = step == jump_step &&
                           std::find(jumpers.begin(), jumpers.end(), layer) != jumpers.end();
        if (jumps) (update_ratio ? u : g) *= factor;
        s.set_g_over_sqrt_v_rms(g);
        s.set_update_rms_ratio(u);
      }
    }
    h.Lead(r);
  }
}

const std::vector<std::string> kFour = {"blocks.0.attn", "blocks.0.mlp", "blocks.1.attn",
                                        "blocks.1.mlp"};

// SpikeHazard is off by default (its held-out precision is under 0.5):
// these tests switch it on.
HealthConfig On() {
  HealthConfig c;
  c.hazard.enabled = 1;
  return c;
}

TEST(SpikeHazard, IsOffByDefault) {
  HealthHarness h(HazardInfo());
  Feed(h, 600, 400, kFour, 5.0, /*update_ratio=*/true);
  EXPECT_THAT(h.Fired(AlertKind::kSpikeHazard), IsEmpty());
}

TEST(SpikeHazard, TheDefaultRuleNamesUpdateJumpsInFourLayers) {
  HealthHarness h(HazardInfo(), On());
  Feed(h, 600, 400, kFour, 5.0, /*update_ratio=*/true);
  const auto fired = h.Fired(AlertKind::kSpikeHazard);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].step, 400u);
  EXPECT_THAT(fired[0].description, HasSubstr("update_rms_ratio of blocks."));
  EXPECT_THAT(fired[0].description, HasSubstr("4 layer(s) jumped"));
  EXPECT_THAT(fired[0].description, HasSubstr("on families it was not fitted on: precision"));
}

TEST(SpikeHazard, OneLayerNoiseEmbeddingsAndSparseReportsStayQuiet) {
  {
    HealthHarness h(HazardInfo(), On());
    Feed(h, 600, 400, {"blocks.0.mlp"}, 20.0, true);  // one layer
    EXPECT_THAT(h.Fired(AlertKind::kSpikeHazard), IsEmpty());
  }
  {
    // A rare token's row: the embedding's statistic jumps 50x; not counted.
    HealthHarness h(HazardInfo(), On());
    Feed(h, 2000, 400, {"tok", "blocks.0.attn", "blocks.0.mlp", "blocks.1.attn"}, 50.0, true);
    EXPECT_THAT(h.Fired(AlertKind::kSpikeHazard), IsEmpty());
  }
  {
    // layer_stats every 100 steps: no level of recent steps to jump from.
    HealthHarness h(HazardInfo(), On());
    Feed(h, 20000, 10000, kFour, 20.0, true, 100);
    EXPECT_THAT(h.Fired(AlertKind::kSpikeHazard), IsEmpty());
  }
}

TEST(SpikeHazard, TheConfigChoosesThePrecursorAndCanSwitchItOff) {
  HealthConfig g = On();
  g.hazard.use_update_ratio = 0;
  g.hazard.min_layers = 1;
  HealthHarness h(HazardInfo(), g);
  Feed(h, 600, 400, {"blocks.0.mlp"}, 20.0, /*update_ratio=*/false);
  const auto fired = h.Fired(AlertKind::kSpikeHazard);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_THAT(fired[0].description, HasSubstr("g/sqrt(v) RMS of blocks.0.mlp"));
  HealthConfig off = On();
  off.hazard.enabled = 0;
  HealthHarness quiet(HazardInfo(), off);
  Feed(quiet, 600, 400, kFour, 5.0, true);
  EXPECT_THAT(quiet.Fired(AlertKind::kSpikeHazard), IsEmpty());
}

}  // namespace
}  // namespace trainwatch
