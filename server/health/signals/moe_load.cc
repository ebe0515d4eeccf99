#include "health/signals/moe_load.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>

namespace trainwatch {

std::optional<MoeLayerLoad> LoadOf(const v1::MoeLayerStats& layer) {
  const auto& counts = layer.tokens_per_expert();
  if (counts.empty()) return std::nullopt;
  // Without branches on the counts (a 48 x 128 report is 6k of them, read
  // for /metrics and again by the detectors).
  MoeLayerLoad out;
  uint64_t max = 0;
  uint32_t dead = 0;
  for (const uint64_t c : counts) {
    out.total += c;
    dead += c == 0 ? 1 : 0;
    max = std::max(max, c);
  }
  if (out.total == 0) return std::nullopt;
  out.dead = dead;
  out.max = max;
  out.max_over_mean = max / (static_cast<double>(out.total) / counts.size());
  return out;
}

namespace {

// An upper bound on what the `m` busiest experts carry, from one pass: the
// counts in kBuckets buckets of equal width up to the largest, each bucket
// counted at its top. Over by at most m x (max + 1) / kBuckets.
constexpr int kBuckets = 32;

uint64_t TopAtMost(const v1::MoeLayerStats& layer, uint64_t max, uint32_t m) {
  std::array<uint32_t, kBuckets> in{};
  // c < max + 1, so c * kBuckets / (max + 1) < kBuckets: in doubles,
  // exact enough (a bucket off by one near its edge is met by the +1 below).
  // Signed conversions (one instruction each; the caller keeps max < 2^62).
  const double scale = kBuckets / (static_cast<double>(max) + 1.0);
  for (const uint64_t c : layer.tokens_per_expert()) {
    const auto b = static_cast<int64_t>(static_cast<double>(static_cast<int64_t>(c)) * scale);
    ++in[static_cast<size_t>(std::min<int64_t>(kBuckets - 1, b))];
  }
  const double width = (static_cast<double>(max) + 1.0) / kBuckets;
  double bound = 0;
  for (int b = kBuckets - 1; b >= 0 && m > 0; --b) {
    const uint32_t take = std::min(m, in[b]);
    // The bucket's top, and one more for the doubles' rounding.
    bound += take * std::min(static_cast<double>(max), (b + 1) * width + 1.0);
    m -= take;
  }
  return static_cast<uint64_t>(std::ceil(bound));
}

}  // namespace

uint32_t ExpertsFor90(const v1::MoeLayerStats& layer, const MoeLayerLoad& load,
                      uint32_t at_most) {
  const auto& counts = layer.tokens_per_expert();
  const auto size = static_cast<uint32_t>(counts.size());
  if (at_most >= size) at_most = size;
  // When even a bound on what the at_most busiest carry is under 90%, more
  // carry it: at_most x the hottest's (free: a healthy layer ends here),
  // else the buckets' bound.
  if (at_most < size && load.max < (uint64_t{1} << 62)) {
    const unsigned __int128 total9 = static_cast<unsigned __int128>(9) * load.total;
    if (static_cast<unsigned __int128>(10) * at_most * load.max < total9 ||
        static_cast<unsigned __int128>(10) * TopAtMost(layer, load.max, at_most) < total9) {
      return at_most + 1;
    }
  }
  std::vector<uint64_t> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  uint64_t acc = 0;
  uint32_t n = 0;
  for (uint64_t c : sorted) {
    acc += c;
    ++n;
    if (10 * acc >= 9 * load.total) break;
  }
  return n;
}

std::vector<uint64_t> BlockLoads(const v1::MoeLayerStats& layer, uint32_t ep_size) {
  const auto& counts = layer.tokens_per_expert();
  if (ep_size < 2 || counts.empty() || counts.size() % ep_size != 0) return {};
  const size_t per = counts.size() / ep_size;
  std::vector<uint64_t> blocks(ep_size, 0);
  for (int i = 0; i < counts.size(); ++i) blocks[i / per] += counts[i];
  return blocks;
}

MoeReportSummary Summarize(const v1::MoeStats& moe) {
  MoeReportSummary s;
  MoeDrops drops;
  const auto take_max = [](std::optional<double>& worst, double v) {
    if (!std::isfinite(v)) return;
    if (!worst.has_value() || v > *worst) worst = v;
  };
  for (const v1::MoeLayerStats& layer : moe.layers()) {
    if (std::optional<MoeLayerLoad> load = LoadOf(layer)) {
      take_max(s.load_max_over_mean, load->max_over_mean);
      s.dead_experts = s.dead_experts.value_or(0) + load->dead;
      drops.Add(layer, *load);
    }
    if (layer.has_aux_loss()) take_max(s.aux_loss, layer.aux_loss());
    if (layer.has_z_loss()) take_max(s.router_z_loss, layer.z_loss());
  }
  s.dropped_fraction = drops.fraction();
  return s;
}

}  // namespace trainwatch
