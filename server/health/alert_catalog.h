// Every alert trainwatch raises (docs/detectors.md): its name, severity, and what
// to tell the person it wakes up: the likely cause and the fix.
#ifndef TRAINWATCH_SERVER_HEALTH_ALERT_CATALOG_H_
#define TRAINWATCH_SERVER_HEALTH_ALERT_CATALOG_H_

#include <array>
#include <optional>
#include <string_view>

#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

enum class AlertKind {
  kClipFractionHigh,
  kGradNormSpike,
  kGradNormDrift,
  kLossScaleCollapse,
  kSkipRateHigh,
  kScalerStuck,
  kNonFiniteUpdate,
  kClipBeforeUnscale,
  kPostClipNormReported,
  kAttentionLogitGrowth,
  kLogZDrift,
  kRankNormMismatch,
  kShardNormMismatch,
  kFp16WithoutScaler,
  kAdamStaleSecondMoment,
  kLayerUpdateStall,
  kLossSpike,
  kRunSilent,
  kRankStraggler,
  kInputPipelineStall,
  // Server-wide (HostSuspectDetector, over every run's alerts); raised on the
  // run whose alert made its host suspect.
  kHostSuspect,
  // FP8 per-tensor scaling (detectors_fp8.cc).
  kFp8Overflow,
  kFp8Underflow,
  kFp8ScaleMismatch,
  kFp8AmaxDesync,
  kFp8AmaxGrowth,
  // The loss-spike early warning (detectors_hazard.cc).
  kSpikeHazard,
};
inline constexpr size_t kAlertKindCount = 27;

struct AlertSpec {
  AlertKind kind;
  std::string_view name;      // the alertname label
  // critical and warning page; info is recorded, exported and drawn, not
  // paged (the shipped Alertmanager routes).
  v1::Severity severity;
  std::string_view likely_cause;
  std::string_view fix;
};

const AlertSpec& Spec(AlertKind kind);
const std::array<AlertSpec, kAlertKindCount>& AllAlertSpecs();
std::optional<AlertKind> AlertKindByName(std::string_view name);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_ALERT_CATALOG_H_
