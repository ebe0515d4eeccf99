// SpikeHazard (detectors_hazard.cc) on layer stats sent every step, through
// the real RunHealth and alert tracker.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

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

HealthConfig Enabled() {
  HealthConfig c;
  c.hazard.enabled = 1;
  return c;
}

// Layer stats every step with lognormal noise; at `jump_step` the layer
// `jumper` reports `factor` x its level.
void Feed(HealthHarness& h, uint64_t steps, uint64_t jump_step, const std::string& jumper,
          double factor) {
  std::mt19937_64 rng(4);
  std::lognormal_distribution<double> noise(0.0, 0.1);
  for (uint64_t step = 0; step < steps; ++step) {
    v1::StepRecord r = Rec(step, 0.5);
    for (const char* layer : {"tok", "blocks.0.attn", "blocks.0.mlp", "blocks.1.attn"}) {
      v1::LayerStats& s = (*r.mutable_layer_stats())[layer];
      s.set_grad_rms(1e-3);
      double x = noise(rng);
      if (step == jump_step && layer == jumper) x *= factor;
      s.set_g_over_sqrt_v_rms(x);
      s.set_update_rms_ratio(1e-3 * noise(rng));
    }
    h.Lead(r);
  }
}

TEST(SpikeHazard, OffByDefault) {
  HealthHarness h(HazardInfo());
  Feed(h, 600, 400, "blocks.0.mlp", 20.0);
  EXPECT_THAT(h.Fired(AlertKind::kSpikeHazard), IsEmpty());
}

TEST(SpikeHazard, NamesTheLayerWhoseStatisticJumped) {
  HealthHarness h(HazardInfo(), Enabled());
  Feed(h, 600, 400, "blocks.0.mlp", 20.0);
  const auto fired = h.Fired(AlertKind::kSpikeHazard);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].step, 400u);
  EXPECT_THAT(fired[0].description, HasSubstr("blocks.0.mlp"));
  EXPECT_THAT(fired[0].description, HasSubstr("g/sqrt(v) RMS"));
}

TEST(SpikeHazard, NoiseAndEmbeddingsStayQuiet) {
  HealthHarness h(HazardInfo(), Enabled());
  // A rare token's row: the embedding's statistic jumps 50x; not a hazard.
  Feed(h, 2000, 400, "tok", 50.0);
  EXPECT_THAT(h.Fired(AlertKind::kSpikeHazard), IsEmpty());
}

}  // namespace
}  // namespace trainwatch
