// The flag columns of a step chunk (step_codec.h): bitmaps written raw, as
// runs, or as one mode when every flag is the same.
//
// Thread-safe: pure functions.
#ifndef TRAINWATCH_SERVER_STORE_CODEC_BITMAP_H_
#define TRAINWATCH_SERVER_STORE_CODEC_BITMAP_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "store/codec/bits.h"

namespace trainwatch::codec {

// A bitmap of m flags: a mode (2 bits), then for kRawBits one bit a flag, for
// kRuns the first flag and each run's length - 1 as Golomb codes (k: 6 bits).
void PutBitmap(BitWriter& w, const std::vector<uint8_t>& bits);
// Reads m flags into out (0 or 1 each). False when the reader failed or the
// runs do not add up to m.
bool GetBitmap(BitReader& r, size_t m, std::vector<uint8_t>& out);

}  // namespace trainwatch::codec

#endif  // TRAINWATCH_SERVER_STORE_CODEC_BITMAP_H_
