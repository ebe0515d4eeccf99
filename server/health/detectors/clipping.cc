// Clipping detectors (docs/detectors.md): ClipFractionHigh (the clip fraction:
// too many steps clipped) and PostClipNormReported (the reported norm is the
// post-clip one). They read the lead stream only (OnStep).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"
#include "trainwatch/v1/clipping.h"

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
//
// A run settles after its warmup: its norm is still falling, and hard
// batches clip on the way (held-out healthy lab runs clip 9% of their first
// 100 post-warmup steps, or half of them on a noisy language, then stop).
// So the alert names clipping that is the run's now (the last recent_steps
// post-warmup steps clip above the threshold too) and that is either a
// rise (above rise_ratio x the run's own share over its first
// baseline_steps post-warmup records) or still there once the run has
// settled (settle_steps post-warmup steps). Clipping on every step from the
// start is named then, not before: the clip is acting as the LR.
class ClipFractionHigh final : public Detector {
 public:
  explicit ClipFractionHigh(const HealthConfig& config)
      : rate_(config, config.clip_fraction.threshold),
        recent_(std::max<uint32_t>(1, config.clip_fraction.recent_steps)) {}

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
    recent_.Push(r.step(), flag);
    ++judged_;
    if (!first_step_.has_value()) first_step_ = r.step();
    // In steps, not records: a sparsely logged run settles as fast.
    const bool settled = r.step() >= *first_step_ + cfg.settle_steps - 1;
    if (early_.size() < cfg.baseline_steps) {
      early_.push_back({r.step(), flag});
      ++baseline_.steps;
      baseline_.clipped += flag ? 1 : 0;
    }
    const double now = recent_.fraction();
    // Clipping now: the last recent_steps clip above the threshold too.
    const bool current = now > cfg.threshold;
    bool rise = current && judged_ > cfg.baseline_steps &&
                now > cfg.rise_ratio * baseline_.fraction();
    // Once named, the alert holds by the rate's hysteresis: no rise to find.
    if (!named_ && s.holds && s.by_change) {
      // A jump: against the run's own share before its change point (none
      // before it: clipping since the start, not a rise).
      const Share before = EarlyShare(s.onset_step);
      rise |= before.steps >= kMinBefore && s.rate_since > cfg.rise_ratio * before.fraction();
    }
    // Named (fired) once, it holds by the rate's own hysteresis for the
    // whole episode: a step on which the condition lapses (and comes back
    // before the tracker resolves it) does not ask for clipping now again.
    const bool named = s.holds && (named_ || rise || (settled && current));
    named_ = rate_.firing() && (named_ || named);
    sink.Condition(
        AlertKind::kClipFractionHigh, r.step(), named,
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
          absl::StrAppendFormat(
              &description,
              "; %.1f%% of the last %d, %.1f%% of the first %d post-warmup steps",
              100 * now, recent_.size(), 100 * baseline_.fraction(), baseline_.steps);
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

  // The baseline and the settling count are the run's, which a restart
  // does not change.
  void OnRewind(uint64_t step) override {
    rate_.Reset();
    recent_.RewindTo(step);
    named_ = false;
  }

 private:
  struct Share {
    uint64_t clipped = 0;
    uint64_t steps = 0;
    double fraction() const { return steps > 0 ? double(clipped) / steps : 0.0; }
  };
  // The clipped share of the first baseline_steps post-warmup steps before
  // `step`.
  Share EarlyShare(uint64_t step) const {
    Share out;
    for (const auto& [at, clipped] : early_) {
      if (at >= step) break;
      ++out.steps;
      out.clipped += clipped ? 1 : 0;
    }
    return out;
  }

  static constexpr double kLrFloor = 0.1;
  // A change point needs this many post-warmup steps before it to be a rise.
  static constexpr uint64_t kMinBefore = 10;
  // No windowed rule while the allowance applies.
  static constexpr uint32_t kNever = ~uint32_t{0};

  RateAlert rate_;
  LrAllowance lr_;
  FlagWindow recent_;          // the last recent_steps post-warmup flags
  uint64_t judged_ = 0;        // post-warmup records seen
  std::optional<uint64_t> first_step_;  // the first post-warmup step
  // The first baseline_steps post-warmup steps and their flags (for the
  // share before a change point), and their share.
  std::vector<std::pair<uint64_t, bool>> early_;
  Share baseline_;
  // Named in the rate alert's episode under way (what the tracker shows).
  bool named_ = false;
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
    const double tolerance = kRelativeTolerance * max_norm + v1::kClipEpsilon;
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
