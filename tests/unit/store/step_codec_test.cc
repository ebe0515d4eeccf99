// The step chunk codec: every value back bit for bit, fields the columns do
// not know kept, chunks of the format before it read, and a bad blob an
// error, never a crash.
#include "store/codec/step_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"
#include "proto_bytes.h"
#include "test_records.h"
#include "trainwatch/v1/clipping.h"

namespace trainwatch {
namespace {

using Records = google::protobuf::RepeatedPtrField<v1::StepRecord>;

// Bit patterns the random records draw from besides plain values.
const uint64_t kSpecialBits[] = {
    0x7ff8000000000000,  // the quiet NaN
    0x7ff8000000000001,  // NaNs with payloads
    0xfff4000000000abc,  // signalling, negative
    0x7ff0000000000001,
    0x8000000000000000,  // -0.0
    0x0000000000000000,  // +0.0
    0x7ff0000000000000,  // +Inf
    0xfff0000000000000,  // -Inf
    0x0000000000000001,  // the smallest subnormal
    0x7fefffffffffffff,  // the largest double
};

double Special(std::mt19937_64& rng) {
  return std::bit_cast<double>(kSpecialBits[rng() % std::size(kSpecialBits)]);
}

// A double from one of a few shapes real fields have: noisy, float32 values
// widened, constant, a power of two, or a special pattern.
double Value(std::mt19937_64& rng, int field, uint64_t i) {
  switch (rng() % 6) {
    case 0:
      return Special(rng);
    case 1:
      return static_cast<float>(std::exp(std::normal_distribution<>(0, 1)(rng)));
    case 2:
      return 1.0;
    case 3:
      return std::ldexp(1.0, static_cast<int>(rng() % 40) - 8);
    case 4:
      return std::bit_cast<double>(rng());  // any bits at all
    default:
      return field * 1e-3 * static_cast<double>(i) + std::normal_distribution<>(0, 0.01)(rng);
  }
}

Records RandomRecords(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  Records out;
  uint64_t step = rng() % 2 ? 0 : std::numeric_limits<uint64_t>::max() - 3 * n;
  int64_t time = static_cast<int64_t>(rng());
  for (int i = 0; i < n; ++i) {
    v1::StepRecord& r = *out.Add();
    // Steps: mostly +1, sometimes huge gaps, near 2^63-1 and past it.
    switch (rng() % 8) {
      case 0:
        step += rng() % (uint64_t{1} << 40);
        break;
      case 1:
        step = std::numeric_limits<int64_t>::max() - rng() % 4;
        break;
      default:
        step += 1;
    }
    r.set_step(step);
    time += rng() % 3 == 0 ? static_cast<int64_t>(rng()) : 1'000'000'000 + rng() % 1000;
    r.set_time_unix_nanos(time);
    r.set_grad_norm(Value(rng, 1, i));
    if (rng() % 2) r.set_clip_coef(Value(rng, 2, i));
    if (rng() % 2) r.set_loss_scale(Value(rng, 3, i));
    if (rng() % 3) r.set_max_attn_logit(Value(rng, 4, i));
    if (rng() % 3) r.set_log_z(Value(rng, 5, i));
    if (rng() % 4) r.set_loss(Value(rng, 6, i));
    if (rng() % 4) r.set_lr(Value(rng, 7, i));
    if (rng() % 2) r.set_shard_sq_sum(Value(rng, 8, i));
    if (rng() % 2) r.set_step_time_s(Value(rng, 9, i));
    if (rng() % 2) r.set_data_wait_s(Value(rng, 10, i));
    if (rng() % 3) r.set_clipped(rng() % 2);
    r.set_skipped(rng() % 5 == 0);
    const int ids = static_cast<int>(rng() % 4);
    for (int j = 0; j < ids; ++j) {
      switch (rng() % 4) {
        case 0:
          r.add_batch_ids(static_cast<int64_t>(rng()));  // negative, huge
          break;
        case 1:
          r.add_batch_ids(0);
          break;
        default:
          r.add_batch_ids(static_cast<int64_t>(2 * i + j));
      }
    }
    if (rng() % 10 == 0) {
      v1::LayerStats& l = (*r.mutable_layer_stats())["layers.3.attn"];
      l.set_grad_norm(Value(rng, 11, i));
    }
  }
  return out;
}

uint64_t Bits(double d) { return std::bit_cast<uint64_t>(d); }

// A run's records as an fp16/AMP trainer's tensors give them: grad_norm,
// max_attn_logit, log_z, loss and shard_sq_sum float32 values widened,
// clip_coef by the double formula (the C++ client's), lr and loss_scale as
// an optimizer has them; every 16th record's norm a special float32 (a quiet
// NaN with a payload float32 keeps, -0.0, +Inf, a subnormal float32).
Records Float32Records(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> norm(std::log(0.6), 0.35);
  std::normal_distribution<double> noise(0, 1);
  const float kSpecials[] = {std::bit_cast<float>(uint32_t{0x7fc00123}), -0.0f,
                             std::numeric_limits<float>::infinity(), 1e-40f};
  Records out;
  for (int i = 0; i < n; ++i) {
    v1::StepRecord& r = *out.Add();
    r.set_step(static_cast<uint64_t>(1000 + i));
    r.set_time_unix_nanos(1'764'000'000'000'000'000 + int64_t{420'000'000} * i);
    const float g = i % 16 == 5 ? kSpecials[(i / 16) % 4] : static_cast<float>(norm(rng));
    r.set_grad_norm(g);
    r.set_clip_coef(std::min(1.0, 1.0 / (static_cast<double>(g) + 1e-6)));
    r.set_clipped(g > 1.0f);
    r.set_loss_scale(65536.0);
    r.set_max_attn_logit(static_cast<float>(24 + 0.4 * noise(rng)));
    r.set_log_z(static_cast<float>(3.1 + 0.05 * noise(rng)));
    r.set_loss(static_cast<float>(2.1 + 0.04 * noise(rng)));
    r.set_lr(3e-4 * (i + 1) / 2000);
    r.set_shard_sq_sum(static_cast<float>(static_cast<double>(g) * g));
    r.add_batch_ids(2 * i + 17);
  }
  return out;
}

// Equal field by field, doubles by bit pattern, presence included; the rest
// (layer_stats, unknown fields) by its deterministic serialization.
void ExpectSame(const v1::StepRecord& a, const v1::StepRecord& b, int i) {
  SCOPED_TRACE(::testing::Message() << "record " << i);
  EXPECT_EQ(a.step(), b.step());
  EXPECT_EQ(a.time_unix_nanos(), b.time_unix_nanos());
  EXPECT_EQ(Bits(a.grad_norm()), Bits(b.grad_norm()));
#define TW_EXPECT_OPTIONAL(f)                                   \
  EXPECT_EQ(a.has_##f(), b.has_##f()) << #f;                    \
  if (a.has_##f() && b.has_##f()) {                             \
    EXPECT_EQ(Bits(a.f()), Bits(b.f())) << #f;                  \
  }
  TW_EXPECT_OPTIONAL(clip_coef);
  TW_EXPECT_OPTIONAL(loss_scale);
  TW_EXPECT_OPTIONAL(max_attn_logit);
  TW_EXPECT_OPTIONAL(log_z);
  TW_EXPECT_OPTIONAL(loss);
  TW_EXPECT_OPTIONAL(lr);
  TW_EXPECT_OPTIONAL(shard_sq_sum);
  TW_EXPECT_OPTIONAL(step_time_s);
  TW_EXPECT_OPTIONAL(data_wait_s);
#undef TW_EXPECT_OPTIONAL
  EXPECT_EQ(a.has_clipped(), b.has_clipped());
  EXPECT_EQ(a.clipped(), b.clipped());
  EXPECT_EQ(a.skipped(), b.skipped());
  ASSERT_EQ(a.batch_ids_size(), b.batch_ids_size());
  for (int j = 0; j < a.batch_ids_size(); ++j) EXPECT_EQ(a.batch_ids(j), b.batch_ids(j));
  EXPECT_EQ(::trainwatch::testing::DeterministicBytes(a),
            ::trainwatch::testing::DeterministicBytes(b));
}

Records RoundTrip(const Records& in) {
  std::string blob = EncodeStepChunk(in);
  Records out;
  absl::Status s = DecodeStepChunk(blob, &out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

void ExpectRoundTrip(const Records& in) {
  Records out = RoundTrip(in);
  ASSERT_EQ(out.size(), in.size());
  for (int i = 0; i < in.size(); ++i) ExpectSame(in[i], out[i], i);
}

TEST(StepCodec, RandomRecordsRoundTripBitForBit) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    ExpectRoundTrip(RandomRecords(seed, static_cast<int>(seed % 7 == 0 ? 1 : seed * 7 % 1500)));
  }
}

TEST(StepCodec, EmptyChunkAndOneRecord) {
  ExpectRoundTrip(Records());
  Records one;
  one.Add();  // every field at its default
  ExpectRoundTrip(one);
  one[0].set_step(std::numeric_limits<uint64_t>::max());
  one[0].set_grad_norm(-0.0);
  one[0].set_loss(std::bit_cast<double>(uint64_t{0x7ff00000000f00ba}));
  one[0].add_batch_ids(std::numeric_limits<int64_t>::min());
  ExpectRoundTrip(one);
}

TEST(StepCodec, DistinctNanPayloadsAndSignedZerosSurvive) {
  Records in;
  for (uint64_t bits : kSpecialBits) {
    v1::StepRecord& r = *in.Add();
    r.set_step(static_cast<uint64_t>(in.size()));
    r.set_grad_norm(std::bit_cast<double>(bits));
    r.set_loss(std::bit_cast<double>(bits ^ 1));
    r.set_lr(std::bit_cast<double>(bits));
  }
  ExpectRoundTrip(in);
}

TEST(StepCodec, BatchIdsOfAnyKindRoundTrip) {
  Records in;
  const int64_t kMin = std::numeric_limits<int64_t>::min();
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const std::vector<std::vector<int64_t>> ids = {
      {}, {0}, {-1, 1}, {kMax, kMin, 0}, {5, 5, 5, 5}, {}, {kMin}, {-7}, {}};
  for (size_t i = 0; i < ids.size(); ++i) {
    v1::StepRecord& r = *in.Add();
    r.set_step(i);
    for (int64_t id : ids[i]) r.add_batch_ids(id);
  }
  ExpectRoundTrip(in);
}

// Fields the columns do not know (added to the proto after the codec, as
// the fp8 map (17) and update_rms_ratio were, or unknown to this build) are
// kept in the record's residue.
TEST(StepCodec, FieldsTheColumnsDoNotKnowAreKept) {
  Records in = RandomRecords(7, 40);
  (*in[3].mutable_layer_stats())["layers.0.mlp"].set_grad_norm(3.5);
  (*in[3].mutable_layer_stats())["layers.0.mlp"].set_update_rms_ratio(2e-3);
  v1::Fp8TensorStats& f = (*in[5].mutable_fp8())["layers.0.fc1:input"];
  f.set_format(v1::E4M3);
  f.set_amax(3.25);
  f.set_scale(137.0);
  f.set_underflow_fraction(0.004);
  f.set_amax_group("tp0");
  auto unknown = [](v1::StepRecord& r) { return r.GetReflection()->MutableUnknownFields(&r); };
  unknown(in[3])->AddLengthDelimited(40, "a field of a later proto");
  unknown(in[9])->AddVarint(99, 12345);
  unknown(in[39])->AddFixed64(41, 0xdeadbeef);
  Records out = RoundTrip(in);
  ASSERT_EQ(out.size(), in.size());
  for (int i = 0; i < in.size(); ++i) ExpectSame(in[i], out[i], i);
  EXPECT_EQ(out[3].layer_stats().at("layers.0.mlp").grad_norm(), 3.5);
  EXPECT_EQ(out[3].layer_stats().at("layers.0.mlp").update_rms_ratio(), 2e-3);
  EXPECT_EQ(out[5].fp8().at("layers.0.fc1:input").scale(), 137.0);
  EXPECT_EQ(out[5].fp8().at("layers.0.fc1:input").amax_group(), "tp0");
  const google::protobuf::UnknownFieldSet& kept = *unknown(out[3]);
  ASSERT_EQ(kept.field_count(), 1);
  EXPECT_EQ(kept.field(0).number(), 40);
  EXPECT_EQ(kept.field(0).length_delimited(), "a field of a later proto");
  EXPECT_EQ(unknown(out[9])->field(0).varint(), 12345u);
}

TEST(StepCodec, EncodesTheIndicesGivenInTheirOrder) {
  Records in = RandomRecords(3, 20);
  const std::vector<size_t> picked = {2, 5, 6, 19};
  Records out;
  ASSERT_TRUE(DecodeStepChunk(EncodeStepChunk(in, picked), &out).ok());
  ASSERT_EQ(out.size(), 4);
  for (int i = 0; i < 4; ++i) ExpectSame(in[static_cast<int>(picked[i])], out[i], i);
}

// A chunk written before the columnar format, a serialized StepBatch, reads
// back; the format byte can never start one.
TEST(StepCodec, ChunksOfTheFormatBeforeReadBack) {
  v1::StepBatch old;
  *old.mutable_records() = RandomRecords(11, 300);
  const std::string blob = old.SerializeAsString();
  ASSERT_NE(static_cast<unsigned char>(blob[0]), kStepChunkColumnarV1);
  Records out;
  ASSERT_TRUE(DecodeStepChunk(blob, &out).ok());
  ASSERT_EQ(out.size(), old.records_size());
  for (int i = 0; i < out.size(); ++i) ExpectSame(old.records(i), out[i], i);
  EXPECT_EQ(EncodeStepChunk(old.records())[0],
            static_cast<char>(kStepChunkColumnarV1 | kStepChunkFloat32));
}

// The records of kOldMoeChunk: MoE reports of a few shapes (a count of
// 2^64-1, a layer with no counts, a layer whose experts change), a record
// without one and one with layer_stats.
Records OldMoeRecords() {
  Records in;
  for (int i = 0; i < 4; ++i) {
    v1::StepRecord& r = *in.Add();
    r.set_step(100 + i);
    r.set_time_unix_nanos(1'700'000'000'000'000'000 + i * 1'000'000'000LL);
    r.set_grad_norm(0.5 + 0.125 * i);
    r.set_loss(2.5);
    if (i == 2) {
      (*r.mutable_layer_stats())["layers.0.mlp"].set_grad_norm(0.25);
      continue;
    }
    for (int l = 0; l < 2; ++l) {
      v1::MoeLayerStats& layer = *r.mutable_moe()->add_layers();
      layer.set_layer(std::to_string(l));
      const int experts = l == 1 && i == 3 ? 3 : 4;
      for (int e = 0; e < experts; ++e) {
        layer.add_tokens_per_expert(65536 + 1000 * e - 300 * i + l);
      }
      layer.set_aux_loss(1.0 + 0.01 * i);
      if (l == 0) layer.set_dropped(7);
      if (l == 1) layer.add_expert_bias(-0.5f);
    }
    if (i == 1) r.mutable_moe()->mutable_layers(0)->set_tokens_per_expert(2, ~uint64_t{0});
    if (i == 3) r.mutable_moe()->add_layers()->set_layer("empty");
  }
  return in;
}

TEST(StepCodec, SmallerThanProtobufOnATypicalRun) {
  Records in;
  for (int i = 0; i < 1024; ++i) {
    v1::StepRecord& r = *in.Add();
    r.set_step(1000 + i);
    r.set_time_unix_nanos(1'700'000'000'000'000'000 + i * 1'000'000'000LL + (i * 7919) % 1'000'000);
    r.set_grad_norm(static_cast<float>(0.5 + 0.001 * (i % 13)));
    r.set_loss_scale(65536.0);
    r.set_clip_coef(1.0);
    r.set_lr(3e-4);
    r.set_clipped(false);
    r.add_batch_ids(2 * i);
    r.add_batch_ids(2 * i + 1);
  }
  v1::StepBatch old;
  *old.mutable_records() = in;
  const size_t columnar = EncodeStepChunk(in).size();
  EXPECT_LT(columnar * 8, old.ByteSizeLong()) << columnar << " vs " << old.ByteSizeLong();
  ExpectRoundTrip(in);
}

// Values of few decimal digits (read from a text log) are stored as the
// integers they are; one that is not (here -0.0) keeps its column as doubles.
TEST(StepCodec, DecimalValuesRoundTripAsIntegers) {
  std::mt19937_64 rng(9);
  Records in;
  for (int i = 0; i < 1000; ++i) {
    v1::StepRecord& r = *in.Add();
    r.set_step(i);
    r.set_loss(std::round((2.5 + std::normal_distribution<>(0, 0.05)(rng)) * 1e4) / 1e4);
    r.set_lr(-std::round(std::normal_distribution<>(0, 1)(rng) * 1e6) / 1e6);
    r.set_grad_norm(std::round(std::exp(std::normal_distribution<>(0, 1)(rng)) * 1e3) / 1e3);
    r.set_loss_scale(65536.0);
  }
  const size_t decimal = EncodeStepChunk(in).size();
  ExpectRoundTrip(in);
  // float32 values widened are decimals of 16 or 17 digits, of which a few
  // are not at the exponent another value needs.
  Records floats = RandomRecords(21, 0);
  for (int i = 0; i < 2000; ++i) {
    v1::StepRecord& r = *floats.Add();
    r.set_step(i);
    r.set_shard_sq_sum(static_cast<float>(std::exp(std::normal_distribution<>(-1, 1)(rng))));
    r.set_grad_norm(std::ldexp(1.0, i % 7 - 10) * (i % 3 + 1));
  }
  ExpectRoundTrip(floats);
  in[500].set_lr(-0.0);
  ExpectRoundTrip(in);
  for (v1::StepRecord& r : in) r.set_loss(r.loss() + 1e-12);  // no longer few digits
  EXPECT_LT(decimal + 1000 * 3, EncodeStepChunk(in).size());
  ExpectRoundTrip(in);
}


// Every cut of a chunk is an error (its trailing bytes and bits are all
// accounted for; an empty blob is an empty chunk of the old format), and
// flipped bits give an error or other records, never a crash or a hang.
void ExpectCutsAndFlipsAreErrors(const std::string& blob, uint64_t seed,
                                 bool says_step_chunk) {
  Records out;
  for (size_t len = 1; len < blob.size(); ++len) {
    absl::Status s = DecodeStepChunk(std::string_view(blob.data(), len), &out);
    EXPECT_FALSE(s.ok()) << "cut at " << len;
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  }
  std::mt19937_64 rng(seed);
  int errors = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bad = blob;
    for (int flips = 1 + static_cast<int>(rng() % 3); flips > 0; --flips) {
      bad[1 + rng() % (bad.size() - 1)] ^= static_cast<char>(1 << (rng() % 8));
    }
    absl::Status s = DecodeStepChunk(bad, &out);
    if (!s.ok()) {
      ++errors;
      EXPECT_TRUE(absl::IsDataLoss(s)) << s;
      if (says_step_chunk) {
        EXPECT_NE(s.message().find("step chunk"), std::string::npos) << s;
      }
    }
  }
  EXPECT_GT(errors, 0);
}

TEST(StepCodec, CorruptOrCutShortBlobsAreErrorsNotCrashes) {
  const std::string blob = EncodeStepChunk(RandomRecords(5, 200));
  Records out;
  ExpectCutsAndFlipsAreErrors(blob, /*seed=*/42, /*says_step_chunk=*/true);
  // A count far beyond what the bytes can hold is refused before any work.
  std::string huge = {static_cast<char>(kStepChunkColumnarV1), '\xff', '\xff', '\xff',
                      '\xff', '\x0f', '\0'};
  absl::Status s = DecodeStepChunk(huge, &out);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("cannot fit"), std::string::npos) << s;
  // A format byte of a later version is named.
  s = DecodeStepChunk(std::string("\x27\x01", 2), &out);
  EXPECT_TRUE(absl::IsDataLoss(s));
  EXPECT_NE(s.message().find("0x27"), std::string::npos) << s;
}

// OldMoeRecords() as the encoder wrote them before MoE counts had a section
// of their own (format byte 0x07, the counts inside each record's residue):
// chunks of that format in existing databases read back as they were.
const char kOldMoeChunk[] =
    "\x07\x04\x0f\x91\x00\x80\xef\x6f\x2f\x39\xfc\x6c\x54\x00\x00\x92"
    "\x94\xbb\x9a\xca\x1f\x7f\xc0\x00\x00\x00\x00\x00\x00\x8c\xc0\x70"
    "\x02\x7f\x00\x10\x00\x00\x00\x00\x00\x01\xc0\x00\x00\xa1\xe1\x80"
    "\x11\x92\xad\xa4\x80\x92\x01\x40\x0a\x1c\x0a\x01\x30\x12\x0c\x80"
    "\x80\x04\xe8\x87\x04\xd0\x8f\x04\xb8\x97\x04\x18\x07\x21\x00\x00"
    "\x00\x00\x00\x00\xf0\x3f\x0a\x20\x0a\x01\x31\x12\x0c\x81\x80\x04"
    "\xe9\x87\x04\xd1\x8f\x04\xb9\x97\x04\x21\x00\x00\x00\x00\x00\x00"
    "\xf0\x3f\x32\x04\x00\x00\x00\xbf\x92\x01\x47\x0a\x23\x0a\x01\x30"
    "\x12\x13\xd4\xfd\x03\xbc\x85\x04\xff\xff\xff\xff\xff\xff\xff\xff"
    "\xff\x01\x8c\x95\x04\x18\x07\x21\x29\x5c\x8f\xc2\xf5\x28\xf0\x3f"
    "\x0a\x20\x0a\x01\x31\x12\x0c\xd5\xfd\x03\xbd\x85\x04\xa5\x8d\x04"
    "\x8d\x95\x04\x21\x29\x5c\x8f\xc2\xf5\x28\xf0\x3f\x32\x04\x00\x00"
    "\x00\xbf\x72\x19\x0a\x0c\x6c\x61\x79\x65\x72\x73\x2e\x30\x2e\x6d"
    "\x6c\x70\x12\x09\x09\x00\x00\x00\x00\x00\x00\xd0\x3f\x92\x01\x46"
    "\x0a\x1c\x0a\x01\x30\x12\x0c\xfc\xf8\x03\xe4\x80\x04\xcc\x88\x04"
    "\xb4\x90\x04\x18\x07\x21\x7b\x14\xae\x47\xe1\x7a\xf0\x3f\x0a\x1d"
    "\x0a\x01\x31\x12\x09\xfd\xf8\x03\xe5\x80\x04\xcd\x88\x04\x21\x7b"
    "\x14\xae\x47\xe1\x7a\xf0\x3f\x32\x04\x00\x00\x00\xbf\x0a\x07\x0a"
    "\x05\x65\x6d\x70\x74\x79";

TEST(StepCodec, MoeChunksOfTheFormatBeforeReadBack) {
  const std::string blob(kOldMoeChunk, sizeof(kOldMoeChunk) - 1);
  ASSERT_EQ(static_cast<unsigned char>(blob[0]), kStepChunkColumnarV1);
  Records out;
  absl::Status s = DecodeStepChunk(blob, &out);
  ASSERT_TRUE(s.ok()) << s;
  const Records in = OldMoeRecords();
  ASSERT_EQ(out.size(), in.size());
  for (int i = 0; i < in.size(); ++i) ExpectSame(in[i], out[i], i);
  EXPECT_EQ(out[1].moe().layers(0).tokens_per_expert(2), ~uint64_t{0});
}

// A count drawn from shapes that stress the coder: near a typical count,
// zero, the extremes of 64 bits, any bits at all.
uint64_t Count(std::mt19937_64& rng, uint64_t typical) {
  switch (rng() % 8) {
    case 0:
      return 0;
    case 1:
      return ~uint64_t{0} - rng() % 3;
    case 2:
      return rng();
    case 3:
      return rng() % 16;
    default:
      return typical + rng() % 2000 - 1000;
  }
}

// Records with MoE reports of every shape: none, present but empty, layers
// without counts, layers whose number of experts changes, repeated names,
// other layer fields and unknown fields beside the counts.
Records RandomMoeRecords(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  Records out = RandomRecords(seed, n);
  const char* names[] = {"0", "1", "layers.2.mlp.router", ""};
  const int experts[] = {0, 1, 3, 8, 128};
  for (v1::StepRecord& r : out) {
    if (rng() % 5 == 0) continue;
    v1::MoeStats& moe = *r.mutable_moe();
    const int layers = static_cast<int>(rng() % 6);
    for (int l = 0; l < layers; ++l) {
      v1::MoeLayerStats& layer = *moe.add_layers();
      layer.set_layer(names[rng() % 4 == 0 ? rng() % 4 : l % 4]);
      const int e = rng() % 4 == 0 ? experts[rng() % 5] : 8;
      const uint64_t typical = rng() % 3 == 0 ? rng() : 65536;
      for (int j = 0; j < e; ++j) layer.add_tokens_per_expert(Count(rng, typical));
      if (rng() % 2) layer.set_dropped(rng() % 100);
      if (rng() % 2) layer.set_aux_loss(1.0 + 0.01 * static_cast<double>(rng() % 10));
      if (rng() % 2) layer.set_z_loss(0.5 + 0.01 * static_cast<double>(rng() % 10));
      if (rng() % 3 == 0) layer.set_router_logit_max(static_cast<double>(rng() % 50));
      if (rng() % 3 == 0) {
        for (int j = 0; j < e; ++j) layer.add_expert_bias(0.01f * static_cast<float>(j));
      }
      if (rng() % 10 == 0) {
        layer.GetReflection()->MutableUnknownFields(&layer)->AddVarint(50, rng() % 1000);
      }
    }
  }
  return out;
}

// Every field of an MoE layer set (by reflection: a field added to the
// proto is set too), and of its report: the chunk keeps them beside the
// counts it codes apart.
TEST(StepCodec, EveryMoeLayerFieldRoundTrips) {
  Records records;
  for (int i = 0; i < 3; ++i) {
    v1::StepRecord& r = *records.Add();
    r.set_step(static_cast<uint64_t>(i + 1));
    v1::MoeLayerStats& layer = *r.mutable_moe()->add_layers();
    const google::protobuf::Descriptor* d = layer.GetDescriptor();
    const google::protobuf::Reflection* refl = layer.GetReflection();
    for (int f = 0; f < d->field_count(); ++f) {
      const google::protobuf::FieldDescriptor* field = d->field(f);
      using FD = google::protobuf::FieldDescriptor;
      switch (field->cpp_type()) {
        case FD::CPPTYPE_STRING:
          field->is_repeated() ? refl->AddString(&layer, field, "x") : refl->SetString(&layer, field, "x");
          break;
        case FD::CPPTYPE_UINT64:
          for (int e = 0; e < (field->is_repeated() ? 8 : 1); ++e) {
            field->is_repeated() ? refl->AddUInt64(&layer, field, 1000 + e + i)
                                 : refl->SetUInt64(&layer, field, 7 + i);
          }
          break;
        case FD::CPPTYPE_DOUBLE:
          field->is_repeated() ? refl->AddDouble(&layer, field, 0.25 + i)
                               : refl->SetDouble(&layer, field, 0.25 + i);
          break;
        case FD::CPPTYPE_FLOAT:
          for (int e = 0; e < (field->is_repeated() ? 8 : 1); ++e) {
            field->is_repeated() ? refl->AddFloat(&layer, field, 0.5f * e)
                                 : refl->SetFloat(&layer, field, 0.5f);
          }
          break;
        default:
          ADD_FAILURE() << "MoeLayerStats." << field->name()
                        << ": a field of a type this test does not set yet";
      }
    }
  }
  ExpectRoundTrip(records);
}

TEST(StepCodec, MoeCountsRoundTripBitForBit) {
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    ExpectRoundTrip(RandomMoeRecords(seed, static_cast<int>(seed % 5 == 0 ? 1 : seed * 7 % 300)));
  }
}

TEST(StepCodec, AdversarialMoeCountsRoundTrip) {
  const uint64_t kMax = ~uint64_t{0};
  const std::vector<std::vector<std::vector<uint64_t>>> chunks = {
      // Records of one layer each: the counts as they change.
      {{kMax, 0, kMax, 0}, {0, kMax, 0, kMax}, {kMax, kMax, kMax, kMax},
       {0, 0, 0, 0}, {kMax, 0, kMax, 0}, {1, 2, 3, 4}, {kMax - 1, 1, kMax, 0}},
      {{kMax}},
      {{5, 5, 5}, {5, 5, 5}, {5, 5, 5}, {5, 5, 5}, {5, 5, 5}},
      {{}, {7}, {}, {7, 8}, {7}, {7, 8, 9}, {}, {7, 8}, {7}},
      {{uint64_t{1} << 63, (uint64_t{1} << 63) - 1}, {0, kMax}, {kMax, 0}},
  };
  for (size_t c = 0; c < chunks.size(); ++c) {
    SCOPED_TRACE(::testing::Message() << "chunk " << c);
    Records in;
    for (const std::vector<uint64_t>& counts : chunks[c]) {
      v1::MoeLayerStats& layer = *in.Add()->mutable_moe()->add_layers();
      layer.set_layer("3");
      for (uint64_t v : counts) layer.add_tokens_per_expert(v);
    }
    ExpectRoundTrip(in);
    // One record a chunk, and each record a chunk of its own.
    for (int i = 0; i < in.size(); ++i) {
      Records one;
      *one.Add() = in[i];
      ExpectRoundTrip(one);
    }
  }
}

// The writer's codes of every length, with and without zero flags: most
// counts unchanged from the record before (zero residuals, so zero flags
// pay) or none, the rest moved by a random amount of a random width (0..64
// bits), over enough records that the layer is predicted from its history
// (one pass, every kReprice-th record priced both ways).
TEST(StepCodec, MoeCountsOfEveryCodeLengthRoundTrip) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    const int experts = 1 + static_cast<int>(rng() % 64);
    const uint64_t unchanged_per_16 = rng() % 17;  // 0: every count moves
    std::vector<uint64_t> counts(experts);
    for (uint64_t& c : counts) c = rng() >> (rng() % 64);
    Records in;
    for (int i = 0; i < 40; ++i) {
      v1::MoeLayerStats& layer = *in.Add()->mutable_moe()->add_layers();
      layer.set_layer("router");
      for (uint64_t& c : counts) {
        if (rng() % 16 >= unchanged_per_16) {
          const int width = static_cast<int>(rng() % 65);
          c += width == 0 ? 0 : rng() >> (64 - width);
        }
        layer.add_tokens_per_expert(c);
      }
    }
    ExpectRoundTrip(in);
  }
}

