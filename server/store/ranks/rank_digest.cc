#include "store/ranks/rank_digest.h"

#include <bit>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "store/codec/step_codec.h"

namespace trainwatch {

double RoundToSignificantBits(double value, int bits) {
  if (!std::isfinite(value) || value == 0 || bits >= 53) return value;
  // The 52 stored fraction bits less the (bits - 1) kept; a carry out of the
  // fraction raises the exponent, as rounding should.
  const int drop = 53 - bits;
  uint64_t b = std::bit_cast<uint64_t>(value);
  const uint64_t half = uint64_t{1} << (drop - 1);
  b += half - 1 + ((b >> drop) & 1);
  b &= ~((uint64_t{1} << drop) - 1);
  return std::bit_cast<double>(b);
}

namespace {

int64_t RoundTime(int64_t ns) {
  constexpr int64_t kUnit = int64_t{1} << kRankDigestTimeShift;
  // Floor division, then to the nearer multiple (a time may be negative).
  int64_t q = ns / kUnit;
  int64_t r = ns % kUnit;
  if (r < 0) {
    r += kUnit;
    --q;
  }
  if (r >= kUnit / 2 && q < INT64_MAX / kUnit) ++q;
  return q * kUnit;
}

}  // namespace

RankDigest MakeRankDigest(const v1::StepRecord& in) {
  constexpr int kBits = kRankDigestMantissaBits;
  RankDigest d;
  d.step = in.step();
  d.time_unix_nanos = RoundTime(in.time_unix_nanos());
  d.grad_norm = RoundToSignificantBits(in.grad_norm(), kBits);
  if (in.has_shard_sq_sum()) {
    d.shard_sq_sum = RoundToSignificantBits(in.shard_sq_sum(), kBits);
    d.bits |= RankDigest::kHasShardSqSum;
  }
  if (in.has_step_time_s()) {
    d.step_time_s = RoundToSignificantBits(in.step_time_s(), kBits);
    d.bits |= RankDigest::kHasStepTime;
  }
  if (in.has_data_wait_s()) {
    d.data_wait_s = RoundToSignificantBits(in.data_wait_s(), kBits);
    d.bits |= RankDigest::kHasDataWait;
  }
  if (in.has_clipped()) {
    d.bits |= RankDigest::kHasClipped;
    if (in.clipped()) d.bits |= RankDigest::kClipped;
  }
  if (in.skipped()) d.bits |= RankDigest::kSkipped;
  return d;
}

void RankDigestToRecord(const RankDigest& d, v1::StepRecord* out) {
  out->Clear();
  out->set_step(d.step);
  out->set_time_unix_nanos(d.time_unix_nanos);
  out->set_grad_norm(d.grad_norm);
  if (d.bits & RankDigest::kHasShardSqSum) out->set_shard_sq_sum(d.shard_sq_sum);
  if (d.bits & RankDigest::kHasStepTime) out->set_step_time_s(d.step_time_s);
  if (d.bits & RankDigest::kHasDataWait) out->set_data_wait_s(d.data_wait_s);
  out->set_skipped((d.bits & RankDigest::kSkipped) != 0);
  if (d.bits & RankDigest::kHasClipped) out->set_clipped((d.bits & RankDigest::kClipped) != 0);
}

void DigestRecord(const v1::StepRecord& in, v1::StepRecord* out) {
  RankDigestToRecord(MakeRankDigest(in), out);
}

namespace {

bool GetVarint(std::string_view& in, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift <= 63; shift += 7) {
    if (in.empty()) return false;
    const auto b = static_cast<unsigned char>(in.front());
    in.remove_prefix(1);
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (b < 0x80) return true;
  }
  return false;
}

}  // namespace

std::string EncodeRankTail(
    absl::Span<const RankTailEntry> streams,
    const google::protobuf::RepeatedPtrField<v1::StepRecord>& records) {
  std::string out;
  PutVarint(out, streams.size());
  for (const RankTailEntry& e : streams) PutVarint(out, e.rank);
  for (const RankTailEntry& e : streams) PutVarint(out, e.attempt);
  out.append(EncodeStepChunk(records));
  return out;
}

absl::Status DecodeRankTail(std::string_view blob, std::vector<RankTailEntry>* streams,
                            google::protobuf::RepeatedPtrField<v1::StepRecord>* records) {
  uint64_t n = 0;
  // A varint a rank and an attempt: at least two bytes a record.
  if (!GetVarint(blob, &n) || n > blob.size() / 2) {
    return absl::DataLossError("rank tail: the record count does not decode");
  }
  streams->assign(n, RankTailEntry{});
  for (int part = 0; part < 2; ++part) {
    for (RankTailEntry& e : *streams) {
      uint64_t v = 0;
      if (!GetVarint(blob, &v) || v > UINT32_MAX) {
        return absl::DataLossError("rank tail: a rank or attempt does not decode");
      }
      (part == 0 ? e.rank : e.attempt) = static_cast<uint32_t>(v);
    }
  }
  if (absl::Status s = DecodeStepChunk(blob, records); !s.ok()) {
    return absl::DataLossError(absl::StrCat("rank tail: ", s.message()));
  }
  if (static_cast<uint64_t>(records->size()) != n) {
    return absl::DataLossError("rank tail: the records and their ranks differ in number");
  }
  return absl::OkStatus();
}

}  // namespace trainwatch
