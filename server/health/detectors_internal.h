// What the detector files share: the factories MakeDetectors() (detectors.cc)
// calls, and the baseline comparison the trend detectors use.
#ifndef TRAINWATCH_SERVER_HEALTH_DETECTORS_INTERNAL_H_
#define TRAINWATCH_SERVER_HEALTH_DETECTORS_INTERNAL_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "health/detector.h"

namespace trainwatch {

using Detectors = std::vector<std::unique_ptr<Detector>>;

// detectors_clipping.cc: the clip fraction and the post-clip norm.
std::unique_ptr<Detector> MakeClipFractionHigh(const HealthConfig& config);
std::unique_ptr<Detector> MakePostClipNormReported(const HealthConfig& config);

// detectors_grad_norm.cc: spikes and drift of the gradient norm.
std::unique_ptr<Detector> MakeGradNormSpike(const HealthConfig& config);
std::unique_ptr<Detector> MakeGradNormDrift(const HealthConfig& config);

// detectors_logits.cc: attention logits and log Z.
std::unique_ptr<Detector> MakeAttentionLogitGrowth(const HealthConfig& config);
std::unique_ptr<Detector> MakeLogZDrift(const HealthConfig& config);

// detectors_fp16.cc: LossScaleCollapse, SkipRateHigh, ScalerStuck,
// NonFiniteUpdate, ClipBeforeUnscale, Fp16WithoutScaler.
void AddFp16Detectors(const HealthConfig& config, Detectors* out);

// detectors_ranks.cc: RankNormMismatch, ShardNormMismatch.
// detectors_layers.cc: AdamStaleSecondMoment, LayerUpdateStall.
void AddRankDetectors(const HealthConfig& config, Detectors* out);
void AddLayerDetectors(const HealthConfig& config, Detectors* out);

// The median of `series` when it may be compared with `baseline`: on a
// post-warmup step after the baseline's last step, with the baseline taken
// and at least `min_slots` values in the window.
std::optional<double> MedianPastBaseline(const StepContext& ctx,
                                         const OrderStatWindow& series,
                                         const std::optional<double>& baseline,
                                         size_t min_slots);

// The trend detectors (attention logits, log Z) compare a window median with
// a baseline only once the window holds this many values, or W when smaller.
size_t TrendSlots(const HealthConfig& config);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_DETECTORS_INTERNAL_H_
