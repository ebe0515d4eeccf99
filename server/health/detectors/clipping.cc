// Clipping detectors (docs/detectors.md): ClipFractionHigh (the clip fraction:
// too many steps clipped) and PostClipNormReported (the reported norm is the
// post-clip one). They read the lead stream only (OnStep).
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

// Catches a clip threshold that has turned into a lower learning rate: the
// clipped share of post-warmup steps above clip_fraction.threshold, named by
// RateAlert (a CUSUM for a jump, the window W for a creep; hysteresis).
// While the LR is below kLrFloor of its peak (a schedule at its floor), a
// step clipped only because of the benign end-of-schedule rise of the norm
// (LrAllowance) does not count, and the windowed rule waits. Above it,
// every clip counts: a norm creeping past max_norm mid-schedule is this
// alert's to name.
class ClipFractionHigh final : public Detector {
 public:
  explicit ClipFractionHigh(const HealthConfig& config)
      : rate_(config, config.clip_fraction.threshold) {}

  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    const double allowance = lr_.Update(
        r, std::min(kLrFloor, ctx.config.drift.lr_decay_fraction));
    if (!ctx.post_warmup) return;
    const FlagSeries& clipped = ctx.window.clipped;
    const auto& cfg = ctx.config.clip_fraction;
    // As RunHealth flags it: a skipped step applied no update, and a
    // non-finite norm is NonFiniteUpdate's.
    bool flag = Clipped(r);
    if (flag && allowance > 0 && ctx.run.max_norm > 0) {
      flag = std::log(r.grad_norm() / ctx.run.max_norm) > allowance;
    }
    const RateAlert::State s = rate_.Add(r.step(), flag, clipped,
                                         allowance > 0 ? kNever : cfg.min_steps);
    const double fraction = clipped.fraction();
    sink.Condition(
        AlertKind::kClipFractionHigh, r.step(), s.holds,
        std::max(fraction, s.rate_since), [&] {
          std::string description;
          if (s.by_change) {
            description = absl::StrFormat(
                "%.1f%% of the post-warmup steps since step %d (the change "
                "point) clipped at max_norm %g, above %.1f%% (sequential test, "
                "ARL0 %g steps); %d of the last %d steps (%.1f%%)",
                100 * s.rate_since, s.onset_step, ctx.run.max_norm,
                100 * cfg.threshold, ctx.config.change.arl0, clipped.count(),
                clipped.size(), 100 * fraction);
          } else {
            description = absl::StrFormat(
                "%d of the last %d post-warmup steps clipped "
                "(%.1f%% > %.1f%%) at max_norm %g",
                clipped.count(), clipped.size(), 100 * fraction,
                100 * cfg.threshold, ctx.run.max_norm);
          }
          // Same definition as RunHealth::RecommendedMaxNorm().
          if (auto p98 = ctx.window.grad_norm.Quantile(0.98)) {
            absl::StrAppendFormat(&description,
                                  "; recommended max_norm (p98) %.3g", *p98);
          }
          const double shown = s.by_change ? s.rate_since : fraction;
          return AlertText{
              s.by_change ? absl::StrFormat("Clipping on %.1f%% of steps since "
                                            "step %d",
                                            100 * shown, s.onset_step)
                          : absl::StrFormat("Clipping on %.1f%% of steps",
                                            100 * shown),
              std::move(description), s.onset_step};
        });
  }

  void OnRewind(uint64_t step) override { rate_.Reset(); }

 private:
  static constexpr double kLrFloor = 0.1;
  // No windowed rule while the allowance applies.
  static constexpr uint32_t kNever = ~uint32_t{0};

  RateAlert rate_;
  LrAllowance lr_;
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
    const ValueWindow& norms = ctx.window.grad_norm;
    const auto& cfg = ctx.config.post_clip;
    if (max_norm <= 0 || norms.slots() < cfg.min_steps || norms.ranked() == 0) {
      return;
    }
    const size_t pile = at_max_norm_.count();
    const double share = at_max_norm_.fraction();
    // The window's largest norm (a pass over it) only once the pile is there.
    const bool holds = pile >= cfg.min_pile && share >= cfg.pile_fraction &&
                       *norms.Max() <= max_norm + tolerance;
    sink.Condition(
        AlertKind::kPostClipNormReported, ctx.record.step(), holds, share, [&] {
          return AlertText{
              "Reported gradient norms look post-clip",
              absl::StrFormat(
                  "none of the last %d post-warmup norms exceeds max_norm %g "
                  "(largest %.7g) and %d of them (%.1f%%) sit at max_norm: "
                  "the post-clip norm is being reported",
                  norms.slots(), max_norm, *norms.Max(), pile, 100 * share)};
        });
  }

  void OnRewind(uint64_t step) override { at_max_norm_.RewindTo(step); }

 private:
  static constexpr double kRelativeTolerance = 1e-5;
  static constexpr double kClipEpsilon = 1e-6;

  FlagWindow at_max_norm_;
};

}  // namespace

std::unique_ptr<Detector> MakeClipFractionHigh(const HealthConfig& config) {
  return std::make_unique<ClipFractionHigh>(config);
}

std::unique_ptr<Detector> MakePostClipNormReported(const HealthConfig& config) {
  return std::make_unique<PostClipNormReported>(config);
}

}  // namespace trainwatch
