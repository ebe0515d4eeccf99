// Series and columns of a step chunk (step_codec.h): integer series coded
// against the best of several predictors, and double columns coded as their
// bits or, when that is cheaper, as decimals.
//
// Thread-safe: pure functions.
#ifndef TRAINWATCH_SERVER_STORE_CODEC_SERIES_H_
#define TRAINWATCH_SERVER_STORE_CODEC_SERIES_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "store/codec/bits.h"

namespace trainwatch::codec {

// A series of 64-bit values: the first as its bit width (7 bits) and bits,
// then, for two or more, the predictor (3 bits) and a bit set when every
// residual is zero; otherwise a bit for zero flags (see BestGolomb), the
// residuals' common trailing zeros (6 bits), the Golomb k (6 bits), for
// kCentered the center (64 bits), and one code per residual.

enum Predictor : int {
  kRaw = 0,           // zigzag(v)
  kDelta = 1,         // zigzag(v[i] - v[i-1])
  kDeltaOfDelta = 2,  // zigzag of the change of the delta (0 before v[1])
  kXor = 3,           // v[i] ^ v[i-1], on a double's raw bits
  kDelta3 = 4,        // the change of the change of the delta: smooth schedules
  kPredicted = 5,     // zigzag(v[i] - p[i]) for a prediction p the reader rebuilds
  kCentered = 6,      // zigzag(v[i] - c), c the series' mean (64 bits after k)
};
constexpr int kPredictors = 7;

// Values of a double column are mapped by Ordered() for the arithmetic
// predictors; integer columns use them as they are.
enum class SeriesKind { kInteger, kDouble };

// Writes v[0..m) under the cheapest of `candidates` (pred: kPredicted's
// predictions, one per value, as raw bits). `zero_shortcut`: a series whose
// residuals are all zero is written as that one bit.
void PutSeries(BitWriter& w, const uint64_t* v, size_t m, SeriesKind kind,
               std::initializer_list<Predictor> candidates,
               bool zero_shortcut = true, const uint64_t* pred = nullptr);
// Reads m values into out (pred: as PutSeries was given). False when the
// reader failed.
bool GetSeries(BitReader& r, size_t m, SeriesKind kind,
               std::vector<uint64_t>& out, const uint64_t* pred = nullptr);

// A column of doubles: a bit, then either the doubles' bits as a series or,
// when every value is a decimal of few digits (q / 10^e exactly, as values
// read from a text log are) and that is cheaper, e (5 bits) and the q as an
// integer series.
void PutDoubles(BitWriter& w, const uint64_t* v, size_t m,
                std::initializer_list<Predictor> candidates,
                const uint64_t* pred = nullptr);
// Reads m doubles' bits into out (pred: as PutDoubles was given). False when
// the reader failed.
bool GetDoubles(BitReader& r, size_t m, std::vector<uint64_t>& out,
                const uint64_t* pred = nullptr);

}  // namespace trainwatch::codec

#endif  // TRAINWATCH_SERVER_STORE_CODEC_SERIES_H_
