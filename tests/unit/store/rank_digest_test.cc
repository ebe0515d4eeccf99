// Tests of what the store keeps of a non-lead rank's record.
#include "store/ranks/rank_digest.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace trainwatch {
namespace {

TEST(RoundToSignificantBits, RoundsToNearestWithTiesToEven) {
  // 1 + 2^-16 is halfway between 1 and 1 + 2^-15 (16 significant bits):
  // ties go to the even one, 1; a hair above goes up.
  EXPECT_EQ(RoundToSignificantBits(1 + std::ldexp(1.0, -16), 16), 1.0);
  EXPECT_EQ(RoundToSignificantBits(1 + 3 * std::ldexp(1.0, -16), 16),
            1 + 2 * std::ldexp(1.0, -15));
  EXPECT_EQ(RoundToSignificantBits(1 + std::ldexp(1.0, -16) + std::ldexp(1.0, -40), 16),
            1 + std::ldexp(1.0, -15));
  EXPECT_EQ(RoundToSignificantBits(-1.5, 2), -1.5);
  EXPECT_EQ(RoundToSignificantBits(1.75, 2), 2.0);  // the carry raises the exponent
  EXPECT_EQ(RoundToSignificantBits(0.1, 53), 0.1);
}

TEST(RoundToSignificantBits, KeepsZerosInfinitiesAndNaNPayloads) {
  EXPECT_EQ(std::bit_cast<uint64_t>(RoundToSignificantBits(-0.0, 16)),
            std::bit_cast<uint64_t>(-0.0));
  EXPECT_EQ(RoundToSignificantBits(std::numeric_limits<double>::infinity(), 16),
            std::numeric_limits<double>::infinity());
  const double nan = std::bit_cast<double>(uint64_t{0x7ff8000000000123});
  EXPECT_EQ(std::bit_cast<uint64_t>(RoundToSignificantBits(nan, 16)),
            uint64_t{0x7ff8000000000123});
  EXPECT_EQ(RoundToSignificantBits(std::numeric_limits<double>::max(), 16),
            std::numeric_limits<double>::infinity());
}

TEST(RoundToSignificantBits, RelativeErrorIsAtMostHalfAUnitInTheLastKeptBit) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> exponent(-300, 300);
  for (int i = 0; i < 100000; ++i) {
    const double v = std::pow(10.0, exponent(rng));
    const double r = RoundToSignificantBits(v, kRankDigestMantissaBits);
    ASSERT_LE(std::abs(r - v) / v, std::ldexp(1.0, -kRankDigestMantissaBits)) << v;
    // What is kept leaves the low bits zero, which the codec does not store.
    ASSERT_EQ(std::bit_cast<uint64_t>(r) & ((uint64_t{1} << (53 - kRankDigestMantissaBits)) - 1),
              0u) << v;
  }
}

TEST(DigestRecord, KeepsWhatTheCrossRankChecksUseAndDropsTheRest) {
  v1::StepRecord in;
  in.set_step(42);
  in.set_grad_norm(1.2345678901);
  in.set_shard_sq_sum(0.123456789);
  in.set_step_time_s(1.0001234);
  in.set_data_wait_s(0.25);
  in.set_skipped(true);
  in.set_clipped(false);
  in.set_time_unix_nanos(1'700'000'000'123'456'789);
  in.set_loss(2.5);
  in.set_lr(3e-4);
  in.set_clip_coef(0.5);
  in.set_loss_scale(65536);
  in.add_batch_ids(7);
  (*in.mutable_layer_stats())["blocks.0"].set_grad_rms(1);
  (*in.mutable_fp8())["l0:input"].set_amax(3);
  v1::StepRecord out;
  out.set_loss(9);  // written over
  DigestRecord(in, &out);
  EXPECT_EQ(out.step(), 42u);
  EXPECT_NEAR(out.grad_norm(), in.grad_norm(), 2e-5 * in.grad_norm());
  EXPECT_NE(out.grad_norm(), in.grad_norm());
  EXPECT_NEAR(out.shard_sq_sum(), in.shard_sq_sum(), 2e-5 * in.shard_sq_sum());
  EXPECT_NEAR(out.step_time_s(), in.step_time_s(), 2e-5);
  EXPECT_EQ(out.data_wait_s(), 0.25);
  EXPECT_TRUE(out.skipped());
  ASSERT_TRUE(out.has_clipped());
  EXPECT_FALSE(out.clipped());
  EXPECT_EQ(out.time_unix_nanos() % (int64_t{1} << kRankDigestTimeShift), 0);
  EXPECT_LE(std::abs(out.time_unix_nanos() - in.time_unix_nanos()),
            int64_t{1} << (kRankDigestTimeShift - 1));
  EXPECT_FALSE(out.has_loss());
  EXPECT_FALSE(out.has_lr());
  EXPECT_FALSE(out.has_clip_coef());
  EXPECT_FALSE(out.has_loss_scale());
  EXPECT_EQ(out.batch_ids_size(), 0);
  EXPECT_EQ(out.layer_stats_size(), 0);
  EXPECT_EQ(out.fp8_size(), 0);
}

