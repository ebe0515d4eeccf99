// FP16 loss-scaling detectors (docs/detectors.md): LossScaleCollapse, SkipRateHigh,
// ScalerStuck, ClipBeforeUnscale, Fp16WithoutScaler. They
// read the lead stream only (OnStep).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"
#include "health/signals/scale_bleed.h"
#include "trainwatch/v1/clipping.h"

namespace trainwatch {
namespace {

// Whether the run scales its loss: it said FP16, or the record carries a scale.
bool IsFp16(const StepContext& ctx) {
  return ctx.run.precision == v1::FP16 || ctx.record.has_loss_scale();
}

// Whether clipping fired; derived from max_norm when the client left it out.
bool Clipped(const StepContext& ctx) {
  if (ctx.record.has_clipped()) return ctx.record.clipped();
  return v1::ClippedAt(ctx.run.max_norm, ctx.record.grad_norm());
}

// Catches a diverging fp16 run: gradients overflow at every scale, so the
// scaler cuts the loss scale step after step. Holds while >= halvings
// decreases happened within the last within_steps steps with no growth
// between, or while the scale is below min_scale, or while it bleeds: >=
// bleed_halvings post-warmup halvings with no growth since (ScaleBleed; the
// description forecasts the step it reaches min_scale). Decreases in warmup
// before the run's first clean step are the scaler searching for its
// starting scale (65536 is usually too high), not a collapse, and do not
// count.
class LossScaleCollapse final : public Detector {
 public:
  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    if (!r.has_loss_scale() || std::isnan(r.loss_scale())) return;
    const auto& cfg = ctx.config.loss_scale;
    const uint64_t step = r.step();
    const double scale = r.loss_scale();
    const bool calibrating = !seen_clean_step_ && !ctx.post_warmup;
    if (last_.has_value()) {
      if (scale < last_->scale && !calibrating) {
        halvings_.push_back({.from = *last_, .to = {step, scale}});
      } else if (scale > last_->scale) {
        halvings_.clear();
      }
    }
    last_ = Point{step, scale};
    bleed_.Add(step, scale, ctx.post_warmup);
    if (!r.skipped()) seen_clean_step_ = true;
    while (!halvings_.empty() &&
           halvings_.front().to.step + cfg.within_steps <= step) {
      halvings_.pop_front();
    }

    const bool too_many = halvings_.size() >= cfg.halvings;
    const bool too_low = scale < cfg.min_scale;
    const std::optional<ScaleBleed::Bleed> bleed =
        bleed_.bleed(cfg.bleed_halvings, cfg.min_scale);
    const double value =
        too_many ? static_cast<double>(halvings_.size()) : scale;
    sink.Condition(
        AlertKind::kLossScaleCollapse, step,
        too_many || too_low || bleed.has_value(), value, [&] {
          std::string d;
          if (too_many) {
            const Point& from = halvings_.front().from;
            const Point& to = halvings_.back().to;
            d = absl::StrFormat(
                "loss scale fell %g -> %g in %d halvings over %d "
                "steps (steps %d..%d), no growth between",
                from.scale, to.scale, halvings_.size(), to.step - from.step,
                from.step, to.step);
          }
          if (too_low) {
            if (!d.empty()) d += "; ";
            d += absl::StrFormat("loss scale %g at step %d is below %g", scale,
                                 step, cfg.min_scale);
          }
          uint64_t onset = 0;
          if (bleed.has_value() && !too_many) {
            if (!d.empty()) d += "; ";
            d += absl::StrFormat(
                "loss scale bled %g -> %g in %d halvings since step %d (one "
                "every %.0f steps) without growing back",
                bleed->first_scale, scale, bleed->halvings, bleed->first_step,
                bleed->steps_per_halving);
            if (bleed->forecast_step.has_value() && scale >= cfg.min_scale) {
              d += absl::StrFormat(": at this pace it falls below %g at step %d",
                                   cfg.min_scale, *bleed->forecast_step);
            }
            onset = bleed->first_step;
          }
          return AlertText{"FP16 loss scale collapsing", d, onset};
        });
  }

