#include "health/run/run_health.h"

#include <algorithm>
#include <cmath>

#include "health/signals/baseline_band.h"
#include "health/signals/change_detection.h"

namespace trainwatch {

RunHealth::RunHealth(RunInfo info, const HealthConfig& config,
                     AlertTracker::Listener on_transition,
                     AlertTracker::SpikeListener on_spike)
    : info_(std::move(info)),
      config_(config),
      window_(config.window_steps),
      detectors_(MakeDetectors(config)),
      rank_detectors_(MakeRankDetectors(config)),
      clock_detectors_(MakeClockDetectors(config)),
      progress_(config.rank_mismatch.horizon_steps),
      timing_(config.timing, config.rank_mismatch.horizon_steps),
      tracker_(config, std::move(on_transition), std::move(on_spike)) {}

void RunHealth::OnLeadRecord(const v1::StepRecord& r, int64_t now_unix_nanos) {
  tracker_.SetNow(now_unix_nanos);
  const bool post_warmup = r.step() >= info_.warmup_steps;
  if (post_warmup) {
    window_.grad_norm.Push(r.step(), r.grad_norm());
    // A skipped step applied no update, so it was not clipped either (its
    // norm is usually Inf, which would otherwise read as clipped); nor was a
    // step with a non-finite norm (NonFiniteUpdate's, not clipping's).
    window_.clipped.Push(Clipped(r));
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
                  .records_seen = records_seen_,
                  .timing = timing_};
  tracker_.BeginStep();
  for (auto& d : detectors_) d->OnStep(ctx, tracker_);
  tracker_.EndStep(r.step());
}

void RunHealth::OnRankRecord(uint32_t rank, uint32_t attempt,
                             const v1::StepRecord& r, std::string_view host,
                             int64_t now_unix_nanos) {
  const uint32_t world = std::max(info_.world_size, rank + 1);
  // One rank has nothing to compare (RankNormMismatch, ShardNormMismatch
  // need two, RankStraggler three).
  if (world == 1) return;
  if (world != lag_world_) {
    // Step times wait per rank until judged: bound the lag by what they hold.
    lag_world_ = world;
    progress_.set_max_lag_steps(std::max<uint64_t>(
        1, std::min<uint64_t>(config_.rank_mismatch.horizon_steps,
                              config_.ranks.max_pending_values / world)));
  }
  if (!progress_.Add(rank, attempt, world, r.step(), now_unix_nanos)) return;
  // A step far ahead may push older ones past the lag bound: judge those
  // first (not this step, whose record is not in yet), so that the digests
  // never hold more than the bound.
  if (r.step() > 0) JudgeRanks(now_unix_nanos, r.step() - 1);
  RankRecordContext ctx{.record = r,
                        .rank = rank,
                        .attempt = attempt,
                        .run = info_,
                        .config = config_};
  for (auto& d : rank_detectors_) d->OnRankRecord(ctx, tracker_);
  timing_.OnRecord(rank, attempt, host, r);
  JudgeRanks(now_unix_nanos);
}

void RunHealth::JudgeRanks(int64_t now_unix_nanos, uint64_t limit) {
  std::optional<uint64_t> through = progress_.through();
  if (!through.has_value()) return;
  through = std::min(*through, limit);
  if (judged_attempt_ == progress_.attempt() && judged_through_.has_value() &&
      *through <= *judged_through_) {
    return;
  }
  judged_attempt_ = progress_.attempt();
  judged_through_ = through;
  tracker_.SetNow(now_unix_nanos);
  RanksThroughContext ctx{.through = *through,
                          .attempt = progress_.attempt(),
                          .run = info_,
                          .config = config_,
                          .timing = timing_};
  tracker_.BeginStep();
  for (auto& d : rank_detectors_) d->OnRanksThrough(ctx, tracker_);
  tracker_.EndRanksStep(*through);
}

void RunHealth::OnTick(int64_t now_unix_nanos, int64_t last_record_unix_nanos,
                       uint64_t last_step) {
  tracker_.SetNow(now_unix_nanos);
  TickContext ctx{.now_unix_nanos = now_unix_nanos,
                  .last_record_unix_nanos = last_record_unix_nanos,
                  .last_step = last_step,
                  .run = info_,
                  .config = config_};
  for (auto& d : clock_detectors_) d->OnTick(ctx, tracker_);
}

void RunHealth::OnActivity(uint64_t step) {
  for (auto& d : clock_detectors_) d->OnActivity(step, tracker_);
}

void RunHealth::DeclareMissingRanks(int64_t now_unix_nanos) {
  progress_.DeclareMissing(
      now_unix_nanos, config_.ranks.missing_after_seconds * 1'000'000'000);
  JudgeRanks(now_unix_nanos);
}

void RunHealth::OnRankFinished(uint32_t rank, uint32_t attempt,
                               int64_t now_unix_nanos) {
  progress_.Finish(rank, attempt, now_unix_nanos);
  JudgeRanks(now_unix_nanos);
}

void RunHealth::ResetLead(uint64_t step, int64_t now_unix_nanos) {
  tracker_.SetNow(now_unix_nanos);
  for (const AlertSpec& spec : AllAlertSpecs()) {
    if (!AlertTracker::AcrossRanks(spec.kind) && spec.kind != AlertKind::kRunSilent) {
      tracker_.Resolve(spec.kind, step);
    }
  }
  window_ = RunWindow(config_.window_steps);
  trends_ = Trends{};
  baselines_ = Baselines{};
  post_warmup_seen_ = 0;
  records_seen_ = 0;
  last_step_.reset();
  detectors_ = MakeDetectors(config_);
  baseline_status_ = BaselineStatus{};
  for (auto& d : detectors_) d->OnBaselines(baseline_refs_, &baseline_status_);
  timing_.ResetLead();
}

void RunHealth::SetBaselines(std::shared_ptr<const BaselineReferences> refs) {
  baseline_refs_ = std::move(refs);
  // Without references there is nothing to show. With them, the last bin
  // stays until the detector closes the next: each new stream of the run
  // loads its references again, maybe after its last batch, and /metrics
  // would lose the series until the run sent 20 more records.
  if (baseline_refs_ == nullptr || baseline_refs_->runs.empty()) {
    baseline_status_ = BaselineStatus{};
  }
  for (auto& d : detectors_) d->OnBaselines(baseline_refs_, &baseline_status_);
}

std::optional<double> RunHealth::LogZBaseline() const {
  for (const auto& d : detectors_) {
    if (std::optional<double> b = d->LogZBaseline()) return b;
  }
  return std::nullopt;
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
  if (last_step_.has_value()) {
    timing_.OnRewind(step, *last_step_);
    tracker_.ResolveAbandoned(step, *last_step_);
  }
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
