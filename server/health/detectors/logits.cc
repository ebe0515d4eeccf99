// Logit trend detectors (docs/detectors.md): AttentionLogitGrowth (max attention
// logit against a cap, its baseline and its forecast) and LogZDrift (log Z
// against its baseline and its forecast). They read the lead stream only (OnStep).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"

namespace trainwatch {
namespace {

// Steps until a forecast crossing, if the trend forecasts one.
std::optional<uint64_t> StepsUntil(std::optional<uint64_t> at, uint64_t step) {
  if (!at.has_value()) return std::nullopt;
  return *at > step ? *at - step : 0;
}

// Catches attention logits blowing up (query/key norm growth), by three
// rules with one hysteresis: any max_attn_logit >= attention.cap (holds while
// values stay above resolve_ratio x cap); a level attention.ratio x its
// baseline or more, named by a CUSUM on the log logit (LevelShiftDetector);
// and a robust trend (RunHealth's Theil-Sen) forecast to reach the cap within
// attention.horizon_steps, which warns before the crossing (holds while the
// forecast stays within horizon / resolve_ratio).
class AttentionLogitGrowth final : public Detector {
 public:
  explicit AttentionLogitGrowth(const HealthConfig& config)
      : shift_(LevelOptions(config, std::log(config.attention.ratio), false)),
        hysteresis_(config.resolve_after_steps) {}

  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    // +Inf is data past any cap (the cap rule fires); it stays out of the
    // level test and the trend, which take finite logits only.
    if (!r.has_max_attn_logit() || std::isnan(r.max_attn_logit())) return;
    const auto& cfg = ctx.config.attention;
    const double resolve = ctx.config.change.resolve_ratio;
    const uint64_t step = r.step();
    const double logit = r.max_attn_logit();
    const bool cap_fires = logit >= cfg.cap;
    const bool cap_holds = logit >= resolve * cfg.cap;
    std::optional<LevelShiftDetector::Result> level;
    std::optional<uint64_t> until;
    if (ctx.post_warmup && std::isfinite(logit)) {
      if (logit > 0) level = shift_.Add(step, std::log(logit));
      until = StepsUntil(ctx.trends.max_attn_logit.StepReaching(cfg.cap), step);
    }
    const bool level_fires = level.has_value() && level->fired_now;
    const bool level_holds = level.has_value() && level->holds;
    const bool forecast_fires = until.has_value() && *until <= cfg.horizon_steps;
    const bool forecast_holds =
        until.has_value() && *until <= cfg.horizon_steps / resolve;
    const bool holds =
        hysteresis_.Update(step, cap_fires || level_fires || forecast_fires,
                           cap_holds || level_holds || forecast_holds);
    sink.Condition(AlertKind::kAttentionLogitGrowth, step, holds, logit, [&] {
      // The rule that fired; after a restart's replay, one that still holds.
      if (cap_fires || (cap_holds && !level_holds && !until.has_value())) {
        return AlertText{
            absl::StrFormat("Attention logit %.4g at step %d", logit, step),
            absl::StrFormat("max attention logit %.4g at step %d is at or "
                            "above the cap %g (cap rule)",
                            logit, step, cfg.cap)};
      }
      if (level_fires || level_holds || !until.has_value()) {
        const double base = std::exp(shift_.baseline()->median);
        const double ratio = std::exp(level->level) / base;
        return AlertText{
            absl::StrFormat("Attention logits grew %.1fx since step %d", ratio,
                            level->onset_step),
            absl::StrFormat(
                "the max attention logit's level since step %d (the change "
                "point) is %.4g, %.2fx its baseline median %.4g (growth rule, "
                ">= %gx; sequential test, ARL0 %g steps)",
                level->onset_step, std::exp(level->level), ratio, base,
                cfg.ratio, ctx.config.change.arl0),
            level->onset_step};
      }
      const TrendForecaster::Trend& t = *ctx.trends.max_attn_logit.trend();
      return AlertText{
          absl::StrFormat("Attention logit forecast to reach %g at step %d",
                          cfg.cap, step + *until),
          absl::StrFormat(
              "the max attention logit's trend (Theil-Sen over its last "
              "~1000 values) is %.4g at step %d and rising %.3g per 1000 "
              "steps: it reaches the cap %g at step %d, within the %d-step "
              "horizon (forecast rule)",
              t.level, t.step, 1000 * t.slope, cfg.cap, step + *until,
              cfg.horizon_steps)};
    });
  }

