#include "store/rank_digest.h"

#include <bit>
#include <cmath>
#include <cstdint>

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

void DigestRecord(const v1::StepRecord& in, v1::StepRecord* out) {
  constexpr int kBits = kRankDigestMantissaBits;
  out->Clear();
  out->set_step(in.step());
  out->set_time_unix_nanos(RoundTime(in.time_unix_nanos()));
  out->set_grad_norm(RoundToSignificantBits(in.grad_norm(), kBits));
  if (in.has_shard_sq_sum()) {
    out->set_shard_sq_sum(RoundToSignificantBits(in.shard_sq_sum(), kBits));
  }
  if (in.has_step_time_s()) {
    out->set_step_time_s(RoundToSignificantBits(in.step_time_s(), kBits));
  }
  if (in.has_data_wait_s()) {
    out->set_data_wait_s(RoundToSignificantBits(in.data_wait_s(), kBits));
  }
  out->set_skipped(in.skipped());
  if (in.has_clipped()) out->set_clipped(in.clipped());
}

}  // namespace trainwatch
