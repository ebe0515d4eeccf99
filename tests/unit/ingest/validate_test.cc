#include "ingest/validate.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainwatch {
namespace {

using ::testing::HasSubstr;

v1::RunStart GoodStart() {
  v1::RunStart s;
  s.set_run_id("llama-7b/run.42:a_b-c");
  s.set_world_size(8);
  s.set_rank(7);
  s.set_max_norm(1.0);
  return s;
}

TEST(ValidateRunId, AcceptsTheDocumentedAlphabet) {
  EXPECT_TRUE(ValidateRunId("Az09._:/-").ok());
  EXPECT_TRUE(ValidateRunId(std::string(128, 'x')).ok());
}

TEST(ValidateRunId, RefusesEmptyLongAndForeignCharacters) {
  EXPECT_THAT(ValidateRunId("").message(), HasSubstr("empty"));
  EXPECT_THAT(ValidateRunId(std::string(129, 'x')).message(), HasSubstr("129"));
  absl::Status s = ValidateRunId("run'; DROP TABLE runs;--");
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("position 3"));
  EXPECT_FALSE(ValidateRunId("a b").ok());
  EXPECT_FALSE(ValidateRunId("run\n").ok());
}

TEST(ValidateRunStart, AcceptsAGoodStart) {
  EXPECT_TRUE(ValidateRunStart(GoodStart(), {}).ok());
}

TEST(ValidateRunStart, RefusesAnUnknownPrecisionAndExplainsWorldSizeZero) {
  v1::RunStart s = GoodStart();
  s.set_precision(static_cast<v1::Precision>(9));
  EXPECT_THAT(ValidateRunStart(s, {}).message(),
              HasSubstr("precision 9 is not a known value"));
  s = GoodStart();
  s.set_world_size(0);
  EXPECT_THAT(ValidateRunStart(s, {}).message(),
              HasSubstr("rank 7 is not below world_size 1 (world_size 0 is "
                        "read as 1)"));
}

TEST(ValidateRunStart, RankMustBeBelowWorldSize) {
  v1::RunStart s = GoodStart();
  s.set_rank(8);
  absl::Status st = ValidateRunStart(s, {});
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_THAT(st.message(), HasSubstr("rank 8 is not below world_size 8"));
  s.set_world_size(0);  // read as 1
  s.set_rank(0);
  EXPECT_TRUE(ValidateRunStart(s, {}).ok());
}

TEST(ValidateRunStart, MaxNormMustBeFiniteAndNotNegative) {
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    v1::RunStart s = GoodStart();
    s.set_max_norm(bad);
    EXPECT_THAT(ValidateRunStart(s, {}).message(), HasSubstr("max_norm")) << bad;
  }
}

TEST(ValidateRunStart, BoundsLabels) {
  v1::RunStart s = GoodStart();
  ValidationLimits limits;
  limits.max_labels = 2;
  for (int i = 0; i < 3; ++i) (*s.mutable_labels())["k" + std::to_string(i)] = "v";
  EXPECT_THAT(ValidateRunStart(s, limits).message(), HasSubstr("3 labels"));
  s.mutable_labels()->clear();
  (*s.mutable_labels())["bad-name"] = "v";
  EXPECT_THAT(ValidateRunStart(s, limits).message(), HasSubstr("bad-name"));
  s.mutable_labels()->clear();
  (*s.mutable_labels())["owner"] = std::string(300, 'v');
  EXPECT_THAT(ValidateRunStart(s, limits).message(), HasSubstr("300 characters"));
  s.mutable_labels()->clear();
  (*s.mutable_labels())["owner"] = "quotes \" back\\slash \n newline";
  EXPECT_TRUE(ValidateRunStart(s, limits).ok());
}

// Limits named in characters count characters: 200 "é" (400 bytes) is a
// value of 200 characters, within 256; 257 of them are not.
TEST(ValidateRunStart, CountsCharactersNotBytes) {
  v1::RunStart s = GoodStart();
  ValidationLimits limits;
  std::string e200;
  for (int i = 0; i < 200; ++i) e200 += "\xc3\xa9";  // é
  (*s.mutable_labels())["owner"] = e200;
  EXPECT_TRUE(ValidateRunStart(s, limits).ok()) << ValidateRunStart(s, limits);
  (*s.mutable_labels())["owner"] = e200 + std::string(57, 'x');
  EXPECT_THAT(ValidateRunStart(s, limits).message(),
              HasSubstr("has a value of 257 characters; at most 256"));
  EXPECT_EQ(Utf8Chars("\xe6\x97\xa5\xe6\x9c\xac"), 2u);  // 日本
  EXPECT_EQ(Utf8Chars("\xf0\x9f\x94\xa5"), 1u);           // an emoji
}

