#include "store/codec/golomb.h"

#include <algorithm>
#include <utility>

namespace trainwatch::codec {

GolombChoice BestGolomb(const WidthHistogram& hist, int shift,
                        bool allow_zero_flags) {
  // The largest width present, from the top: a column's values fill the
  // low widths, and the writer of MoE counts asks this for every layer of
  // every record (scanning all 65 widths, twice, was 15% of its time).
  int top_in = 64;
  while (top_in > 0 && hist[top_in] == 0) --top_in;
  // Widths after the shift (a nonzero value loses exactly `shift` bits).
  // Those below the shift are empty (a value of the column has at least
  // `shift` trailing zeros); were they not, they count as zeros, and
  // indexing them would leave the array (found by step_codec_fuzzer).
  const int top = top_in == 0 ? 0 : std::max(0, top_in - shift);
  std::array<uint64_t, 65> h;
  std::fill(h.begin(), h.begin() + top + 1, uint64_t{0});
  for (int b = 0; b <= top_in; ++b) h[b == 0 ? 0 : std::max(0, b - shift)] += hist[b];
  // Plain: cost(k) = count*k + #(width <= k) + 2 * sum over width > k of
  // (width - k), zeros counted in count and in #(width <= k). Zero-flagged:
  // a bit per value, then the nonzero ones plainly, which is the plain cost
  // less (k + 1) a zero plus one a value: both priced in one pass over k.
  const uint64_t zeros = h[0];
  uint64_t nonzero = 0, width_sum = 0;
  for (int b = 1; b <= top; ++b) {
    nonzero += h[b];
    width_sum += h[b] * b;
  }
  const uint64_t count = zeros + nonzero;
  GolombChoice plain{.k = 0, .zero_flags = false, .cost = ~uint64_t{0}};
  GolombChoice flagged{.k = 0, .zero_flags = true, .cost = ~uint64_t{0}};
  uint64_t le = 0, le_width = 0;  // nonzero values of width <= k, their widths' sum
  for (int k = 0; k <= 63; ++k) {
    if (k > 0 && k <= top) {
      le += h[k];
      le_width += h[k] * k;
    }
    const uint64_t gt = nonzero - le;
    const uint64_t tail = 2 * ((width_sum - le_width) - gt * k);
    const uint64_t cost = count * k + zeros + le + tail;
    if (cost < plain.cost) plain = {.k = k, .zero_flags = false, .cost = cost};
    const uint64_t fcost = nonzero * k + le + tail;
    if (fcost < flagged.cost) flagged = {.k = k, .zero_flags = true, .cost = fcost};
    if (gt == 0) break;
  }
  if (zeros == 0 || !allow_zero_flags) return plain;
  // All zeros: one flag each, nothing after.
  flagged.cost = (nonzero == 0 ? 0 : flagged.cost) + count;
  if (nonzero == 0) flagged.k = 0;
  return flagged.cost < plain.cost ? flagged : plain;
}

}  // namespace trainwatch::codec
