// What the store keeps of a record from a rank other than its run's lead
// (docs/architecture.md, "What is kept per rank").
//
// The lead rank's records are kept whole: they are the run. The others send
// the same global norm and their own shard, step time and data wait, and
// what the cross-rank checks need of them is decided live, on the full
// records, before anything is stored. Kept of them is a digest: the step,
// the time (to 2^20 ns, about a millisecond), grad_norm, shard_sq_sum,
// step_time_s and data_wait_s (to kRankDigestMantissaBits significant bits,
// a relative error of at most 2^-16, 1.5e-5: five significant digits),
// and the skipped and clipped flags. Rounded values leave trailing zero bits
// that the chunk codec does not store, so a digest costs a few bytes.
//
// Thread-safe: pure functions.
#ifndef TRAINWATCH_SERVER_STORE_RANKS_RANK_DIGEST_H_
#define TRAINWATCH_SERVER_STORE_RANKS_RANK_DIGEST_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

// Significant bits a digest keeps of each float (the implicit one included).
inline constexpr int kRankDigestMantissaBits = 16;
// A digest's time is a multiple of 2^kRankDigestTimeShift ns.
inline constexpr int kRankDigestTimeShift = 20;

// `value` rounded to `bits` significant bits (1..53), to nearest, ties to
// even. NaN, infinities and zeros stay as they are; a value that rounds
// past the largest double becomes infinity.
double RoundToSignificantBits(double value, int bits);

// A digest as the writer holds it in memory until it is in a chunk: the
// fields it keeps, 56 bytes (a StepRecord message is several times that, and
// a run of 16,384 ranks holds up to a group of them a rank).
struct RankDigest {
  uint64_t step = 0;
  int64_t time_unix_nanos = 0;
  double grad_norm = 0, shard_sq_sum = 0, step_time_s = 0, data_wait_s = 0;
  // kHas* presence bits and the two flags.
  uint8_t bits = 0;
  static constexpr uint8_t kHasShardSqSum = 1, kHasStepTime = 2, kHasDataWait = 4,
                           kHasClipped = 8, kClipped = 16, kSkipped = 32;
};

// `in`'s digest (the rounding above).
RankDigest MakeRankDigest(const v1::StepRecord& in);
// The digest as a record, written over `out`.
void RankDigestToRecord(const RankDigest& d, v1::StepRecord* out);
// Both: `in`'s digest as a record.
void DigestRecord(const v1::StepRecord& in, v1::StepRecord* out);

// One rank_tail row: the digests one transaction stored of one run, with
// the rank and attempt of each. Encoded as the count (varint), the ranks and
// the attempts (a varint each), then the records as a step chunk
// (store/codec/step_codec.h).
struct RankTailEntry {
  uint32_t rank = 0;
  uint32_t attempt = 0;
};
std::string EncodeRankTail(
    absl::Span<const RankTailEntry> streams,
    const google::protobuf::RepeatedPtrField<v1::StepRecord>& records);
// DATA_LOSS for a blob that does not decode or whose parts disagree.
absl::Status DecodeRankTail(std::string_view blob, std::vector<RankTailEntry>* streams,
                            google::protobuf::RepeatedPtrField<v1::StepRecord>* records);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_STORE_RANKS_RANK_DIGEST_H_
