#include <cmath>
#include <limits>
#include <memory>
#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto_convert.h"
#include "trainwatch/run_start.h"

namespace trainwatch::internal {
namespace {

v1::StepRecord Convert(const Step& step, double max_norm) {
  v1::StepRecord record;
  FillStepRecord(step, max_norm, &record);
  return record;
}

TEST(FillStepRecord, DerivesClippingFromMaxNorm) {
  const v1::StepRecord below = Convert({.step = 1, .grad_norm = 0.5}, 1.0);
  EXPECT_FALSE(below.clipped());
  EXPECT_EQ(below.clip_coef(), 1.0);

  const v1::StepRecord above = Convert({.step = 2, .grad_norm = 4.0}, 1.0);
  EXPECT_TRUE(above.has_clipped());
  EXPECT_TRUE(above.clipped());
  EXPECT_DOUBLE_EQ(above.clip_coef(), 1.0 / (4.0 + 1e-6));
}

TEST(FillStepRecord, NonFiniteNorms) {
  const double inf = std::numeric_limits<double>::infinity();
  const v1::StepRecord infinite = Convert({.grad_norm = inf}, 1.0);
  EXPECT_TRUE(infinite.clipped());
  ASSERT_TRUE(infinite.has_clip_coef());
  EXPECT_EQ(infinite.clip_coef(), 0.0);

  const v1::StepRecord nan =
      Convert({.grad_norm = std::numeric_limits<double>::quiet_NaN()}, 1.0);
  ASSERT_TRUE(nan.has_clipped());
  EXPECT_FALSE(nan.clipped());
  EXPECT_FALSE(nan.has_clip_coef());
  EXPECT_TRUE(std::isnan(nan.grad_norm()));  // data, passed through
}

TEST(FillStepRecord, NoDerivationWithoutMaxNorm) {
  const v1::StepRecord record = Convert({.grad_norm = 4.0}, 0.0);
  EXPECT_FALSE(record.has_clipped());
  EXPECT_FALSE(record.has_clip_coef());
}

TEST(FillStepRecord, ReportedClippingWins) {
  const v1::StepRecord record =
      Convert({.grad_norm = 4.0, .clipped = false, .clip_coef = 0.75}, 1.0);
  EXPECT_FALSE(record.clipped());
  EXPECT_EQ(record.clip_coef(), 0.75);
}

TEST(FillStepRecord, SetsOnlyPresentOptionalFields) {
  const v1::StepRecord bare = Convert({.step = 7, .grad_norm = 1.0}, 0.0);
  EXPECT_FALSE(bare.has_loss_scale());
  EXPECT_FALSE(bare.has_max_attn_logit());
  EXPECT_FALSE(bare.has_log_z());
  EXPECT_FALSE(bare.has_loss());
  EXPECT_FALSE(bare.has_lr());
  EXPECT_FALSE(bare.has_shard_sq_sum());

  Step full{.step = 8,
            .grad_norm = 2.0,
            .loss_scale = 65536.0,
            .skipped = true,
            .max_attn_logit = 30.0,
            .log_z = 10.5,
            .loss = 2.25,
            .lr = 3e-4,
            .time_unix_nanos = 123,
            .batch_ids = {4, 5},
            .shard_sq_sum = 1.5,
            .layer_stats = {{"attn.0", {0.1, 0.01, 1.2}},
                            {"mlp.0", {0.2, 0.02, 0.9, 1e-3}}},
            .fp8 = {{"attn.0.qkv:input",
                     {.format = Fp8Format::kE4M3Fnuz, .amax = 3.5, .scale = 64.0,
                      .amax_history_len = 1024, .margin = 1.0,
                      .underflow_fraction = 0.01, .amax_group = "tp3"}}}};
  const v1::StepRecord record = Convert(full, 0.0);
  EXPECT_EQ(record.step(), 8u);
  EXPECT_EQ(record.loss_scale(), 65536.0);
  EXPECT_TRUE(record.skipped());
  EXPECT_EQ(record.max_attn_logit(), 30.0);
  EXPECT_EQ(record.log_z(), 10.5);
  EXPECT_EQ(record.loss(), 2.25);
  EXPECT_EQ(record.lr(), 3e-4);
  EXPECT_EQ(record.time_unix_nanos(), 123);
  ASSERT_EQ(record.batch_ids_size(), 2);
  EXPECT_EQ(record.batch_ids(1), 5);
  EXPECT_EQ(record.shard_sq_sum(), 1.5);
  ASSERT_EQ(record.layer_stats().count("attn.0"), 1u);
  EXPECT_EQ(record.layer_stats().at("attn.0").g_over_sqrt_v_rms(), 1.2);
  EXPECT_FALSE(record.layer_stats().at("attn.0").has_update_rms_ratio());
  EXPECT_EQ(record.layer_stats().at("mlp.0").update_rms_ratio(), 1e-3);
  ASSERT_EQ(record.fp8().count("attn.0.qkv:input"), 1u);
  const v1::Fp8TensorStats& f = record.fp8().at("attn.0.qkv:input");
  EXPECT_EQ(f.format(), v1::E4M3_FNUZ);
  EXPECT_EQ(f.amax(), 3.5);
  EXPECT_EQ(f.scale(), 64.0);
  EXPECT_EQ(f.amax_history_len(), 1024u);
  EXPECT_EQ(f.margin(), 1.0);
  EXPECT_FALSE(f.has_overflow_fraction());
  EXPECT_EQ(f.underflow_fraction(), 0.01);
  EXPECT_EQ(f.amax_group(), "tp3");
}

// A wire record with what `step` holds of the fields clipping depends on.
v1::StepRecord WireRecord(const Step& step) {
  v1::StepRecord record;
  record.set_step(step.step);
  record.set_grad_norm(step.grad_norm);
  if (step.clipped) record.set_clipped(*step.clipped);
  if (step.clip_coef) record.set_clip_coef(*step.clip_coef);
  return record;
}

TEST(DeriveClipping, GivesWhatFillStepRecordGivesTheSameStep) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double max_norm : {0.0, 1.0}) {
    for (double norm : {0.0, 0.5, 1.0, 4.0, inf, -inf, nan}) {
      for (std::optional<bool> clipped : {std::optional<bool>(), {false}, {true}}) {
        for (std::optional<double> coef : {std::optional<double>(), {0.25}}) {
          const Step step{.step = 3, .grad_norm = norm, .clipped = clipped,
                          .clip_coef = coef};
          v1::StepRecord derived = WireRecord(step);
          DeriveClipping(max_norm, &derived);
          const v1::StepRecord filled = Convert(step, max_norm);
          // The same bytes (a NaN norm included, which == would not match).
          EXPECT_EQ(derived.SerializeAsString(), filled.SerializeAsString())
              << derived.ShortDebugString() << " vs "
              << filled.ShortDebugString();
        }
      }
    }
  }
}

