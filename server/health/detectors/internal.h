// What the detector files share: the factories MakeDetectors() (detectors/registry.cc)
// calls, and the change-detection helpers the level detectors use.
#ifndef TRAINWATCH_SERVER_HEALTH_DETECTORS_INTERNAL_H_
#define TRAINWATCH_SERVER_HEALTH_DETECTORS_INTERNAL_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "health/detector.h"
#include "health/signals/change_detection.h"

namespace trainwatch {

using Detectors = std::vector<std::unique_ptr<Detector>>;

// detectors/clipping.cc: the clip fraction and the post-clip norm.
std::unique_ptr<Detector> MakeClipFractionHigh(const HealthConfig& config);
std::unique_ptr<Detector> MakePostClipNormReported(const HealthConfig& config);

// detectors/grad_norm.cc: spikes and drift of the gradient norm.
std::unique_ptr<Detector> MakeGradNormSpike(const HealthConfig& config);
std::unique_ptr<Detector> MakeGradNormDrift(const HealthConfig& config);

// detectors/logits.cc: attention logits and log Z.
std::unique_ptr<Detector> MakeAttentionLogitGrowth(const HealthConfig& config);
std::unique_ptr<Detector> MakeLogZDrift(const HealthConfig& config);

// detectors/baseline.cc: BaselineDeviation, against the reference runs.
std::unique_ptr<Detector> MakeBaselineDeviation(const HealthConfig& config);

// detectors/loss.cc: LossSpike.
std::unique_ptr<Detector> MakeLossSpike(const HealthConfig& config);

// detectors/fp16.cc: LossScaleCollapse, SkipRateHigh, ScalerStuck,
// ClipBeforeUnscale, Fp16WithoutScaler; it also places NonFiniteUpdate (any
// precision) where it always ran among them, so that a step's transitions
// keep their order.
void AddFp16Detectors(const HealthConfig& config, Detectors* out);
// detectors/nonfinite.cc: NonFiniteUpdate.
std::unique_ptr<Detector> MakeNonFiniteUpdate(const HealthConfig& config);

// detectors/ranks.cc: RankNormMismatch, ShardNormMismatch.
// detectors/layers.cc: AdamStaleSecondMoment, LayerUpdateStall.
void AddRankDetectors(const HealthConfig& config, Detectors* out);
void AddLayerDetectors(const HealthConfig& config, Detectors* out);
void AddMoeDetectors(const HealthConfig& config, Detectors* out);

// detectors/fp8.cc: Fp8ScaleMismatch, Fp8AmaxGrowth, Fp8Overflow,
// Fp8Underflow (lead), Fp8AmaxDesync (across ranks).
void AddFp8Detectors(const HealthConfig& config, Detectors* out);
// detectors/hazard.cc: SpikeHazard.
std::unique_ptr<Detector> MakeSpikeHazard(const HealthConfig& config);
std::unique_ptr<Detector> MakeFp8AmaxDesync(const HealthConfig& config);

// detectors/timing.cc: RankStraggler (across ranks), InputPipelineStall
// (lead), RunSilent (clock).
std::unique_ptr<Detector> MakeRankStraggler(const HealthConfig& config);
std::unique_ptr<Detector> MakeInputPipelineStall(const HealthConfig& config);
std::unique_ptr<Detector> MakeRunSilent(const HealthConfig& config);

// The least and largest finite value of one field over the ranks that
// reported a step, with the reports that gave them (Report has a `rank`).
// Ties go to the lower rank, so neither a cross-rank verdict nor its text
// depends on the order the ranks' records arrive in. Value: the stored
// width (float keeps a step's digest small).
template <typename Report, typename Value = double>
struct RankExtremes {
  Report lo, hi;
  Value lo_value = 0, hi_value = 0;
  bool any = false;

  void Take(const Report& r, Value v) {
    // Non-finite values (an fp16 overflow) have nothing to compare.
    if (!std::isfinite(v)) return;
    if (!any || v < lo_value || (v == lo_value && r.rank < lo.rank)) {
      lo = r;
      lo_value = v;
    }
    if (!any || v > hi_value || (v == hi_value && r.rank < hi.rank)) {
      hi = r;
      hi_value = v;
    }
    any = true;
  }
  // (max - min) / max(|max|, |min|); 0 when equal or nothing was taken.
  double Spread() const {
    if (!any) return 0.0;
    const double lo_d = lo_value, hi_d = hi_value;
    return (hi_d - lo_d) / std::max({std::abs(lo_d), std::abs(hi_d), 1e-30});
  }
};

// A rate alert (the clipped or the skipped share of post-warmup steps): a
// Bernoulli CUSUM names a jump of the rate within tens of steps, and the
// share over the window W (above the threshold once W holds min_steps)
// catches a rate that creeps up. Once firing, whichever rule fired it, the
// alert holds until the rate is clearly below (hysteresis): the window's
// share at most resolve_ratio x threshold, the CUSUM's downward test done,
// and RateFallTest convinced; then it resolves after resolve_after_steps
// without holding. A rate hovering at its threshold is one alert.
class RateAlert {
 public:
  RateAlert(const HealthConfig& config, double threshold);

  struct State {
    bool holds = false;
    bool by_change = false;   // the CUSUM named it (else the window)
    uint64_t onset_step = 0;  // the CUSUM's change point
    double rate_since = 0.0;  // flagged share since the change point
  };
  // One post-warmup step; `window` already holds its flag.
  State Add(uint64_t step, bool flagged, const FlagSeries& window,
            uint32_t min_steps);
  void Reset();
  // True from a fire until resolve_after_steps pass without the condition
  // holding: while the alert tracker shows the episode as firing.
  bool firing() const { return hysteresis_.firing(); }

 private:
  double threshold_;
  double resolve_ratio_;
  RateShiftDetector change_;
  RateFallTest fall_;  // restarted at each fire
  Hysteresis hysteresis_;
  State last_fire_;
};

// The end-of-schedule allowance of GradNormDrift and ClipFractionHigh (not
// drift): while the LR is below drift.lr_decay_fraction of its peak, the norm
// may rise like sqrt(fraction x peak / lr), as the steady-state norm under
// AdamW grows like sqrt(wd / lr) while a schedule decays to its floor.
class LrAllowance {
 public:
  // Takes in every lead record (warmup included: the peak); returns the log
  // of the allowed rise at this record (0 while the LR is high).
  double Update(const v1::StepRecord& r, double fraction);
  double peak_lr() const { return peak_lr_; }

 private:
  double peak_lr_ = 0.0;
};

// "<prefix>name value, ..." for the first `most` named values, then "and N
// more": the layers (or tensors) a description names.
std::string NameLayers(const std::vector<std::pair<std::string, double>>& layers,
                       size_t most, std::string_view prefix = "");

// The options of a LevelShiftDetector for a shift of `shift` (in the
// signal's units), from the config's change-detection parameters.
LevelShiftDetector::Options LevelOptions(const HealthConfig& config,
                                         double shift, bool two_sided);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_DETECTORS_INTERNAL_H_
