// Logit trend detectors (DESIGN.md §4): AttentionLogitGrowth (max attention
// logit against a cap and its baseline) and LogZDrift (log Z against its
// baseline). They read the lead stream only (OnStep).
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/strings/str_format.h"
#include "health/detectors_internal.h"

namespace trainwatch {
namespace {

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

std::unique_ptr<Detector> MakeAttentionLogitGrowth(const HealthConfig&) {
  return std::make_unique<AttentionLogitGrowth>();
}

std::unique_ptr<Detector> MakeLogZDrift(const HealthConfig&) {
  return std::make_unique<LogZDrift>();
}

}  // namespace trainwatch