TEST(AddStepRecord, AWireRecordIsAppendedAsGivenWithClippingDerived) {
  v1::StepRecord given;
  given.set_step(9);
  given.set_grad_norm(4.0);
  given.set_loss(2.5);
  (*given.mutable_fp8())["l0:input"].set_amax(3.0);
  v1::StepBatch batch;
  AddStepRecord(std::make_unique<v1::StepRecord>(given), 1.0, &batch);
  AddStepRecord(Step{.step = 10, .grad_norm = 0.5}, 1.0, &batch);
  ASSERT_EQ(batch.records_size(), 2);

  v1::StepRecord expected = given;
  expected.set_clipped(true);
  expected.set_clip_coef(1.0 / (4.0 + 1e-6));
  EXPECT_EQ(batch.records(0).SerializeAsString(), expected.SerializeAsString())
      << batch.records(0).ShortDebugString();
  EXPECT_EQ(batch.records(1).SerializeAsString(),
            Convert({.step = 10, .grad_norm = 0.5}, 1.0).SerializeAsString());
}

TEST(MakeRunStart, CopiesOptions) {
  ClientOptions options;
  options.run_id = "run-1";
  options.rank = 1;
  options.world_size = 2;
  options.precision = Precision::kBf16;
  options.max_norm = 1.0;
  options.adam_beta2 = 0.95;
  options.labels = {{"model", "llama"}};
  const v1::RunStart start = MakeRunStart(options);
  EXPECT_EQ(start.run_id(), "run-1");
  EXPECT_EQ(start.rank(), 1u);
  EXPECT_EQ(start.world_size(), 2u);
  EXPECT_EQ(start.precision(), v1::BF16);
  EXPECT_EQ(start.max_norm(), 1.0);
  EXPECT_FALSE(start.has_adam_eps());
  EXPECT_EQ(start.adam_beta2(), 0.95);
  EXPECT_EQ(start.labels().at("model"), "llama");
  EXPECT_FALSE(start.has_moe());

  options.moe = MoeConfig{.num_experts = 64, .top_k = 8, .ep_size = 4,
                          .balancing = MoeBalancing::kAuxFreeBias,
                          .bias_update_rate = 1e-3, .capacity_factor = 1.25};
  const v1::MoeConfig moe = MakeRunStart(options).moe();
  EXPECT_EQ(moe.num_experts(), 64u);
  EXPECT_EQ(moe.top_k(), 8u);
  EXPECT_EQ(moe.ep_size(), 4u);
  EXPECT_EQ(moe.balancing(), v1::AUX_FREE_BIAS);
  EXPECT_EQ(moe.bias_update_rate(), 1e-3);
  EXPECT_EQ(moe.capacity_factor(), 1.25);
}

TEST(Convert, CarriesEachMoeLayerAsGiven) {
  const Step step{.step = 3, .grad_norm = 0.5,
                  .moe = {{.layer = "blocks.3.moe", .tokens_per_expert = {812, 790, 0, 901},
                           .dropped = 4, .aux_loss = 1.01, .expert_bias = {0.5f, -0.5f, 0, 0}},
                          {.layer = "blocks.4.moe", .z_loss = 2.4, .router_logit_max = 7.5}}};
  const v1::StepRecord record = Convert(step, 0.0);
  ASSERT_EQ(record.moe().layers_size(), 2);
  const v1::MoeLayerStats& a = record.moe().layers(0);
  EXPECT_EQ(a.layer(), "blocks.3.moe");
  EXPECT_THAT(a.tokens_per_expert(), ::testing::ElementsAre(812, 790, 0, 901));
  EXPECT_EQ(a.dropped(), 4u);
  EXPECT_EQ(a.aux_loss(), 1.01);
  EXPECT_FALSE(a.has_z_loss());
  EXPECT_THAT(a.expert_bias(), ::testing::ElementsAre(0.5f, -0.5f, 0.0f, 0.0f));
  const v1::MoeLayerStats& b = record.moe().layers(1);
  EXPECT_TRUE(b.tokens_per_expert().empty());
  EXPECT_FALSE(b.has_dropped());
  EXPECT_EQ(b.z_loss(), 2.4);
  EXPECT_EQ(b.router_logit_max(), 7.5);
}

}  // namespace
}  // namespace trainwatch::internal