// Ingest codes a batch's MoE counts ahead (EncodeMoeCounts): the chunk the
// writer makes with them is the one it makes without, byte for byte, and a
// chunk of only some of the records ignores them.
TEST(StepCodec, MoeCountsCodedAheadMakeTheSameChunk) {
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const Records records = RandomMoeRecords(seed, static_cast<int>(1 + seed % 40));
    const std::string ahead = EncodeMoeCounts(records);
    std::vector<size_t> all(static_cast<size_t>(records.size()));
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    ASSERT_EQ(EncodeStepChunk(records, all, ahead), EncodeStepChunk(records));
    bool counts = false;
    for (const v1::StepRecord& r : records) {
      for (const v1::MoeLayerStats& l : r.moe().layers()) counts = counts || l.tokens_per_expert_size() > 0;
    }
    EXPECT_EQ(ahead.empty(), !counts);
    if (all.size() < 2) continue;
    std::vector<size_t> some(all.begin() + 1, all.end());
    ASSERT_EQ(EncodeStepChunk(records, some, ahead), EncodeStepChunk(records, some));
  }
}

TEST(StepCodec, OnlyChunksWithMoeCountsTakeTheNewFormat) {
  Records plain = RandomRecords(4, 50);
  EXPECT_EQ(static_cast<unsigned char>(EncodeStepChunk(plain)[0]),
            kStepChunkColumnarV1 | kStepChunkFloat32);
  // MoE reports without counts (an imported log's balancing loss alone).
  plain[3].mutable_moe()->add_layers()->set_aux_loss(1.2);
  plain[4].mutable_moe();
  EXPECT_EQ(static_cast<unsigned char>(EncodeStepChunk(plain)[0]),
            kStepChunkColumnarV1 | kStepChunkFloat32);
  ExpectRoundTrip(plain);
  plain[9].mutable_moe()->add_layers()->add_tokens_per_expert(12);
  EXPECT_EQ(static_cast<unsigned char>(EncodeStepChunk(plain)[0]),
            kStepChunkColumnarV2 | kStepChunkFloat32);
  ExpectRoundTrip(plain);
  // The encoder of the chunk before writes what it wrote then.
  EXPECT_EQ(static_cast<unsigned char>(EncodeStepChunk(OldMoeRecords())[0]),
            kStepChunkColumnarV2 | kStepChunkFloat32);
}

