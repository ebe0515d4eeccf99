// The integer codes of a step chunk's columns: Exp-Golomb codes and the
// choice of their parameter, zigzag for signed residuals, and the
// order-preserving map of a double's bits.
//
// Thread-safe: pure functions.
#ifndef TRAINWATCH_SERVER_STORE_CODEC_GOLOMB_H_
#define TRAINWATCH_SERVER_STORE_CODEC_GOLOMB_H_

#include <array>
#include <bit>
#include <cstdint>

#include "store/codec/bits.h"

namespace trainwatch::codec {

// Exp-Golomb of order k: v = x >> k as its bit width n in unary then the n-1
// bits below its leading one, then the k low bits of x. Costs k + 1 bits for
// x < 2^k and two more per doubling above it, so one outlier costs little.

// The same bits as one write: n zeros, then x in n + k bits (its top bit is
// v's leading one), or for n = 0 a one and the k bits.
inline void PutGolomb(BitWriter& w, uint64_t x, int k) {
  const int n = std::bit_width(x >> k);
  if (n == 0) {
    w.Put((uint64_t{1} << k) | x, k + 1);
  } else if (2 * n + k <= 64) {
    w.Put(x, 2 * n + k);
  } else {
    w.Put(0, n);
    w.Put(x, n + k);
  }
}

inline uint64_t GetGolomb(BitReader& r, int k) { return r.GetGolomb(k); }

// Counts of values by bit width (0..64), to price every k at once.
using WidthHistogram = std::array<uint32_t, 65>;

// The cheapest way to write values of `hist` shifted right by `shift`
// (their common trailing zeros): the Golomb k, whether each value is
// preceded by a bit saying whether it is zero (cheaper when most are zero
// and the rest large, as a field that is 1.0 except when clipping), and the
// total bits.
struct GolombChoice {
  int k = 0;
  bool zero_flags = false;
  uint64_t cost = 0;
};

GolombChoice BestGolomb(const WidthHistogram& hist, int shift,
                        bool allow_zero_flags = true);

inline uint64_t ZigZag(uint64_t v) {
  return (v << 1) ^ static_cast<uint64_t>(static_cast<int64_t>(v) >> 63);
}
inline uint64_t UnZigZag(uint64_t z) { return (z >> 1) ^ (~(z & 1) + 1); }

// A double's bits as an integer that orders like the double (for non-NaN):
// negative values get their magnitude bits flipped. Its own inverse.
inline uint64_t Ordered(uint64_t bits) {
  return bits ^ (static_cast<uint64_t>(static_cast<int64_t>(bits) >> 63) >> 1);
}

}  // namespace trainwatch::codec

#endif  // TRAINWATCH_SERVER_STORE_CODEC_GOLOMB_H_
