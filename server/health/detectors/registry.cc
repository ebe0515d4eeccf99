#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "health/detector.h"
#include "health/detectors/internal.h"

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
  // After GradNormSpike: a spike at a loss spike's steps is its consequence.
  out.push_back(MakeLossSpike(config));
  AddFp16Detectors(config, &out);
  AddLayerDetectors(config, &out);
  out.push_back(MakeSpikeHazard(config));
  AddFp8Detectors(config, &out);
  AddMoeDetectors(config, &out);
  out.push_back(MakeInputPipelineStall(config));
  // After LossSpike and LossDivergence, its causes at the same steps.
  out.push_back(MakeBaselineDeviation(config));
  return out;
}

std::vector<std::unique_ptr<Detector>> MakeRankDetectors(
    const HealthConfig& config) {
  Detectors out;
  AddRankDetectors(config, &out);
  out.push_back(MakeFp8AmaxDesync(config));
  // Last: the step-time levels move after the norm checks judged the steps.
  out.push_back(MakeRankStraggler(config));
  return out;
}

std::vector<std::unique_ptr<Detector>> MakeClockDetectors(
    const HealthConfig& config) {
  Detectors out;
  out.push_back(MakeRunSilent(config));
  return out;
}

RateAlert::RateAlert(const HealthConfig& config, double threshold)
    : threshold_(threshold),
      resolve_ratio_(config.change.resolve_ratio),
      change_(RateShiftDetector::Options{
          .threshold = threshold,
          .resolve_ratio = config.change.resolve_ratio,
          .arl0 = config.change.arl0,
          .resolve_after_steps = config.resolve_after_steps}),
      fall_(threshold, config.change.resolve_ratio, config.change.arl0),
      hysteresis_(config.resolve_after_steps) {}

RateAlert::State RateAlert::Add(uint64_t step, bool flagged,
                                const FlagSeries& window, uint32_t min_steps) {
  const RateShiftDetector::Result c = change_.Add(step, flagged);
  const bool full = window.size() >= min_steps;
  const bool window_fires = full && window.fraction() > threshold_;
  const bool window_holds =
      full && window.fraction() > resolve_ratio_ * threshold_;
  const bool was_firing = hysteresis_.firing();
  if (!was_firing) fall_.Restart();  // its evidence counts from the fire
  const bool fallen = fall_.Add(step, flagged);
  State out;
  out.holds = hysteresis_.Update(step, c.fired_now || window_fires,
                                 c.holds || window_holds || !fallen);
  if (out.holds && !was_firing) {
    last_fire_ = State{.holds = true,
                       .by_change = c.fired_now,
                       .onset_step = c.fired_now ? c.onset_step : 0,
                       .rate_since = c.rate};
  }
  if (out.holds) {
    out = last_fire_;
    out.rate_since = c.holds ? c.rate : last_fire_.rate_since;
  }
  return out;
}

void RateAlert::Reset() {
  change_.Reset();
  fall_.Restart();
  hysteresis_.Reset();
}

double LrAllowance::Update(const v1::StepRecord& r, double fraction) {
  if (!r.has_lr() || !std::isfinite(r.lr()) || !(r.lr() > 0)) return 0.0;
  peak_lr_ = std::max(peak_lr_, r.lr());
  const double floor_lr = fraction * peak_lr_;
  return r.lr() < floor_lr ? 0.5 * std::log(floor_lr / r.lr()) : 0.0;
}

std::string NameLayers(const std::vector<std::pair<std::string, double>>& layers,
                       size_t most, std::string_view prefix) {
  std::string out;
  for (size_t i = 0; i < layers.size() && i < most; ++i) {
    if (i > 0) out += ", ";
    absl::StrAppendFormat(&out, "%s%s %.3g", prefix, layers[i].first, layers[i].second);
  }
  if (layers.size() > most) absl::StrAppendFormat(&out, " and %d more", layers.size() - most);
  return out;
}

LevelShiftDetector::Options LevelOptions(const HealthConfig& config,
                                         double shift, bool two_sided) {
  return LevelShiftDetector::Options{
      .shift = shift,
      .resolve_ratio = config.change.resolve_ratio,
      .arl0 = config.change.arl0,
      .min_steps = config.change.min_steps,
      .baseline_steps = config.window_steps,
      .resolve_after_steps = config.resolve_after_steps,
      .two_sided = two_sided};
}

}  // namespace trainwatch
