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
#ifndef TRAINWATCH_SERVER_STORE_RANK_DIGEST_H_
#define TRAINWATCH_SERVER_STORE_RANK_DIGEST_H_

#include <cstdint>

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

// `in`'s digest, written over `out`.
void DigestRecord(const v1::StepRecord& in, v1::StepRecord* out);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_STORE_RANK_DIGEST_H_
