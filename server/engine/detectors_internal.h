// Factories of the detector groups; MakeDetectors() (detectors.cc) calls them.
#ifndef TRAINWATCH_SERVER_ENGINE_DETECTORS_INTERNAL_H_
#define TRAINWATCH_SERVER_ENGINE_DETECTORS_INTERNAL_H_

#include <memory>
#include <vector>

#include "engine/detector.h"

namespace trainwatch {

using Detectors = std::vector<std::unique_ptr<Detector>>;

// detectors_norm.cc: ClipFractionHigh, GradNormSpike, GradNormDrift,
// PostClipNormReported, AttentionLogitGrowth, LogZDrift.
void AddNormDetectors(const HealthConfig& config, Detectors* out);

// detectors_fp16.cc: LossScaleCollapse, SkipRateHigh, ScalerStuck,
// NonFiniteUpdate, ClipBeforeUnscale, Fp16WithoutScaler.
void AddFp16Detectors(const HealthConfig& config, Detectors* out);

// detectors_ranks.cc: RankNormMismatch, ShardNormMismatch.
// detectors_layers.cc: AdamStaleSecondMoment, LayerUpdateStall.
void AddRankDetectors(const HealthConfig& config, Detectors* out);
void AddLayerDetectors(const HealthConfig& config, Detectors* out);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ENGINE_DETECTORS_INTERNAL_H_
