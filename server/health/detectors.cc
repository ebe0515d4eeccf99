#include <algorithm>

#include "health/detector.h"
#include "health/detectors_internal.h"

namespace trainwatch {

std::vector<std::unique_ptr<Detector>> MakeDetectors(const HealthConfig& config) {
  // The order is the order in which a step's transitions are reported.
  Detectors out;
  out.push_back(MakeClipFractionHigh(config));
  out.push_back(MakeGradNormSpike(config));
  out.push_back(MakeGradNormDrift(config));
  out.push_back(MakePostClipNormReported(config));
  out.push_back(MakeAttentionLogitGrowth(config));
  out.push_back(MakeLogZDrift(config));
  AddFp16Detectors(config, &out);
  AddRankDetectors(config, &out);
  AddLayerDetectors(config, &out);
  return out;
}

std::optional<double> MedianPastBaseline(const StepContext& ctx,
                                         const OrderStatWindow& series,
                                         const std::optional<double>& baseline,
                                         size_t min_slots) {
  if (!ctx.post_warmup || !baseline.has_value() ||
      ctx.record.step() <= ctx.baselines.through_step ||
      series.slots() < min_slots) {
    return std::nullopt;
  }
  return series.Median();
}

size_t TrendSlots(const HealthConfig& config) {
  constexpr size_t kMinTrendSlots = 100;
  return std::min<size_t>(config.window_steps, kMinTrendSlots);
}

}  // namespace trainwatch