  void OnRewind(uint64_t step) override { shift_.RewindTo(step); }

 private:
  LevelShiftDetector shift_;
  Hysteresis hysteresis_;
};

// Catches output logits growing without bound, by two rules with one
// hysteresis: log Z's level log_z.nats or more from its baseline and away
// from 0 (its distance from 0 grew by that much), named by a two-sided CUSUM
// (LevelShiftDetector, in nats); and a robust trend forecast to get that far
// out within log_z.horizon_steps. Only movement counts: a healthy run without
// z-loss sits near log V. A move toward 0 is what z-loss does on purpose (it
// pulls log Z from ~log V to 0), not a drift.
class LogZDrift final : public Detector {
  static LevelShiftDetector::Options LogZLevelOptions(const HealthConfig& config) {
    LevelShiftDetector::Options options = LevelOptions(config, config.log_z.nats, true);
    options.baseline_steps = config.log_z.baseline_steps;
    return options;
  }

 public:
  explicit LogZDrift(const HealthConfig& config)
      : shift_(LogZLevelOptions(config)), hysteresis_(config.resolve_after_steps) {}

  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    if (!ctx.post_warmup || !r.has_log_z() || !std::isfinite(r.log_z())) {
      return;
    }
    const auto& cfg = ctx.config.log_z;
    const double resolve = ctx.config.change.resolve_ratio;
    const uint64_t step = r.step();
    std::optional<LevelShiftDetector::Result> level = shift_.Add(step, r.log_z());
    if (!level.has_value()) return;  // the baseline is being taken
    const double base = shift_.baseline()->median;
    // Away from 0: up from a positive baseline, down from a negative one.
    const auto outward = [&](double level) { return base >= 0 ? level > base : level < base; };
    const TrendForecaster& trend = ctx.trends.log_z;
    const std::optional<uint64_t> until =
        StepsUntil(OutwardCrossing(trend, base, cfg.nats), step);
    // A level shift toward 0 (z-loss at work) does not count.
    if (!outward(level->level)) {
      level->fired_now = false;
      level->holds = false;
    }
    const bool forecast_fires = until.has_value() && *until <= cfg.horizon_steps;
    const bool forecast_holds =
        until.has_value() && *until <= cfg.horizon_steps / resolve;
    const bool holds = hysteresis_.Update(step, level->fired_now || forecast_fires,
                                          level->holds || forecast_holds);
    const double drift = level->level - base;
    sink.Condition(AlertKind::kLogZDrift, step, holds, std::abs(drift), [&] {
      if (level->fired_now || level->holds || !until.has_value()) {
        return AlertText{
            absl::StrFormat("log Z moved %.1f nats since step %d",
                            std::abs(drift), level->onset_step),
            absl::StrFormat(
                "log Z's level since step %d (the change point) is %.3g, "
                "%.2f nats %s its baseline median %.3g (>= %g nats away "
                "from 0; sequential test, ARL0 %g steps)",
                level->onset_step, level->level, std::abs(drift),
                drift > 0 ? "above" : "below", base, cfg.nats,
                ctx.config.change.arl0),
            level->onset_step};
      }
      const TrendForecaster::Trend& t = *trend.trend();
      return AlertText{
          absl::StrFormat("log Z forecast to move %g nats by step %d", cfg.nats,
                          step + *until),
          absl::StrFormat(
              "log Z's trend (Theil-Sen over its last ~1000 values) is %.3g "
              "at step %d, moving %.3g nats per 1000 steps from its baseline "
              "median %.3g: %g nats away at step %d, within the %d-step "
              "horizon (forecast rule)",
              t.level, t.step, 1000 * t.slope, base, cfg.nats, step + *until,
              cfg.horizon_steps)};
    });
  }

  void OnRewind(uint64_t step) override { shift_.RewindTo(step); }
  std::optional<double> LogZBaseline() const override {
    if (!shift_.baseline().has_value()) return std::nullopt;
    return shift_.baseline()->median;
  }

 private:
  LevelShiftDetector shift_;
  Hysteresis hysteresis_;
};

}  // namespace

std::unique_ptr<Detector> MakeAttentionLogitGrowth(const HealthConfig& config) {
  return std::make_unique<AttentionLogitGrowth>(config);
}

std::unique_ptr<Detector> MakeLogZDrift(const HealthConfig& config) {
  return std::make_unique<LogZDrift>(config);
}

}  // namespace trainwatch