// A realistic large MoE run: 48 layers x 128 experts, 1M tokens a global
// batch at top-8 (65,536 assignments an expert on average), each layer with
// a persistent skew over its experts and each count moving a few percent
// from step to step; 100 records a chunk, every record with its report.
Records RealisticMoeRecords(uint64_t seed, int n) {
  ::trainwatch::testing::RealisticMoe counts(seed);
  Records out;
  for (int i = 0; i < n; ++i) {
    v1::StepRecord& r = *out.Add();
    r.set_step(1000 + i);
    counts.AddTo(r);
  }
  return out;
}

TEST(StepCodec, RealisticMoeCountsTakeUnderTwoBytesEach) {
  const Records in = RealisticMoeRecords(1, 100);
  Records without = in;
  for (v1::StepRecord& r : without) {
    for (v1::MoeLayerStats& layer : *r.mutable_moe()->mutable_layers()) {
      layer.clear_tokens_per_expert();
    }
  }
  const double counts = 100.0 * 48 * 128;
  const double bytes = static_cast<double>(EncodeStepChunk(in).size()) -
                       static_cast<double>(EncodeStepChunk(without).size());
  EXPECT_LE(bytes / counts, 2.0);
  // Protobuf's varints, the residue's coding before: 3 bytes a count.
  v1::StepBatch batch;
  *batch.mutable_records() = in;
  v1::StepBatch batch_without;
  *batch_without.mutable_records() = without;
  EXPECT_GT(static_cast<double>(batch.ByteSizeLong() - batch_without.ByteSizeLong()) / counts,
            2.9);
  ExpectRoundTrip(in);
}

