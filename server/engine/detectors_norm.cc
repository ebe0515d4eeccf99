// The detectors that read the lead stream's gradient norm, and the two trend
// detectors built the same way (attention logits, log Z): DESIGN.md §4.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_format.h"
#include "engine/detectors_internal.h"

namespace trainwatch {
namespace {

// The trend detectors compare a window median with a baseline only once the
// window holds this many values (or W, when W is smaller).
constexpr size_t kMinTrendSlots = 100;

// The median of `series` when it may be compared with `baseline`: on a
// post-warmup step after the baseline's last step, with the baseline taken
// and at least `min_slots` values in the window.
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
  return std::min<size_t>(config.window_steps, kMinTrendSlots);
}

// Catches a clip threshold that has turned into a lower learning rate: holds
// while more than clip_fraction.threshold of the last W post-warmup steps were
// clipped, once W holds clip_fraction.min_steps steps.
class ClipFractionHigh final : public Detector {
 public:
  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    if (!ctx.post_warmup) return;
    const FlagSeries& clipped = ctx.window.clipped;
    const auto& cfg = ctx.config.clip_fraction;
    const double fraction = clipped.fraction();
    const bool holds =
        clipped.size() >= cfg.min_steps && fraction > cfg.threshold;
    sink.Condition(
        AlertKind::kClipFractionHigh, ctx.record.step(), holds, fraction, [&] {
          std::string description = absl::StrFormat(
              "%d of the last %d post-warmup steps clipped "
              "(%.1f%% > %.1f%%) at max_norm %g",
              clipped.count(), clipped.size(), 100 * fraction,
              100 * cfg.threshold, ctx.run.max_norm);
          // Same definition as RunHealth::RecommendedMaxNorm().
          if (auto p98 = ctx.window.grad_norm.Quantile(0.98)) {
            absl::StrAppendFormat(&description,
                                  "; recommended max_norm (p98) %.3g", *p98);
          }
          return AlertText{
              absl::StrFormat("Clipping on %.1f%% of steps", 100 * fraction),
              std::move(description)};
        });
  }
};

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

// Catches a typical norm that keeps growing (sharpness, an LR too high for
// the phase): holds while the median over a full window of W post-warmup
// steps is at least drift.ratio times the baseline median.
class GradNormDrift final : public Detector {
 public:
  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const std::optional<double>& baseline = ctx.baselines.grad_norm_median;
    std::optional<double> median = MedianPastBaseline(
        ctx, ctx.window.grad_norm, baseline, ctx.config.window_steps);
    if (!median.has_value() || *baseline <= 0) return;
    const double ratio = *median / *baseline;
    sink.Condition(
        AlertKind::kGradNormDrift, ctx.record.step(),
        ratio >= ctx.config.drift.ratio, ratio, [&] {
          return AlertText{
              absl::StrFormat("Median gradient norm is %.1fx its baseline",
                              ratio),
              absl::StrFormat(
                  "median grad norm over the last %d post-warmup steps is "
                  "%.3g, %.2fx the baseline median %.3g (first %d "
                  "post-warmup steps, through step %d)",
                  ctx.window.grad_norm.slots(), *median, ratio, *baseline,
                  ctx.config.window_steps, ctx.baselines.through_step)};
        });
  }
};

// Catches a trainer that logs the post-clip norm: over at least
// post_clip.min_steps post-warmup steps no norm exceeds max_norm and a pile of
// them (post_clip.min_pile, and post_clip.pile_fraction of the window) sits
// at max_norm. "At max_norm" allows clip_grad_norm_'s 1e-6 in
// max_norm / (norm + 1e-6) and fp32 round-off of the recomputed norm.
class PostClipNormReported final : public Detector {
 public:
  explicit PostClipNormReported(const HealthConfig& config)
      : at_max_norm_(config.window_steps) {}

  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    if (!ctx.post_warmup) return;
    const double max_norm = ctx.run.max_norm;
    const double tolerance = kRelativeTolerance * max_norm + kClipEpsilon;
    // Kept in step with ctx.window.grad_norm: same steps, same length.
    at_max_norm_.Push(ctx.record.step(),
                      max_norm > 0 && std::abs(ctx.record.grad_norm() -
                                               max_norm) <= tolerance);
    const OrderStatWindow& norms = ctx.window.grad_norm;
    const auto& cfg = ctx.config.post_clip;
    if (max_norm <= 0 || norms.slots() < cfg.min_steps) return;
    std::optional<double> largest = norms.Max();
    if (!largest.has_value()) return;
    const size_t pile = at_max_norm_.count();
    const double share = at_max_norm_.fraction();
    const bool holds = *largest <= max_norm + tolerance &&
                       pile >= cfg.min_pile && share >= cfg.pile_fraction;
    sink.Condition(
        AlertKind::kPostClipNormReported, ctx.record.step(), holds, share, [&] {
          return AlertText{
              "Reported gradient norms look post-clip",
              absl::StrFormat(
                  "none of the last %d post-warmup norms exceeds max_norm %g "
                  "(largest %.7g) and %d of them (%.1f%%) sit at max_norm: "
                  "the post-clip norm is being reported",
                  norms.slots(), max_norm, *largest, pile, 100 * share)};
        });
  }

  void OnRewind(uint64_t step) override { at_max_norm_.RewindTo(step); }

 private:
  static constexpr double kRelativeTolerance = 1e-5;
  static constexpr double kClipEpsilon = 1e-6;

  FlagWindow at_max_norm_;
};