// RunStart.host becomes a label of alerts and of a series: bounded.
TEST(ValidateRunStart, BoundsTheHost) {
  v1::RunStart s = GoodStart();
  ValidationLimits limits;
  s.set_host(std::string(253, 'h'));
  EXPECT_TRUE(ValidateRunStart(s, limits).ok());
  s.set_host(std::string(15 << 20, 'h'));
  EXPECT_THAT(ValidateRunStart(s, limits).message(),
              HasSubstr("RunStart.host has 15728640 characters; at most 253"));
}

// With num_experts unknown (0), top_k and ep_size are still bounded.
TEST(ValidateRunStart, BoundsMoeCountsWithoutNumExperts) {
  v1::RunStart s = GoodStart();
  ValidationLimits limits;
  s.mutable_moe()->set_top_k(2);
  s.mutable_moe()->set_ep_size(8);
  EXPECT_TRUE(ValidateRunStart(s, limits).ok());
  s.mutable_moe()->set_top_k(1'000'000'000);
  EXPECT_THAT(ValidateRunStart(s, limits).message(),
              HasSubstr("top_k is 1000000000; at most 4096"));
  s.mutable_moe()->set_top_k(2);
  s.mutable_moe()->set_ep_size(1'000'000'000);
  EXPECT_THAT(ValidateRunStart(s, limits).message(),
              HasSubstr("ep_size is 1000000000; at most 4096"));
}

TEST(ValidateStepBatch, NonFiniteValuesAreData) {
  v1::StepBatch b;
  for (double v : {std::nan(""), std::numeric_limits<double>::infinity(),
                   -std::numeric_limits<double>::infinity()}) {
    v1::StepRecord* r = b.add_records();
    r->set_grad_norm(v);
    r->set_loss(v);
    r->set_loss_scale(v);
    r->set_clip_coef(std::nan(""));
  }
  EXPECT_TRUE(ValidateStepBatch(b, {}).ok());
}

TEST(ValidateStepBatch, NonFiniteClipCoefIsDataAndALongLayerNameIsNot) {
  v1::StepBatch b;
  for (double v : {std::numeric_limits<double>::infinity(),
                   -std::numeric_limits<double>::infinity()}) {
    b.add_records()->set_clip_coef(v);
  }
  EXPECT_TRUE(ValidateStepBatch(b, {}).ok());
  v1::StepRecord* r = b.add_records();
  r->set_step(3);
  (*r->mutable_layer_stats())[std::string(257, 'L')];
  EXPECT_THAT(ValidateStepBatch(b, {}).message(),
              HasSubstr("step 3: layer name"));
}

// A client's -1 read as unsigned: acknowledged and stored clamped to 2^63 - 1,
// it made every later step of its stream a duplicate.
TEST(ValidateStepBatch, RefusesAStepAtOrAbove2To63NamingIt) {
  v1::StepBatch b;
  b.add_records()->set_step(5);
  b.add_records()->set_step(std::numeric_limits<uint64_t>::max());
  const absl::Status s = ValidateStepBatch(b, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("step 18446744073709551615 is not below 2^63 (-1 "));
  b.mutable_records(1)->set_step(uint64_t{1} << 63);
  EXPECT_THAT(ValidateStepBatch(b, {}).message(),
              HasSubstr("step 9223372036854775808 is not below 2^63"));
  b.mutable_records(1)->set_step((uint64_t{1} << 63) - 1);  // the largest stored
  EXPECT_TRUE(ValidateStepBatch(b, {}).ok());
  v1::RunEvent e;
  e.set_kind(v1::CHECKPOINT_SAVED);
  e.set_step(std::numeric_limits<uint64_t>::max());
  EXPECT_THAT(ValidateRunEvent(e, {}).message(),
              HasSubstr("event at step 18446744073709551615 is not below 2^63"));
}

// The same -1 in an expert's count: the first offender of its layer named.
TEST(ValidateStepBatch, RefusesAnExpertCountAtOrAbove2To63NamingIt) {
  v1::StepBatch b;
  v1::StepRecord& r = *b.add_records();
  r.set_step(3);
  v1::MoeLayerStats& ok = *r.mutable_moe()->add_layers();
  for (uint64_t c : {uint64_t{0}, (uint64_t{1} << 63) - 1, uint64_t{7}}) ok.add_tokens_per_expert(c);
  EXPECT_TRUE(ValidateStepBatch(b, {}).ok());
  v1::MoeLayerStats& bad = *r.mutable_moe()->add_layers();
  for (uint64_t c : {uint64_t{5}, std::numeric_limits<uint64_t>::max(), uint64_t{1} << 63}) {
    bad.add_tokens_per_expert(c);
  }
  const absl::Status s = ValidateStepBatch(b, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("step 3: moe.layers[1].tokens_per_expert has "
                                     "18446744073709551615, not below 2^63"));
}

// Wherever the offender sits in a layer of any length (the counts are
// tested four at a time, then the rest), and only an offender.
TEST(ValidateStepBatch, FindsAnExpertCountAtOrAbove2To63AnywhereInTheLayer) {
  for (int experts = 1; experts <= 13; ++experts) {
    for (int at = -1; at < experts; ++at) {
      v1::StepBatch b;
      v1::StepRecord& r = *b.add_records();
      r.set_step(3);
      v1::MoeLayerStats& layer = *r.mutable_moe()->add_layers();
      for (int e = 0; e < experts; ++e) {
        layer.add_tokens_per_expert(e == at ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1 - e);
      }
      EXPECT_EQ(ValidateStepBatch(b, {}).ok(), at < 0) << experts << " experts, at " << at;
    }
  }
}

TEST(ValidateStepBatch, RefusesOversizedBatchNamingTheLimit) {
  v1::StepBatch b;
  b.set_seq(7);
  for (int i = 0; i < 11; ++i) b.add_records()->set_step(i);
  ValidationLimits limits;
  limits.max_batch_records = 10;
  absl::Status s = ValidateStepBatch(b, limits);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("batch seq 7 has 11 records; at most 10"));
}

TEST(ValidateStepBatch, NamesTheStepOfABadField) {
  v1::StepBatch b;
  b.add_records()->set_step(1);
  v1::StepRecord* r = b.add_records();
  r->set_step(2);
  r->set_clip_coef(1.5);
  EXPECT_THAT(ValidateStepBatch(b, {}).message(),
              HasSubstr("step 2: clip_coef must be in [0, 1]"));
}

TEST(ValidateStepBatch, Fp8StatsNeedAKnownFormatAndSharesInRange) {
  const auto batch = [](const std::function<void(v1::Fp8TensorStats&)>& edit,
                        const std::string& name = "l0.fc1:input") {
    v1::StepBatch b;
    v1::StepRecord* r = b.add_records();
    r->set_step(40);
    v1::Fp8TensorStats& f = (*r->mutable_fp8())[name];
    f.set_format(v1::E4M3);
    f.set_amax(3.0);
    f.set_scale(140.0);
    f.set_overflow_fraction(0.0);
    edit(f);
    return b;
  };
  EXPECT_TRUE(ValidateStepBatch(batch([](auto&) {}), {}).ok());
  // NaN and Inf are data, here too.
  EXPECT_TRUE(ValidateStepBatch(batch([](auto& f) {
                                  f.set_amax(std::nan(""));
                                  f.set_underflow_fraction(INFINITY);
                                }),
                                {})
                  .ok());
  absl::Status s = ValidateStepBatch(batch([](auto& f) { f.clear_format(); }), {});
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("step 40: fp8[\"l0.fc1:input\"].format is missing"));
  s = ValidateStepBatch(batch([](auto& f) { f.set_format(static_cast<v1::Fp8Format>(9)); }), {});
  EXPECT_THAT(s.message(), HasSubstr("format is unknown (9)"));
  s = ValidateStepBatch(batch([](auto& f) { f.set_underflow_fraction(1.5); }), {});
  EXPECT_THAT(s.message(), HasSubstr("must be in [0, 1]"));
  s = ValidateStepBatch(batch([](auto&) {}, ""), {});
  EXPECT_THAT(s.message(), HasSubstr("fp8 tensor name"));
  ValidationLimits limits;
  limits.max_fp8_tensors = 1;
  v1::StepBatch two = batch([](auto&) {});
  (*two.mutable_records(0)->mutable_fp8())["second"].set_format(v1::E5M2);
  EXPECT_THAT(ValidateStepBatch(two, limits).message(),
              HasSubstr("step 40: fp8 has 2 tensors; at most 1"));
}

TEST(ValidateRunEvent, NeedsAKind) {
  v1::RunEvent e;
  e.set_step(5);
  EXPECT_THAT(ValidateRunEvent(e, {}).message(), HasSubstr("step 5"));
  e.set_kind(v1::CHECKPOINT_SAVED);
  EXPECT_TRUE(ValidateRunEvent(e, {}).ok());
}

}  // namespace
}  // namespace trainwatch