TEST(StepCodec, CorruptOrCutShortMoeChunksAreErrorsNotCrashes) {
  const std::string blob = EncodeStepChunk(RandomMoeRecords(8, 60));
  ASSERT_EQ(static_cast<unsigned char>(blob[0]), kStepChunkColumnarV2 | kStepChunkFloat32);
  Records out;
  ExpectCutsAndFlipsAreErrors(blob, /*seed=*/43, /*says_step_chunk=*/false);
  // Bytes after the counts.
  EXPECT_TRUE(absl::IsDataLoss(DecodeStepChunk(blob + std::string(1, '\0'), &out)));
}

}  // namespace
}  // namespace trainwatch


namespace trainwatch {
namespace {

// Float32Records(7, 40) as the encoder of schema version 11 wrote them
// (format byte 0x07, no kStepChunkFloat32: the clip_coef column's implied
// max_norm without the formula's bit): chunks of existing databases read
// back as they were.
const char kFloat32ChunkV11[] =
    "\x07\x28\x15\xf4\x20\x10\x1f\xff\xff\xff\xff\xde\xe1\xeb\xf2\x9d"
    "\x9f\x28\x00\x01\x24\xa9\x64\x22\xc4\x00\x00\x00\x00\x03\xef\xfa"
    "\x83\xc2\x90\x00\x00\x00\x18\xeb\x0c\x57\x4f\xfb\xbf\xe8\x61\x3a"
    "\xb8\x8f\x9c\xd8\x47\x80\x10\x06\x33\x65\xf0\x01\x00\x6c\xcd\xb6"
    "\x36\x34\xe1\xee\x40\x47\x15\x17\x23\xe5\x9b\xf6\xc5\x68\x20\x69"
    "\xa1\x8f\x9c\xd0\xff\x83\x8c\x56\x47\x92\xd5\xa1\xb0\xb7\x4d\x3a"
    "\xe5\xbe\x02\xdb\x00\xea\xa6\x66\x0b\x62\x92\xd2\xb6\x00\x2f\xfb"
    "\x2c\x8c\xd8\x00\xbf\xde\x61\xe6\xf2\x30\xed\xf7\x65\x12\xf1\xa8"
    "\xc8\xa2\xb0\x7b\x9d\xb8\xcc\x34\x52\xa9\xaf\x58\x6d\xbe\x2c\x2a"
    "\xad\xba\x61\x54\xb7\x30\x2b\xe2\x60\x46\x3f\xde\xd3\xfd\xfb\x3b"
    "\x54\xeb\xee\x70\x66\x00\x40\x2a\xcd\x20\xc0\x04\x01\x9e\x56\x67"
    "\x58\x90\x64\x67\xfe\x00\x00\x00\x00\x00\x00\x07\xdf\xf8\x00\x00"
    "\x00\x00\x00\x00\x5a\x7f\x03\xc0\x00\x00\x00\x00\x00\x01\xd3\xf8"
    "\x07\x07\x01\x6c\x00\x00\x00\x0c\x75\x67\xcf\xdf\xe8\xcf\xe5\x31"
    "\xc7\xde\x5f\xa9\x42\x9f\x5f\x6d\x1f\xbd\x42\x1f\x46\x2a\xa0\x80"
    "\x40\x3e\x97\xaa\xbf\x60\x75\x41\xee\x51\x82\x96\xfe\xfe\x18\x6a"
    "\xff\xb0\x1f\x07\xb5\x89\xf7\xa4\x35\xf3\x85\xa9\xfd\xdc\x05\xfb"
    "\xb1\xb1\xff\xbe\x52\x18\xd1\xe3\xfe\xcb\x84\x30\x23\xe8\x2c\x74"
    "\xaf\xb1\x2b\x8f\xaa\x1d\xef\x04\xb7\x11\xbf\x83\x21\xf2\x69\x42"
    "\x7f\xb8\x86\x1d\x1f\x0d\xde\x6d\xf0\x94\xa5\xf7\x45\x25\xf6\x2f"
    "\xb5\xf0\x5f\xe9\xf1\x6d\x42\x0c\x7d\x94\x30\x50\xc4\xfe\x00\x4b"
    "\x0e\x7b\x00\x00\x00\x03\x1d\x4d\xf6\x0a\x8d\x98\xfb\xb0\xc7\x44"
    "\x90\xb1\x4c\x49\x07\x19\x43\xd0\xd1\xd5\xc9\xf7\x26\xcb\xb1\x74"
    "\xe2\x1e\x9d\x03\x95\x6a\x6e\x5c\xf6\x5c\xe8\x45\x6d\xb2\xf5\x3e"
    "\x55\x48\xa2\xc7\x3e\x46\x51\x4f\xbb\x51\x62\x3b\x75\xf8\x93\x1d"
    "\xcd\xe0\x7c\xf2\x8e\xb4\xcc\x57\xc2\x5d\xad\x04\xf9\x87\x7a\xe1"
    "\xf7\xca\xe8\x3d\x7d\x9d\xc8\x84\x73\xd2\xce\xdc\x68\x51\x21\xbb"
    "\xc1\xe6\x77\x18\x3d\x4e\x59\xd1\x93\x4c\x06\xe7\x55\x4d\x12\x7f"
    "\x00\x01\x23\xb0\x80\x00\x00\x01\x8e\xa4\x57\x17\x89\x42\xc8\xe5"
    "\xa1\xa3\x54\x89\xc8\xe5\x5a\x71\x62\x2f\xe4\x74\xc2\x10\x07\xab"
    "\x94\x1a\x7c\xcd\x92\x85\x7b\x28\x9f\x8d\xb0\xda\x0a\xd8\xc6\x6a"
    "\xa5\x4a\x1c\x18\xe2\x60\x67\x4d\xc3\x73\xc3\x9b\x27\x07\xa1\x98"
    "\x1f\x9c\xd4\xf5\x85\x8e\xcb\x1e\x4d\xf2\x7a\x29\x41\xfe\x35\xb8"
    "\x96\x47\x3a\x10\xc4\x24\x99\xc2\x43\x96\x00\xe5\x2f\x2c\xd4\x33"
    "\x43\xaf\x84\x74\x9c\x33\x27\xc6\xd3\x94\x97\x86\x12\x9f\x7d\x08"
    "\x43\xeb\xe8\x1b\x06\xec\x80\x01\x00\x00\x00\x00\x00\x00\x04\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\xf7\x82\x82\xfc"
    "\x9f\x22\x40\x00\x00\x00\x00\x00\x04\x21\xf5\xf4\x0d\x83\x75\x80"
    "\x00\x00\x00\x00\x00\x73\x43\xc4\x7a\xee\xb3\xd0\x00\x00\x00\x00"
    "\x00\x03\x3b\x6e\x6b\x17\xa6\x0f\x00\x00\x00\x00\x00\x00\xe6\x87"
    "\x88\xf5\xdd\x66\xea\x80\x00\x00\x00\x00\x00\x5b\x97\xd6\x4a\xfa"
    "\xcf\x80\x00\x00\x00\x00\x00\x73\x43\xc4\x7a\xee\xb3\xe5\xcb\x96"
    "\xb0\x00\x00\x00\x00\x00\x16\xe5\xf5\x92\xbe\xb3\xa0\x00\x00\x00"
    "\x00\x00\x22\xbb\xec\xaa\xb8\xa5\xf5\xab\x56\xad\x27\xdf\xf2\x9c"
    "\x3b\xe0\x00\x00\x00\x31\xd6\x11\x35\xfd\x0d\x8c\xc8\xab\x09\x9d"
    "\xb6\xc1\x73\x3f\x80\x10\x0a\x69\x67\xe0\x01\x00\xbc\x29\x5e\x1b"
    "\x2b\x9b\xd1\x4c\xbe\x81\x32\x63\x98\x7d\xa5\x41\xbe\x4a\x47\x7d"
    "\xb3\x83\x5e\xd0\x17\x12\xb9\xa0\x02\x39\x38\x13\x6e\x81\x1e\x2a"
    "\x42\x62\x71\x8b\x81\x0c\xf4\x8d\xc3\xb4\x8c\x76\xa0\x0f\xfa\x6e"
    "\xee\x90\x03\xfc\xcd\x8b\xc7\x4f\xc6\xfa\xdd\x1a\xca\x1a\xc6\x89"
    "\x89\xec\xee\xec\x67\x28\x60\x2c\xb5\x67\x92\x3b\x8d\xd9\x5f\x12"
    "\x75\x6a\x9c\x92\xb7\xbd\x7e\x60\xcd\xc7\xc5\xfb\xfb\x70\xe9\x67"
    "\x15\xfe\x37\x6f\x00\x08\x06\xce\x4f\x04\x00\x80\x29\xe9\xb9\x19"
    "\x47\xbf\x70\x70\x01\xbc\x13\xa0\x19\x85\x8a\x02\x01\xff\xff\xff"
    "\xff\xfc";

TEST(StepCodec, ChunksWithoutTheFloat32FlagReadBack) {
  const std::string blob(kFloat32ChunkV11, sizeof(kFloat32ChunkV11) - 1);
  ASSERT_EQ(static_cast<unsigned char>(blob[0]), kStepChunkColumnarV1);
  Records out;
  absl::Status s = DecodeStepChunk(blob, &out);
  ASSERT_TRUE(s.ok()) << s;
  const Records in = Float32Records(7, 40);
  ASSERT_EQ(out.size(), in.size());
  for (int i = 0; i < in.size(); ++i) ExpectSame(in[i], out[i], i);
  // The encoder now sets the flag; the records are the same.
  EXPECT_EQ(static_cast<unsigned char>(EncodeStepChunk(in)[0]),
            kStepChunkColumnarV1 | kStepChunkFloat32);
  ExpectRoundTrip(in);
}

// ClipCoefFloat32 is clip_fields' tensor path in float32; these are
// tools/perf/storage_gen.py's clip_coef_f32 (the same ops, each rounded to
// float32) on the same norms.
TEST(StepCodec, ClipCoefFloat32IsFloat32Arithmetic) {
  EXPECT_EQ(v1::ClipCoefFloat32(1.0, 1.7), 0.5882349610328674);
  EXPECT_EQ(v1::ClipCoefFloat32(0.5, 1.7), 0.2941174805164337);
  EXPECT_EQ(v1::ClipCoefFloat32(1.0, 1.0000001), 0.999998927116394);
  EXPECT_EQ(v1::ClipCoefFloat32(1.0, 12.5), 0.07999999076128006);
  EXPECT_EQ(v1::ClipCoefFloat32(1.0, 1e-3), 1.0);
  EXPECT_EQ(v1::ClipCoefFloat32(1.0, std::numeric_limits<double>::infinity()), 0.0);
  EXPECT_TRUE(std::isnan(v1::ClipCoefFloat32(1.0, std::nan(""))));
  EXPECT_NE(v1::ClipCoefFloat32(1.0, 1.7), v1::ClipCoef(1.0, 1.7));
}

// A chunk whose clip_coef is trainwatch.torch's float32 one is predicted by
// the float32 formula: it costs what the double one does in a chunk of
// C++-client records (a bit or so a value), not its own XOR residuals. A
// coefficient neither formula gives still reads back.
TEST(StepCodec, Float32ClipCoefficientsArePredicted) {
  const Records doubles = Float32Records(11, 1024);
  Records floats = doubles;
  for (v1::StepRecord& r : floats) r.set_clip_coef(v1::ClipCoefFloat32(0.8, r.grad_norm()));
  Records doubles_08 = doubles;
  for (v1::StepRecord& r : doubles_08) r.set_clip_coef(v1::ClipCoef(0.8, r.grad_norm()));
  ExpectRoundTrip(floats);
  const size_t float_bytes = EncodeStepChunk(floats).size();
  const size_t double_bytes = EncodeStepChunk(doubles_08).size();
  EXPECT_LE(float_bytes, double_bytes + 8) << double_bytes;
  Records unpredicted = floats;
  unpredicted[0].set_clip_coef(0.3);  // a clipped first record of no formula
  EXPECT_GT(EncodeStepChunk(unpredicted).size(), float_bytes + 200);
  ExpectRoundTrip(unpredicted);
  floats[700].set_clip_coef(std::bit_cast<double>(uint64_t{0x7ff8000000000001}));
  floats[701].set_clip_coef(-0.0);
  ExpectRoundTrip(floats);
}

}  // namespace
}  // namespace trainwatch
