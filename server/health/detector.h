// The detector seam: one small class per failure of docs/detectors.md.
//
// The engine calls every detector of a run, in step order, on the run's
// shard thread (so detectors need no locks):
//  - OnStep() for each record of the run's lead stream (lowest rank, latest
//    attempt), warmup steps included (ctx.post_warmup says which), after the
//    windows and baselines took the record in;
//  - OnRankRecord() for each record of every rank (for cross-rank checks),
//    in arrival order, to be kept until
//  - OnRanksThrough(), which judges the steps whose records from every rank
//    are in (RankProgress), once each and in step order: cross-rank verdicts
//    do not depend on the order the ranks' streams arrive in.
// A detector reports through AlertSink; the engine's alert tracker turns
// that into fire / resolve transitions, storage and metrics.
#ifndef TRAINWATCH_SERVER_HEALTH_DETECTOR_H_
#define TRAINWATCH_SERVER_HEALTH_DETECTOR_H_

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "health/alert_catalog.h"
#include "health/health_config.h"
#include "health/signals/window.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

// What a run said about itself in its RunStart (lead stream).
struct RunInfo {
  std::string run_id;
  v1::Precision precision = v1::PRECISION_UNSPECIFIED;
  double max_norm = 0.0;  // 0: no clipping configured
  uint64_t warmup_steps = 0;
  uint32_t world_size = 1;
  uint32_t scaler_growth_interval = 2000;
  std::optional<double> adam_eps;
  std::optional<double> adam_beta2;
  std::string host;  // the lead rank's machine ("" = not said)
  // A mixture-of-experts run's routing (RunStart.moe); nullopt otherwise.
  std::optional<v1::MoeConfig> moe;
};

// What a detector says about one alert transition: the human text
// (likely_cause and fix come from the catalog; the description carries the
// numbers that fired it) and, for a level shift, the detector's estimate of
// the step the change began (docs/detectors.md onset_step; 0: none).
struct AlertText {
  std::string summary;
  std::string description;
  uint64_t onset_step = 0;
  // The machine the alert names ("" = none) and the rank, if it names one.
  std::string host;
  std::optional<uint32_t> rank;
  // The episode's severity when it is not the catalog's (a BaselineDeviation
  // that is better than its band is info); unspecified: the catalog's.
  v1::Severity severity = v1::SEVERITY_UNSPECIFIED;
};

// An entry of `trainwatchctl spikes`: a spike (of the gradient norm or of
// the loss), which has a restart plan, or a hard batch, listed apart.
struct SpikeInfo {
  enum class Kind {
    kGradNorm,   // GradNormSpike's
    kLoss,       // LossSpike's: >= 3 of 5 losses high
    kHardBatch,  // 1-2 of 5 losses high, then back: a hard batch
  };
  Kind kind = Kind::kGradNorm;
  uint64_t step = 0;            // the (first high) step
  double grad_norm = 0.0;
  double ratio_to_ema = 0.0;    // norm / EMA geometric mean
  double sigmas = 0.0;          // (log norm - EMA mean) / EMA sd
  std::vector<int64_t> batch_ids;  // of the high steps
  // A hard batch: its high losses, its highest (loss_peak: a ratio to the
  // level when peak_is_ratio, else the jump above it) and the level.
  uint32_t high_steps = 0;
  double loss_peak = 0.0;
  double loss_level = 0.0;
  bool peak_is_ratio = false;
};

// Where detectors report. Implemented by the engine's alert tracker (and by a
// recording fake in tests). Only called from the run's shard thread.
class AlertSink {
 public:
  virtual ~AlertSink() = default;

  // A windowed condition, evaluated at `step`. The alert fires on the first
  // step it holds and resolves once it has been false for
  // resolve_after_steps. `value` feeds the alert's peak (the largest value
  // while firing). `text` is called only when the alert fires (and to refresh
  // the text while firing), so building it may be slow.
  virtual void Condition(AlertKind kind, uint64_t step, bool holds,
                         double value,
                         const std::function<AlertText()>& text) = 0;

  // An event (a spike, a non-finite update): fires now unless the alert is
  // already firing, in which case the episode is extended (peak, batch ids).
  // The alert resolves after resolve_after_steps without another event.
  virtual void Event(AlertKind kind, uint64_t step, double value,
                     const std::vector<int64_t>& batch_ids,
                     const std::function<AlertText()>& text) = 0;

  // Records a spike for the spike list (in addition to Event()).
  virtual void Spike(const SpikeInfo& spike) = 0;

  // Fires now unless already firing, and stays firing until Resolve(): an
  // alert about time (RunSilent) or over other runs (HostSuspect), which no
  // count of steps resolves.
  virtual void Fire(AlertKind kind, uint64_t step, double value,
                    AlertText text) = 0;
  // Resolves the alert if it is firing: its condition ended outright.
  virtual void Resolve(AlertKind kind, uint64_t step) = 0;
  // Rewrites a firing alert's text and, when `severity` is not unspecified,
  // its severity (a deviation that has grown past twice its band is critical).
  virtual void Amend(AlertKind kind, AlertText text, v1::Severity severity) {}
  // The severity `kind`'s episode fires at (the catalog's where its detector
  // set none); nullopt while it does not fire.
  virtual std::optional<v1::Severity> FiringSeverity(AlertKind kind) const {
    return std::nullopt;
  }
};

