#include "health/signals/moe_load.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace trainwatch {
namespace {

// LoadOf less effective_experts (left 0): its logs are most of LoadOf's
// cost, and Summarize(), which runs on every report besides the detector's
// LoadOf, needs the rest alone.
std::optional<MoeLayerLoad> SpreadOf(const v1::MoeLayerStats& layer) {
  const auto& counts = layer.tokens_per_expert();
  if (counts.empty()) return std::nullopt;
  MoeLayerLoad out;
  uint64_t max = 0;
  for (int i = 0; i < counts.size(); ++i) {
    out.total += counts[i];
    if (counts[i] == 0) ++out.dead;
    if (counts[i] > max) {
      max = counts[i];
      out.hottest = static_cast<uint32_t>(i);
    }
  }
  if (out.total == 0) return std::nullopt;
  const double total = static_cast<double>(out.total);
  const double mean = total / counts.size();
  out.max_over_mean = max / mean;
  out.max_share = max / total;
  return out;
}

}  // namespace

std::optional<MoeLayerLoad> LoadOf(const v1::MoeLayerStats& layer) {
  std::optional<MoeLayerLoad> out = SpreadOf(layer);
  if (!out.has_value()) return out;
  const auto& counts = layer.tokens_per_expert();
  const double total = static_cast<double>(out->total);
  // H = log T - sum(c log c) / T; logf: a 48 x 128 report takes 6k logs,
  // and the effective number needs three digits, not sixteen.
  double sum_c_log_c = 0.0;
  for (uint64_t c : counts) {
    if (c > 1) sum_c_log_c += static_cast<double>(c) * std::log(static_cast<float>(c));
  }
  out->effective_experts = std::exp(std::log(total) - sum_c_log_c / total);
  return out;
}

uint32_t ExpertsFor90(const v1::MoeLayerStats& layer, const MoeLayerLoad& load,
                      uint32_t at_most) {
  const auto& counts = layer.tokens_per_expert();
  const double e = counts.size();
  const auto size = static_cast<uint32_t>(counts.size());
  if (at_most >= size) at_most = size;
  if (at_most < e) {
    // The largest entropy with >= 90% on at_most experts: 0.9 spread evenly
    // over them, 0.1 over the rest (when the rest's share is the smaller).
    const double m = std::max<double>(at_most, 1);
    const double h = 0.9 * std::log(m / 0.9) + 0.1 * std::log((e - m) / 0.1);
    const double bound = 0.1 / (e - m) <= 0.9 / m ? std::exp(h) : e;
    // 1% over the bound: effective_experts is taken with float logs.
    if (load.effective_experts > 1.01 * bound) return at_most + 1;
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
    if (std::optional<MoeLayerLoad> load = SpreadOf(layer)) {
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
