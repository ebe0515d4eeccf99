// Gradient norm detectors (docs/detectors.md): GradNormSpike (an isolated spike
// against an EMA) and GradNormDrift (the norm's level against its baseline,
// by change detection). They read the lead stream only (OnStep).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"

namespace trainwatch {
namespace {

// Catches an isolated gradient spike. Norms are close to lognormal, so it
// keeps an EMA of the mean and variance of post-warmup log norms, started
// from the first spike.min_steps finite norms (Welford), and flags
// log n >= m + sigmas*sd with n >= min_ratio*e^m, or n >= hard_ratio*e^m.
// Every log norm enters the EMA winsorized to m ± 3 sd, so a spike (or a
// near-zero norm) moves it no more than a 3-sd step would, and a lasting
// level shift is still followed within tens of steps.
class GradNormSpike final : public Detector {
 public:
  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const double norm = ctx.record.grad_norm();
    // Non-finite norms are NonFiniteUpdate's; a zero norm has no log.
    if (!ctx.post_warmup || !std::isfinite(norm) || norm <= 0) return;
    const auto& cfg = ctx.config.spike;
    const double x = std::log(norm);
    if (count_ < std::max<uint32_t>(cfg.min_steps, 1)) {
      Welford(x);
      return;
    }
    const double sd = std::max(std::sqrt(var_), kMinSd);
    const double sigmas = (x - mean_) / sd;
    const double ratio = std::exp(x - mean_);
    if ((sigmas >= cfg.sigmas && ratio >= cfg.min_ratio) ||
        ratio >= cfg.hard_ratio) {
      Report(sink, SpikeInfo{.step = ctx.record.step(),
                             .grad_norm = norm,
                             .ratio_to_ema = ratio,
                             .sigmas = sigmas,
                             .batch_ids = {ctx.record.batch_ids().begin(),
                                           ctx.record.batch_ids().end()}});
    }
    const double clamped =
        std::clamp(x, mean_ - kClampSd * sd, mean_ + kClampSd * sd);
    const double diff = clamped - mean_;
    const double increment = (1 - cfg.ema_beta) * diff;
    mean_ += increment;
    var_ = cfg.ema_beta * (var_ + diff * increment);
  }

  // The EMA is kept: it describes the run's typical norm, which a restart
  // from a checkpoint does not change.
  void OnRewind(uint64_t step) override {}

 private:
  // Log norms enter the EMA at most this many sd from its mean.
  static constexpr double kClampSd = 3.0;
  // The sd never counts as smaller than this (log space), so constant norms
  // give finite sigmas and the EMA can still move.
  static constexpr double kMinSd = 1e-6;

  void Welford(double x) {
    ++count_;
    const double delta = x - mean_;
    mean_ += delta / count_;
    m2_ += delta * (x - mean_);
    var_ = count_ > 1 ? m2_ / (count_ - 1) : 0.0;
  }

  static void Report(AlertSink& sink, const SpikeInfo& spike) {
    sink.Event(
        AlertKind::kGradNormSpike, spike.step, spike.grad_norm, spike.batch_ids,
        [&] {
          const double geo_mean = spike.grad_norm / spike.ratio_to_ema;
          return AlertText{
              absl::StrFormat("Gradient norm spike at step %d", spike.step),
              absl::StrFormat(
                  "grad norm %.3g at step %d is %.1fx the EMA geometric "
                  "mean %.3g (%.1f sd above in log space)",
                  spike.grad_norm, spike.step, spike.ratio_to_ema, geo_mean,
                  spike.sigmas)};
        });
    sink.Spike(spike);
  }

  uint32_t count_ = 0;  // finite post-warmup norms, up to spike.min_steps
  double mean_ = 0.0;   // of log norms: Welford, then EMA
  double m2_ = 0.0;     // Welford's sum of squared deviations
  double var_ = 0.0;
};

// Catches a typical norm that keeps growing or jumps (sharpness, an LR too
// high for the phase, a data change): a CUSUM on the log norm against its
// baseline (the first W post-warmup steps) names a level drift.ratio or more
// above it within tens of steps (LevelShiftDetector), and resolves with
// hysteresis. Not drift: while the LR decays below drift.lr_decay_fraction of
// its peak, the norm may rise like sqrt(fraction x peak / lr) (under AdamW
// the steady-state norm grows like sqrt(wd / lr) at the end of a schedule);
// that allowance is taken off the log norm first.
class GradNormDrift final : public Detector {
 public:
  explicit GradNormDrift(const HealthConfig& config)
      : shift_(LevelOptions(config, std::log(config.drift.ratio), false)) {}

  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    const double allowance =
        lr_.Update(r, ctx.config.drift.lr_decay_fraction);
    const double norm = r.grad_norm();
    if (!ctx.post_warmup || !std::isfinite(norm) || !(norm > 0)) return;
    std::optional<LevelShiftDetector::Result> s =
        shift_.Add(r.step(), std::log(norm) - allowance);
    if (!s.has_value()) return;
    const double base = std::exp(shift_.baseline()->median);
    const double ratio = std::exp(s->level) / base;
    sink.Condition(
        AlertKind::kGradNormDrift, r.step(), s->holds, ratio, [&] {
          std::string d = absl::StrFormat(
              "the grad norm's level since step %d (the change point) is "
              "%.3g, %.2fx the baseline median %.3g (first %d post-warmup "
              "steps); sequential test on the log norm, ARL0 %g steps",
              s->onset_step, std::exp(s->level), ratio, base,
              ctx.config.window_steps, ctx.config.change.arl0);
          if (auto median = ctx.window.grad_norm.Median()) {
            absl::StrAppendFormat(&d, "; median over the last %d steps %.3g",
                                  ctx.window.grad_norm.slots(), *median);
          }
          if (allowance > 0) {
            absl::StrAppendFormat(&d, " (LR at %.2g%% of its peak: %.2fx of "
                                  "the rise allowed)",
                                  100 * r.lr() / lr_.peak_lr(),
                                  std::exp(allowance));
          }
          return AlertText{
              absl::StrFormat("Gradient norm level %.1fx its baseline since "
                              "step %d",
                              ratio, s->onset_step),
              std::move(d), s->onset_step};
        });
  }

  void OnRewind(uint64_t step) override { shift_.RewindTo(step); }

 private:
  LevelShiftDetector shift_;
  LrAllowance lr_;
};

}  // namespace

std::unique_ptr<Detector> MakeGradNormSpike(const HealthConfig&) {
  return std::make_unique<GradNormSpike>();
}

std::unique_ptr<Detector> MakeGradNormDrift(const HealthConfig& config) {
  return std::make_unique<GradNormDrift>(config);
}

}  // namespace trainwatch
