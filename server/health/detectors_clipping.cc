// Clipping detectors (DESIGN.md §4): ClipFractionHigh (the clip fraction:
// too many steps clipped) and PostClipNormReported (the reported norm is the
// post-clip one). They read the lead stream only (OnStep).
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_format.h"
#include "health/detectors_internal.h"

namespace trainwatch {
namespace {

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

}  // namespace

std::unique_ptr<Detector> MakeClipFractionHigh(const HealthConfig&) {
  return std::make_unique<ClipFractionHigh>();
}

std::unique_ptr<Detector> MakePostClipNormReported(const HealthConfig& config) {
  return std::make_unique<PostClipNormReported>(config);
}

}  // namespace trainwatch
