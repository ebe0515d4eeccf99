#include "store/codec/bitmap.h"

#include <algorithm>
#include <bit>

#include "store/codec/golomb.h"

namespace trainwatch::codec {
namespace {

enum BitmapMode : int { kAllFalse = 0, kAllTrue = 1, kRawBits = 2, kRuns = 3 };

}  // namespace

void PutBitmap(BitWriter& w, const std::vector<uint8_t>& bits) {
  const size_t m = bits.size();
  if (m == 0) return;
  size_t ones = 0;
  for (uint8_t b : bits) ones += b;
  if (ones == 0 || ones == m) {
    w.Put(ones == 0 ? kAllFalse : kAllTrue, 2);
    return;
  }
  WidthHistogram hist{};
  auto for_each_run = [&](auto&& f) {
    size_t start = 0;
    for (size_t i = 1; i <= m; ++i) {
      if (i == m || bits[i] != bits[start]) {
        f(i - start - 1);
        start = i;
      }
    }
  };
  for_each_run([&](uint64_t len) { ++hist[std::bit_width(len)]; });
  const GolombChoice runs = BestGolomb(hist, 0, /*allow_zero_flags=*/false);
  const int k = runs.k;
  if (1 + 6 + runs.cost < m) {
    w.Put(kRuns, 2);
    w.Put(bits[0], 1);
    w.Put(k, 6);
    for_each_run([&](uint64_t len) { PutGolomb(w, len, k); });
  } else {
    w.Put(kRawBits, 2);
    for (uint8_t b : bits) w.Put(b, 1);
  }
}

bool GetBitmap(BitReader& r, size_t m, std::vector<uint8_t>& out) {
  out.assign(m, 0);
  if (m == 0) return true;
  switch (r.Get(2)) {
    case kAllFalse:
      break;
    case kAllTrue:
      std::fill(out.begin(), out.end(), 1);
      break;
    case kRawBits:
      for (size_t i = 0; i < m; ++i) out[i] = static_cast<uint8_t>(r.Get(1));
      break;
    case kRuns: {
      uint8_t value = static_cast<uint8_t>(r.Get(1));
      const int k = static_cast<int>(r.Get(6));
      for (size_t i = 0; i < m && !r.failed(); value ^= 1) {
        const uint64_t len = GetGolomb(r, k) + 1;
        if (len == 0 || len > m - i) return false;
        std::fill_n(out.begin() + i, len, value);
        i += len;
      }
      break;
    }
  }
  return !r.failed();
}

}  // namespace trainwatch::codec
