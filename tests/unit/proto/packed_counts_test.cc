// The MoE counts' parser patched into the generated code
// (proto/trainwatch/v1/packed_counts.h): it is the one the generated
// MoeLayerStats uses, and it takes and refuses what protobuf's own parser
// does, with the same values. Protobuf's is reached through a dynamic
// message of the same descriptor, which parses by reflection
// (tests/common/counts_wire.h).
#include "trainwatch/v1/packed_counts.h"

#include <memory>
#include <random>
#include <string>

#include "counts_wire.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::v1 {
namespace {

namespace pb = google::protobuf;

using trainwatch::testing::CountsRequestWire;
using trainwatch::testing::ProtobufParsedRequest;
using trainwatch::testing::PutVarint;

// A varint of any length from 1 to 10 bytes, with the overlong forms
// protobuf accepts (trailing zero groups, a 10th byte over 1), or rarely
// one of 11 bytes (malformed).
std::string AnyVarint(std::mt19937_64& rng) {
  std::string out;
  switch (rng() % 6) {
    case 0:
      PutVarint(rng() % 128, out);
      break;
    case 1:
    case 2:
      PutVarint(rng() % (1 << 21), out);  // what trainers send: ~3 bytes
      break;
    case 3:
      PutVarint(rng() >> (rng() % 64), out);
      break;
    default: {
      const size_t len = rng() % 500 == 0 ? 11 : 1 + rng() % 10;
      for (size_t i = 0; i < len; ++i) {
        out.push_back(static_cast<char>((rng() & 0x7f) | (i + 1 < len ? 0x80 : 0)));
      }
    }
  }
  return out;
}

TEST(PackedCounts, TheGeneratedCodeUsesIt) {
  // It reserves the counts it found at once; protobuf's parser adds them one
  // by one. Their capacities differ for some number of counts.
  int n = 100;
  pb::RepeatedField<uint64_t> added, reserved;
  for (;; ++n) {
    added.Clear();
    reserved.Clear();
    while (added.size() < n) added.Add(1);
    reserved.Reserve(n);
    if (added.Capacity() != reserved.Capacity()) break;
    ASSERT_LT(n, 4096) << "protobuf's growth reserves exactly: this test cannot tell";
  }
  MoeLayerStats layer;
  for (int i = 0; i < n; ++i) layer.add_tokens_per_expert(70'000 + i);
  // Fields after the counts: a field in the last 16 bytes of the input is
  // left to protobuf's parser (it is not whole in the parser's buffer).
  layer.set_aux_loss(0.01);
  layer.set_z_loss(0.001);
  MoeLayerStats parsed;
  ASSERT_TRUE(parsed.ParseFromString(layer.SerializeAsString()));
  EXPECT_EQ(parsed.tokens_per_expert_size(), n);
  EXPECT_EQ(parsed.tokens_per_expert().Capacity(), reserved.Capacity())
      << "the counts were parsed by protobuf's parser: was patch_counts_parser.cmake "
         "applied to the generated trainwatch.pb.cc?";
}

TEST(PackedCounts, RealisticCountsRoundTrip) {
  std::mt19937_64 rng(3);
  ReportRequest request;
  StepRecord* record = request.mutable_batch()->add_records();
  for (int l = 0; l < 48; ++l) {
    MoeLayerStats* layer = record->mutable_moe()->add_layers();
    layer->set_layer("layers." + std::to_string(l));
    for (int e = 0; e < 128; ++e) layer->add_tokens_per_expert(40'000 + rng() % 60'000);
  }
  record->mutable_moe()->mutable_layers(7)->set_tokens_per_expert(3, ~uint64_t{0});
  record->mutable_moe()->mutable_layers(9)->set_tokens_per_expert(0, 0);
  ReportRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(request.SerializeAsString()));
  EXPECT_TRUE(pb::util::MessageDifferencer::Equals(parsed, request));
}

TEST(PackedCounts, ManyOneByteCounts) {
  // A layer of many experts with small counts (dead ones, a small batch):
  // one-byte varints, more of them in a row than one byte can count (the
  // parser counts them in rounds); the reserve must hold them all.
  for (const int n : {255, 256, 300, 2048, 4096}) {
    ReportRequest request;
    MoeLayerStats* layer = request.mutable_batch()->add_records()->mutable_moe()->add_layers();
    layer->set_layer("wide");
    for (int e = 0; e < n; ++e) layer->add_tokens_per_expert(e % 3 == 0 ? 0 : e % 100);
    // A field after the counts and a record after theirs: the counts lie
    // whole in the parser's buffer, not in its last 16 bytes.
    layer->set_aux_loss(0.5);
    request.mutable_batch()->add_records()->set_step(7);
    request.mutable_batch()->mutable_records(1)->set_loss(2.5);
    ReportRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(request.SerializeAsString())) << n;
    EXPECT_TRUE(pb::util::MessageDifferencer::Equals(parsed, request)) << n;
  }
}