// Catches attention logits blowing up (query/key norm growth): holds on any
// max_attn_logit >= attention.cap, or while the window median is at least
// attention.ratio times the baseline median.
class AttentionLogitGrowth final : public Detector {
 public:
  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    if (!ctx.record.has_max_attn_logit()) return;
    const auto& cfg = ctx.config.attention;
    const uint64_t step = ctx.record.step();
    const double logit = ctx.record.max_attn_logit();
    if (logit >= cfg.cap) {
      sink.Condition(AlertKind::kAttentionLogitGrowth, step, true, logit, [&] {
        return AlertText{
            absl::StrFormat("Attention logit %.4g at step %d", logit, step),
            absl::StrFormat("max attention logit %.4g at step %d is at or "
                            "above the cap %g (cap rule)",
                            logit, step, cfg.cap)};
      });
      return;
    }
    const std::optional<double>& baseline = ctx.baselines.max_attn_logit_median;
    std::optional<double> median = MedianPastBaseline(
        ctx, ctx.window.max_attn_logit, baseline, TrendSlots(ctx.config));
    if (!median.has_value() || *baseline <= 0) return;
    const double ratio = *median / *baseline;
    sink.Condition(
        AlertKind::kAttentionLogitGrowth, step, ratio >= cfg.ratio, *median,
        [&] {
          return AlertText{
              absl::StrFormat("Attention logits grew %.1fx", ratio),
              absl::StrFormat(
                  "median max attention logit over the last %d post-warmup "
                  "values is %.4g, %.2fx its baseline median %.4g (growth "
                  "rule, >= %gx)",
                  ctx.window.max_attn_logit.slots(), *median, ratio, *baseline,
                  cfg.ratio)};
        });
  }
};

// Catches output logits growing or shrinking without bound: holds while the
// window median of log Z is log_z.nats or more from its baseline, either
// way. Only movement counts: a healthy run without z-loss sits near log V.
class LogZDrift final : public Detector {
 public:
  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    if (!ctx.record.has_log_z()) return;
    const std::optional<double>& baseline = ctx.baselines.log_z_median;
    std::optional<double> median = MedianPastBaseline(
        ctx, ctx.window.log_z, baseline, TrendSlots(ctx.config));
    if (!median.has_value()) return;
    const double drift = *median - *baseline;
    sink.Condition(
        AlertKind::kLogZDrift, ctx.record.step(),
        std::abs(drift) >= ctx.config.log_z.nats, std::abs(drift), [&] {
          return AlertText{
              absl::StrFormat("log Z moved %.1f nats from its baseline",
                              std::abs(drift)),
              absl::StrFormat(
                  "median log Z over the last %d post-warmup values is %.3g, "
                  "%.2f nats %s its baseline median %.3g (>= %g nats either "
                  "way)",
                  ctx.window.log_z.slots(), *median, std::abs(drift),
                  drift > 0 ? "above" : "below", *baseline,
                  ctx.config.log_z.nats)};
        });
  }
};

}  // namespace

void AddNormDetectors(const HealthConfig& config, Detectors* out) {
  out->push_back(std::make_unique<ClipFractionHigh>());
  out->push_back(std::make_unique<GradNormSpike>());
  out->push_back(std::make_unique<GradNormDrift>());
  out->push_back(std::make_unique<PostClipNormReported>(config));
  out->push_back(std::make_unique<AttentionLogitGrowth>());
  out->push_back(std::make_unique<LogZDrift>());
}

}  // namespace trainwatch