  void OnRewind(uint64_t step) override {
    while (!halvings_.empty() && halvings_.back().to.step >= step) {
      halvings_.pop_back();
    }
    // The restored scaler's scale is not a change from the pre-rewind one.
    last_.reset();
    bleed_.Reset();
  }

 private:
  struct Point {
    uint64_t step;
    double scale;
  };
  struct Halving {
    Point from;  // the last scale before the decrease
    Point to;
  };

  std::optional<Point> last_;
  std::deque<Halving> halvings_;  // since the last growth, oldest first
  ScaleBleed bleed_;
  bool seen_clean_step_ = false;
};

// Catches fp16 overflow on many steps: the optimizer skips them, so the run
// silently trains on fewer steps. The skipped share of post-warmup steps
// above skip_rate.threshold, named by RateAlert (a CUSUM for a jump, the
// window W for a creep; hysteresis).
class SkipRateHigh final : public Detector {
 public:
  explicit SkipRateHigh(const HealthConfig& config)
      : rate_(config, config.skip_rate.threshold) {}

  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    if (!IsFp16(ctx) || !ctx.post_warmup) return;
    const auto& cfg = ctx.config.skip_rate;
    const FlagSeries& w = ctx.window.skipped;
    const RateAlert::State s =
        rate_.Add(ctx.record.step(), ctx.record.skipped(), w, cfg.min_steps);
    sink.Condition(
        AlertKind::kSkipRateHigh, ctx.record.step(), s.holds,
        std::max(w.fraction(), s.rate_since), [&] {
          std::string d = absl::StrFormat(
              "skipped %d of the last %d post-warmup steps (%.3g%%, threshold "
              "%.3g%%)",
              w.count(), w.size(), 100 * w.fraction(), 100 * cfg.threshold);
          if (s.by_change) {
            absl::StrAppendFormat(
                &d, "; %.3g%% of the steps since step %d (the change point; "
                    "sequential test, ARL0 %g steps)",
                100 * s.rate_since, s.onset_step, ctx.config.change.arl0);
          }
          return AlertText{"Many fp16 steps skipped", std::move(d),
                           s.onset_step};
        });
  }

  void OnRewind(uint64_t step) override { rate_.Reset(); }

 private:
  RateAlert rate_;
};

// Catches scaler.update() being called only on clean steps: the steps keep
// overflowing but the scale never drops, so the run cannot recover. Holds on
// >= scaler_stuck.consecutive skipped steps in a row carrying the same scale.
class ScalerStuck final : public Detector {
 public:
  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    if (!r.skipped() || !r.has_loss_scale()) {
      run_length_ = 0;
      return;
    }
    if (run_length_ > 0 && r.loss_scale() == run_scale_) {
      ++run_length_;
    } else {
      run_start_ = r.step();
      run_scale_ = r.loss_scale();
      run_length_ = 1;
    }
    sink.Condition(
        AlertKind::kScalerStuck, r.step(),
        run_length_ >= ctx.config.scaler_stuck.consecutive, run_length_, [&] {
          return AlertText{
              "FP16 loss scale stuck while steps overflow",
              absl::StrFormat("%d skipped steps in a row (steps %d..%d) with "
                              "the loss scale stuck at %g",
                              run_length_, run_start_, r.step(), run_scale_)};
        });
  }

  void OnRewind(uint64_t step) override { run_length_ = 0; }

 private:
  uint64_t run_start_ = 0;
  double run_scale_ = 0.0;
  uint32_t run_length_ = 0;  // skipped steps in a row with run_scale_
};

// Catches clip_grad_norm_ running on scaled fp16 gradients (no
// scaler.unscale_ first): nearly every step is clipped and the norm tracks
// the loss scale. Holds when, over the last clip_before_unscale.steps applied
// steps carrying a scale, the clipped share is >= clip_fraction and the median
// norm / scale is >= min_norm_to_scale (healthy: ~1e-5; scaled: the true norm).
class ClipBeforeUnscale final : public Detector {
 public:
  explicit ClipBeforeUnscale(const HealthConfig& config)
      : clipped_(config.clip_before_unscale.steps),
        ratio_(config.clip_before_unscale.steps),
        norm_(config.clip_before_unscale.steps),
        scale_(config.clip_before_unscale.steps) {}

  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    // An overflowed step says nothing about the clip order.
    if (!r.has_loss_scale() || r.skipped() || !std::isfinite(r.grad_norm()) ||
        !std::isfinite(r.loss_scale()) || !(r.loss_scale() > 0)) {
      return;
    }
    const uint64_t step = r.step();
    clipped_.Push(step, Clipped(ctx));
    ratio_.Push(step, r.grad_norm() / r.loss_scale());
    norm_.Push(step, r.grad_norm());
    scale_.Push(step, r.loss_scale());