TEST(DigestRecord, LeavesAbsentFieldsAbsentAndRoundsNegativeTimes) {
  v1::StepRecord in;
  in.set_step(1);
  in.set_time_unix_nanos(-(int64_t{3} << kRankDigestTimeShift) - 1);
  v1::StepRecord out;
  DigestRecord(in, &out);
  EXPECT_FALSE(out.has_shard_sq_sum());
  EXPECT_FALSE(out.has_step_time_s());
  EXPECT_FALSE(out.has_data_wait_s());
  EXPECT_FALSE(out.has_clipped());
  EXPECT_EQ(out.time_unix_nanos(), -(int64_t{3} << kRankDigestTimeShift));
}

TEST(RankTail, RoundTripsRanksAttemptsAndDigests) {
  google::protobuf::RepeatedPtrField<v1::StepRecord> records;
  std::vector<RankTailEntry> streams;
  for (uint32_t i = 0; i < 300; ++i) {
    v1::StepRecord in;
    in.set_step(1000 + i / 3);
    in.set_grad_norm(0.5 + 1e-3 * i);
    in.set_shard_sq_sum(1e-4 * i);
    if (i % 2 == 0) in.set_step_time_s(1.0 + 1e-4 * i);
    DigestRecord(in, records.Add());
    streams.push_back({.rank = 1 + i % 3 * 5000, .attempt = i % 7 == 0 ? 2u : 0u});
  }
  const std::string blob = EncodeRankTail(streams, records);
  std::vector<RankTailEntry> streams_back;
  google::protobuf::RepeatedPtrField<v1::StepRecord> back;
  ASSERT_TRUE(DecodeRankTail(blob, &streams_back, &back).ok());
  ASSERT_EQ(back.size(), records.size());
  ASSERT_EQ(streams_back.size(), streams.size());
  for (int i = 0; i < records.size(); ++i) {
    EXPECT_EQ(streams_back[i].rank, streams[i].rank);
    EXPECT_EQ(streams_back[i].attempt, streams[i].attempt);
    EXPECT_EQ(back[i].SerializeAsString(), records[i].SerializeAsString()) << i;
  }
}

TEST(RankTail, ACutOrCorruptRowIsDataLossNeverACrash) {
  google::protobuf::RepeatedPtrField<v1::StepRecord> records;
  v1::StepRecord in;
  in.set_step(5);
  in.set_grad_norm(1.5);
  DigestRecord(in, records.Add());
  DigestRecord(in, records.Add());
  const std::string blob = EncodeRankTail({{1, 0}, {2, 0}}, records);
  std::vector<RankTailEntry> streams;
  google::protobuf::RepeatedPtrField<v1::StepRecord> back;
  for (size_t cut = 0; cut < blob.size(); ++cut) {
    EXPECT_TRUE(absl::IsDataLoss(DecodeRankTail(blob.substr(0, cut), &streams, &back)))
        << cut;
  }
  // A count that disagrees with the records.
  std::string wrong = blob;
  wrong[0] = 1;
  EXPECT_TRUE(absl::IsDataLoss(DecodeRankTail(wrong, &streams, &back)));
  EXPECT_TRUE(absl::IsDataLoss(DecodeRankTail(std::string(8, '\xff'), &streams, &back)));
}

}  // namespace
}  // namespace trainwatch
