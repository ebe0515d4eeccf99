#include "health/run_health.h"

namespace trainwatch {

RunHealth::RunHealth(RunInfo info, const HealthConfig& config,
                     AlertTracker::Listener on_transition,
                     AlertTracker::SpikeListener on_spike)
    : info_(std::move(info)),
      config_(config),
      window_(config.window_steps),
      detectors_(MakeDetectors(config)),
      timing_(config.timing),
      tracker_(config, std::move(on_transition), std::move(on_spike)) {}

void RunHealth::OnLeadRecord(const v1::StepRecord& r, int64_t now_unix_nanos) {
  tracker_.BeginStep(r.step(), now_unix_nanos);
  const bool post_warmup = r.step() >= info_.warmup_steps;
  if (post_warmup) {
    window_.grad_norm.Push(r.step(), r.grad_norm());
    // A skipped step applied no update, so it was not clipped either (its
    // norm is usually Inf, which would otherwise read as clipped).
    window_.clipped.Push(r.clipped() && !r.skipped());
    window_.skipped.Push(r.skipped());
    if (r.has_max_attn_logit()) {
      window_.max_attn_logit.Push(r.step(), r.max_attn_logit());
    }
    if (r.has_log_z()) window_.log_z.Push(r.step(), r.log_z());
    if (r.has_max_attn_logit()) {
      trends_.max_attn_logit.Add(r.step(), r.max_attn_logit());
    }
    if (r.has_log_z()) trends_.log_z.Add(r.step(), r.log_z());
    ++post_warmup_seen_;
    if (post_warmup_seen_ == config_.window_steps) {
      // The window now holds exactly the first W post-warmup steps.
      baselines_.grad_norm_median = window_.grad_norm.Median();
      baselines_.max_attn_logit_median = window_.max_attn_logit.Median();
      baselines_.log_z_median = window_.log_z.Median();
      baselines_.through_step = r.step();
    }
  }
  ++records_seen_;
  last_step_ = r.step();
  StepContext ctx{.record = r,
                  .run = info_,
                  .config = config_,
                  .window = window_,
                  .baselines = baselines_,
                  .trends = trends_,
                  .post_warmup = post_warmup,
                  .records_seen = records_seen_};
  for (auto& d : detectors_) d->OnStep(ctx, tracker_);
  tracker_.EndStep(r.step());
}

void RunHealth::OnRankRecord(uint32_t rank, uint32_t attempt,
                             const v1::StepRecord& r) {
  RankRecordContext ctx{.record = r,
                        .rank = rank,
                        .attempt = attempt,
                        .run = info_,
                        .config = config_};
  for (auto& d : detectors_) d->OnRankRecord(ctx, tracker_);
}

void RunHealth::Rewind(uint64_t step) {
  window_.RewindTo(step);
  trends_.RewindTo(step);
  if (baselines_.grad_norm_median.has_value() &&
      baselines_.through_step >= step) {
    baselines_ = Baselines{};
  }
  if (!baselines_.grad_norm_median.has_value()) {
    // Every step left in the window is from the start of the run.
    post_warmup_seen_ = window_.grad_norm.slots();
  }
  records_seen_ = 0;
  if (last_step_.has_value()) timing_.OnRewind(step, *last_step_);
  if (last_step_.has_value() && *last_step_ >= step) {
    last_step_ = step == 0 ? std::nullopt : std::optional<uint64_t>(step - 1);
  }
  for (auto& d : detectors_) d->OnRewind(step);
}

std::optional<double> RunHealth::RecommendedMaxNorm() const {
  if (window_.grad_norm.ranked() < config_.clip_fraction.min_steps) {
    return std::nullopt;
  }
  return window_.grad_norm.Quantile(0.98);
}

}  // namespace trainwatch