    const auto& cfg = ctx.config.clip_before_unscale;
    if (clipped_.size() < cfg.steps) return;
    const double median_ratio = ratio_.Median().value_or(0.0);
    const bool holds = clipped_.fraction() >= cfg.clip_fraction &&
                       median_ratio >= cfg.min_norm_to_scale;
    sink.Condition(
        AlertKind::kClipBeforeUnscale, step, holds, median_ratio, [&] {
          return AlertText{
              "Gradients clipped before unscaling",
              absl::StrFormat(
                  "clipped on %.3g%% of the last %d fp16 steps; median "
                  "grad_norm %.3g at a median loss scale %.3g: norm/scale "
                  "%.3g (healthy ~1e-5), so clipping sees scaled gradients",
                  100 * clipped_.fraction(), clipped_.size(),
                  norm_.Median().value_or(0.0), scale_.Median().value_or(0.0),
                  median_ratio)};
        });
  }

  void OnRewind(uint64_t step) override {
    clipped_.RewindTo(step);
    ratio_.RewindTo(step);
    norm_.RewindTo(step);
    scale_.RewindTo(step);
  }

 private:
  FlagWindow clipped_;
  OrderStatWindow ratio_;  // grad_norm / loss_scale: its median every step
  ValueWindow norm_;       // medians only for the alert's text
  ValueWindow scale_;
};

// Catches an fp16 run without dynamic loss scaling (no GradScaler, or a
// scale fixed at 1): small gradients flush to zero. Holds from the
// fp16_scaler.steps-th record of the attempt for as long as no record has
// carried a scale other than 1.
class Fp16WithoutScaler final : public Detector {
 public:
  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    if (ctx.run.precision != v1::FP16) return;
    const v1::StepRecord& r = ctx.record;
    if (!attempt_.first_step.has_value()) attempt_.first_step = r.step();
    if (r.has_loss_scale()) {
      attempt_.scale_seen = true;
      if (r.loss_scale() != 1.0) attempt_.scaled = true;
    }
    const bool holds =
        !attempt_.scaled && ctx.records_seen >= ctx.config.fp16_scaler.steps;
    sink.Condition(
        AlertKind::kFp16WithoutScaler, r.step(), holds,
        static_cast<double>(ctx.records_seen), [&] {
          const char* what = attempt_.scale_seen
                                 ? "kept the loss scale fixed at 1"
                                 : "carried no loss scale";
          return AlertText{
              "FP16 run without a loss scaler",
              absl::StrFormat("fp16 run: all of its first %d steps (steps "
                              "%d..%d) %s",
                              ctx.records_seen, *attempt_.first_step, r.step(),
                              what)};
        });
  }

  // RunHealth counts records_seen from the rewind on: check the new attempt.
  void OnRewind(uint64_t step) override { attempt_ = {}; }

 private:
  struct {
    std::optional<uint64_t> first_step;
    bool scale_seen = false;  // a record carried a loss scale
    bool scaled = false;      // a record carried a scale other than 1
  } attempt_;
};

}  // namespace

void AddFp16Detectors(const HealthConfig& config, Detectors* out) {
  out->push_back(std::make_unique<LossScaleCollapse>());
  out->push_back(std::make_unique<SkipRateHigh>(config));
  out->push_back(std::make_unique<ScalerStuck>());
  // Every precision's, not only fp16's (detectors/nonfinite.cc); here so
  // that a step's transitions keep their order.
  out->push_back(MakeNonFiniteUpdate(config));
  out->push_back(std::make_unique<ClipBeforeUnscale>(config));
  out->push_back(std::make_unique<Fp16WithoutScaler>());
}

}  // namespace trainwatch