// Whether a lead step counts as clipped for the clip share: clipping fired
// on a step that applied an update with a finite norm.
inline bool Clipped(const v1::StepRecord& r) {
  return r.clipped() && !r.skipped() && std::isfinite(r.grad_norm());
}

class RunTiming;
struct BaselineReferences;

// The run against its reference runs, for /metrics: the last judged 20-step
// bin of its loss and its band's edges, each over the references' median
// (1: the recipe's curve). `judged` is false until a bin is.
struct BaselineStatus {
  bool judged = false;
  uint64_t step = 0;  // the bin's last
  double ratio = 0, lower = 0, upper = 0;
};

// What a detector sees for one lead-stream record.
struct StepContext {
  const v1::StepRecord& record;
  const RunInfo& run;
  const HealthConfig& config;
  // Windows over the last W post-warmup steps, this record included if it is
  // post-warmup.
  const RunWindow& window;
  const Baselines& baselines;
  const Trends& trends;
  bool post_warmup = false;
  // Lead-stream records seen so far in this attempt, this one included.
  uint64_t records_seen = 0;
  // Step times, input waits and goodput, this record included.
  RunTiming& timing;
};

// What a detector sees for a record of any rank.
struct RankRecordContext {
  const v1::StepRecord& record;
  uint32_t rank = 0;
  uint32_t attempt = 0;
  const RunInfo& run;
  const HealthConfig& config;
};

// What a cross-rank detector sees when steps are complete: every step <=
// `through` of `attempt` may be judged.
struct RanksThroughContext {
  uint64_t through = 0;
  uint32_t attempt = 0;
  const RunInfo& run;
  const HealthConfig& config;
  // Every rank's step times, waiting per rank until their step is judged.
  RunTiming& timing;
};

// What a detector sees on the engine's clock tick (every second or so) and
// when any stream of the run shows life.
struct TickContext {
  int64_t now_unix_nanos = 0;
  // When the run's last record or event arrived (any stream).
  int64_t last_record_unix_nanos = 0;
  uint64_t last_step = 0;  // the lead's latest step
  const RunInfo& run;
  const HealthConfig& config;
};

// An alert of some run fired, as the server-wide rules see it.
struct FiredContext {
  AlertKind kind;
  const std::string& run;
  const std::string& host;  // the host it names ("" = none)
  uint64_t started_step = 0;
  int64_t started_unix_nanos = 0;
  uint32_t rank = 0;
  const std::string& description;
};

class Detector {
 public:
  virtual ~Detector() = default;
  virtual void OnStep(const StepContext& ctx, AlertSink& sink) {}
  virtual void OnRankRecord(const RankRecordContext& ctx, AlertSink& sink) {}
  virtual void OnRanksThrough(const RanksThroughContext& ctx, AlertSink& sink) {}
  // The clock moved (the engine's timer), with or without records.
  virtual void OnTick(const TickContext& ctx, AlertSink& sink) {}
  // A record or event of any stream of the run arrived at `step`.
  virtual void OnActivity(uint64_t step, AlertSink& sink) {}
  // Server-wide detectors (one for all runs): another run's alert fired.
  virtual void OnAlertFired(const FiredContext& ctx, AlertSink& sink) {}
  // The job restarted from a checkpoint: forget state of steps >= `step`.
  virtual void OnRewind(uint64_t step) {}
  // The reference runs the run is judged against (loaded off the shard by
  // the engine; null: none), before the records they are to judge, and
  // where the detector that judges them leaves the run's place for /metrics
  // (owned by the run's health, outlives the detector).
  virtual void OnBaselines(std::shared_ptr<const BaselineReferences> refs,
                           BaselineStatus* status) {}
  // LogZDrift's baseline of log Z (the median its level rule measures from),
  // for the health snapshot's forecast; nullopt from every other detector,
  // and until it is taken. Not on the records' path.
  virtual std::optional<double> LogZBaseline() const { return std::nullopt; }
};

// The detectors of the lead stream's records, for one run: every per-run
// alert of the catalog but the cross-rank ones and RunSilent.
std::vector<std::unique_ptr<Detector>> MakeDetectors(const HealthConfig& config);
// The cross-rank detectors (RankNormMismatch, ShardNormMismatch,
// RankStraggler), for one run.
std::vector<std::unique_ptr<Detector>> MakeRankDetectors(const HealthConfig& config);
// The detectors of the clock and of life signs (RunSilent), for one run.
std::vector<std::unique_ptr<Detector>> MakeClockDetectors(const HealthConfig& config);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_DETECTOR_H_
