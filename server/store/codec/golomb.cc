#include "store/codec/golomb.h"

#include <algorithm>
#include <utility>

namespace trainwatch::codec {

GolombChoice BestGolomb(const WidthHistogram& hist, int shift,
                        bool allow_zero_flags) {
  // Widths after the shift (a nonzero value loses exactly `shift` bits).
  std::array<uint64_t, 65> h{};
  // Only the widths present: those below the shift are empty (a value of
  // the column has at least `shift` trailing zeros), and indexing them would
  // leave the array (found by step_codec_fuzzer).
  int top = 0;  // the largest width present after the shift
  for (int b = 0; b <= 64; ++b) {
    if (hist[b] == 0) continue;
    const int to = b == 0 ? 0 : std::max(0, b - shift);
    h[to] += hist[b];
    top = std::max(top, to);
  }
  // Plain: cost(k) = count*k + #(width <= k) + 2 * sum over width > k of
  // (width - k). Zero-flagged: a bit per value, then the nonzero ones plainly.
  auto best_k = [&](uint64_t zeros) {
    uint64_t count = zeros, width_sum = 0;
    for (int b = 1; b <= top; ++b) {
      count += h[b];
      width_sum += h[b] * b;
    }
    std::pair<int, uint64_t> best{0, ~uint64_t{0}};
    uint64_t le = zeros, le_width = 0;  // count and width sum of widths <= k
    for (int k = 0; k <= 63; ++k) {
      if (k > 0) {
        le += h[k];
        le_width += h[k] * k;
      }
      const uint64_t gt = count - le;
      const uint64_t cost = count * k + le + 2 * ((width_sum - le_width) - gt * k);
      if (cost < best.second) best = {k, cost};
      if (gt == 0) break;
    }
    return best;
  };
  auto [k, cost] = best_k(h[0]);
  GolombChoice choice{.k = k, .zero_flags = false, .cost = cost};
  if (h[0] > 0 && allow_zero_flags) {
    uint64_t count = 0;
    for (uint64_t c : h) count += c;
    auto [fk, fcost] = best_k(0);
    if (h[0] == count) fcost = 0;
    fcost += count;
    if (fcost < choice.cost) choice = {.k = fk, .zero_flags = true, .cost = fcost};
  }
  return choice;
}

}  // namespace trainwatch::codec