TEST(PackedCounts, AVarintOfHundredsOfBytesIsRefused) {
  // 300 bytes with their high bit set, then an end: one varint far over
  // 10 bytes, as a hostile or corrupt client may send. Refused as protobuf
  // refuses it, wherever it starts in the parser's blocks of 64 bytes.
  for (const int lead : {0, 1, 7, 63, 64, 65, 100}) {
    std::string body;
    for (int i = 0; i < lead; ++i) body.push_back(0x05);
    body.append(300, static_cast<char>(0x80));
    body.push_back(0x01);
    const std::string wire = CountsRequestWire(body, body.size(), 12);
    const std::unique_ptr<pb::Message> reference = ProtobufParsedRequest();
    ASSERT_FALSE(reference->ParseFromString(wire));
    ReportRequest parsed;
    EXPECT_FALSE(parsed.ParseFromString(wire)) << lead;
  }
}

// Random counts fields, well formed or not, at random places in a request,
// parsed flat and from a stream of small chunks (where a field crosses the
// parser's buffers and protobuf's takes it): the same verdict and values.
TEST(PackedCounts, AcceptsAndRefusesAsProtobufDoes) {
  std::mt19937_64 rng(11);
  int accepted = 0, refused = 0;
  for (int trial = 0; trial < 20'000; ++trial) {
    std::string body;
    const int counts = static_cast<int>(rng() % 200);
    for (int i = 0; i < counts; ++i) body += AnyVarint(rng);
    if (rng() % 8 == 0 && !body.empty()) body.back() = static_cast<char>(body.back() | 0x80);
    int64_t length = static_cast<int64_t>(body.size());
    if (rng() % 16 == 0) length += static_cast<int64_t>(rng() % 5) - 2;  // a length that lies
    if (length < 0) length = 0;
    const std::string wire =
        CountsRequestWire(body, static_cast<uint64_t>(length), static_cast<int>(rng() % 12));
    const std::unique_ptr<pb::Message> reference = ProtobufParsedRequest();
    const bool want = reference->ParseFromString(wire);
    ReportRequest flat;
    ASSERT_EQ(flat.ParseFromString(wire), want) << "trial " << trial;
    pb::io::ArrayInputStream chunks(wire.data(), static_cast<int>(wire.size()),
                                    1 + static_cast<int>(rng() % 40));
    ReportRequest chunked;
    ASSERT_EQ(chunked.ParseFromZeroCopyStream(&chunks), want) << "trial " << trial;
    if (!want) {
      ++refused;
      continue;
    }
    ++accepted;
    ASSERT_TRUE(pb::util::MessageDifferencer::Equals(flat, *reference)) << "trial " << trial;
    ASSERT_TRUE(pb::util::MessageDifferencer::Equals(chunked, *reference)) << "trial " << trial;
  }
  // Both kinds were tried, in numbers.
  EXPECT_GT(accepted, 3'000);
  EXPECT_GT(refused, 3'000);
}

}  // namespace
}  // namespace trainwatch::v1
