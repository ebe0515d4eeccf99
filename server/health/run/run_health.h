// The health of one run: its windows, baselines, detectors and alert
// lifecycle. The engine feeds it the run's records in commit order.
//
// Not thread-safe: owned by the run's shard.
#ifndef TRAINWATCH_SERVER_HEALTH_RUN_RUN_HEALTH_H_
#define TRAINWATCH_SERVER_HEALTH_RUN_RUN_HEALTH_H_

#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "health/detector.h"
#include "health/run/alert_tracker.h"
#include "health/run/rank_progress.h"
#include "health/signals/window.h"
#include "health/timing/run_timing.h"

namespace trainwatch {

class RunHealth {
 public:
  RunHealth(RunInfo info, const HealthConfig& config,
            AlertTracker::Listener on_transition,
            AlertTracker::SpikeListener on_spike);
  RunHealth(const RunHealth&) = delete;
  RunHealth& operator=(const RunHealth&) = delete;

  // A record of the lead stream (lowest rank, latest attempt), in step order.
  void OnLeadRecord(const v1::StepRecord& record, int64_t now_unix_nanos);
  // A record of any rank (the lead's included), for the cross-rank checks
  // and step times, from the stream whose RunStart named `host`. Steps are
  // judged across ranks once every rank's record of them is in
  // (RankProgress), so any order of the ranks' streams gives the same
  // cross-rank verdicts.
  void OnRankRecord(uint32_t rank, uint32_t attempt,
                    const v1::StepRecord& record, std::string_view host = {},
                    int64_t now_unix_nanos = 0);
  // The engine's clock tick: the run's last record or event arrived at
  // `last_record_unix_nanos`, and the lead's last step is `last_step`.
  void OnTick(int64_t now_unix_nanos, int64_t last_record_unix_nanos,
              uint64_t last_step);
  // A record or event of any stream arrived at `step`.
  void OnActivity(uint64_t step);
  // Ranks silent for ranks.missing_after_seconds are missing: the steps
  // that waited for them are judged.
  void DeclareMissingRanks(int64_t now_unix_nanos);
  // A rank's stream finished: no step waits for it any more.
  void OnRankFinished(uint32_t rank, uint32_t attempt, int64_t now_unix_nanos);
  // Another stream leads the run from now on (a lower rank that showed up):
  // the lead's windows, baselines, trends and detectors start afresh, and
  // the lead's alerts still firing resolve at `step`.
  void ResetLead(uint64_t step, int64_t now_unix_nanos);
  const RankProgress& rank_progress() const { return progress_; }
  // The job restarted from a checkpoint at `step`: forget steps >= step.
  void Rewind(uint64_t step);
  // The lead stream's RunStart changed (a new attempt or a lower rank).
  void set_info(RunInfo info) { info_ = std::move(info); }
  // The reference runs the lead is judged against (null: none); kept across
  // ResetLead.
  void SetBaselines(std::shared_ptr<const BaselineReferences> refs);

  const RunInfo& info() const { return info_; }
  const RunWindow& window() const { return window_; }
  const Baselines& baselines() const { return baselines_; }
  // Log Z's baseline median as LogZDrift measures from it; nullopt until
  // taken (asks the detector: not for the records' path).
  std::optional<double> LogZBaseline() const;
  // The lead against its reference runs (BaselineDeviation's last bin).
  const BaselineStatus& baseline_status() const { return baseline_status_; }
  const Trends& trends() const { return trends_; }
  // Step times, input waits, goodput and spike replays (fed by the pipeline).
  RunTiming& timing() { return timing_; }
  const RunTiming& timing() const { return timing_; }
  AlertTracker& tracker() { return tracker_; }
  const AlertTracker& tracker() const { return tracker_; }
  // Post-warmup records seen (this attempt's history included).
  uint64_t post_warmup_seen() const { return post_warmup_seen_; }
  std::optional<uint64_t> last_step() const { return last_step_; }

  // The 98th percentile of post-warmup pre-clip norms over the window: the
  // measured way to set max_norm. nullopt until the window has min_steps.
  std::optional<double> RecommendedMaxNorm() const;

 private:

  RunInfo info_;
  const HealthConfig& config_;
  RunWindow window_;
  Baselines baselines_;
  Trends trends_;
  uint64_t post_warmup_seen_ = 0;
  uint64_t records_seen_ = 0;
  std::optional<uint64_t> last_step_;
  // Judges the steps across ranks that RankProgress says are complete, up
  // to `limit`.
  void JudgeRanks(int64_t now_unix_nanos,
                  uint64_t limit = std::numeric_limits<uint64_t>::max());

  std::vector<std::unique_ptr<Detector>> detectors_;       // the lead's
  std::vector<std::unique_ptr<Detector>> rank_detectors_;  // cross-rank
  std::vector<std::unique_ptr<Detector>> clock_detectors_;  // RunSilent
  std::shared_ptr<const BaselineReferences> baseline_refs_;
  BaselineStatus baseline_status_;
  RankProgress progress_;
  std::optional<uint64_t> judged_through_;  // of progress_.attempt()
  uint32_t judged_attempt_ = 0;
  uint32_t lag_world_ = 0;  // the world size progress_'s lag bound is for
  RunTiming timing_;
  AlertTracker tracker_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_RUN_RUN_HEALTH_H_
