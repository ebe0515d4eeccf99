// One run's pipeline: what the server does with a run's records, minus the
// threads and the I/O (the engine adds those). It picks the lead stream, skips
// records it has seen before, rewinds on a restart from a checkpoint, feeds
// the run's RunHealth, and reports everything the outside world sees through
// one RunObserver.
//
//  - Lead stream (docs/contracts.md, "Semantics"): the lowest rank reporting, and of that rank
//    the latest attempt. Its records alone feed the windows, baselines and
//    detectors; every rank's records feed the cross-rank checks, which judge
//    a step once every rank's record of it is in (RankProgress). Rank 0
//    leads at once; a higher rank leads only once every rank below it is
//    missing (ranks.missing_after_seconds without a record), and until then
//    its records wait (at most ranks.max_pending_lead_records), so rank 0
//    arriving last still leads from its first step with its own history. A
//    lower rank that shows up after a higher one led takes over with its
//    own records, on fresh windows.
//  - Dedup: per stream (rank, attempt) the pipeline remembers the last step
//    processed, starting from the last step the store holds, so a batch
//    resent after a reconnect or a crash counts once (a step at 2^64 - 1
//    included).
//  - Rewind: a new attempt whose first step is at or below the last step seen
//    rewinds the windows to that step.
//  - The clock: OnTick() runs the clock's detectors (RunSilent, resolved by
//    the next record or by the run's end).
//
// Not thread-safe: the engine keeps each run's pipeline on one shard thread.
// No clock either: every call that stamps time takes `now_unix_nanos`.
#ifndef TRAINWATCH_SERVER_HEALTH_RUN_RUN_PIPELINE_H_
#define TRAINWATCH_SERVER_HEALTH_RUN_RUN_PIPELINE_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "health/health_config.h"
#include "health/run/alert_tracker.h"
#include "health/run/run_health.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

// Everything a run's pipeline tells the outside world (the engine's
// AlertRouter stores, exports and notifies it). Called on the pipeline's
// thread, from inside the pipeline's calls; must not call back into it.
class RunObserver {
 public:
  virtual ~RunObserver() = default;

  // An alert fired or resolved (never while replaying history). `update`:
  // a report of an episode already firing (its cause or text changed), not
  // a new fire.
  virtual void OnAlert(AlertKind kind, const v1::Alert& alert, bool update) = 0;
  // A gradient spike, for the spike list (never while replaying history).
  virtual void OnSpike(const SpikeInfo& spike) = 0;
  // Another stream became the lead (a lower rank, or a later attempt of the
  // lead rank); `start` is its RunStart. Not called by Recover().
  virtual void OnLeadChanged(const v1::RunStart& start) = 0;
  // A lead-stream record, after the health took it in. Its batch's
  // OnLeadBatchDone follows while the batch's records are alive.
  virtual void OnLeadRecord(const v1::StepRecord& record) = 0;
  // A batch brought `fresh` records not seen before (any stream);
  // `client_dropped` is the drop count the client sent with it (a batch
  // whose records were all seen before reports nothing).
  virtual void OnRecordsAccepted(size_t fresh, uint64_t client_dropped) = 0;
  // After a batch of lead-stream records: the last of them.
  virtual void OnLeadBatchDone(const v1::StepRecord& last,
                               int64_t now_unix_nanos) = 0;
  // The windows moved (after a lead batch, and after replaying history).
  virtual void OnWindows(const RunHealth& health) = 0;
  // A new attempt replayed a spike's steps: recovered or recurred, with or
  // without its batches.
  virtual void OnSpikeOutcome(const SpikeOutcome& outcome) {}
};

// What GetRunHealth reports from memory.
struct HealthSnapshot {
  v1::WindowStats window;
  // Per-rank detail (slowest_ranks) and goodput; the other fields unset.
  v1::GetRunHealthResponse timing;
  std::vector<v1::Alert> active_alerts;
  std::optional<double> recommended_max_norm;
};

class RunPipeline {
 public:
  // `config` and `observer` are borrowed and must outlive the pipeline.
  // `now_unix_nanos` starts the silence clock.
  RunPipeline(std::string run_id, const HealthConfig& config,
              RunObserver* observer, int64_t now_unix_nanos);
  RunPipeline(const RunPipeline&) = delete;
  RunPipeline& operator=(const RunPipeline&) = delete;

  // Whether the pipeline knows where the stream (rank, attempt) resumes.
  bool KnowsStream(uint32_t rank, uint32_t attempt) const;
  // The stream's RunStart is stored; the store held its records up to
  // `last_stored_step` (none: nothing stored). Records below the resume
  // point are skipped. The store can only be behind what the pipeline
  // processed, so a resume point already known is only ever raised.
  void OnStreamStarted(uint32_t rank, uint32_t attempt,
                       std::optional<uint64_t> last_stored_step);

  // A batch of the stream that sent `start`, in step order, after
  // OnStreamStarted() for that stream. Records at or below a step already
  // processed for the stream are skipped.
  void OnBatch(
      const v1::RunStart& start,
      const google::protobuf::RepeatedPtrField<v1::StepRecord>& records,
      uint64_t client_dropped, int64_t now_unix_nanos);
  // A stored event of the stream (rank, attempt). Returns whether it ends
  // the run (RUN_FINISHED, RUN_FAILED), which resolves RunSilent; no step
  // waits for that rank's records any more.
  bool OnEvent(uint32_t rank, uint32_t attempt, const v1::RunEvent& event);

  // The engine's clock tick: the clock's detectors (RunSilent, when no
  // record came for silent.seconds).
  void OnTick(int64_t now_unix_nanos);
  // Declares missing the ranks silent for ranks.missing_after_seconds: the
  // cross-rank steps that waited for them are judged, and a rank that waited
  // for them to lead the run leads.
  void CheckRanks(int64_t now_unix_nanos);
  // The run is forgotten: resolves every alert still firing at its last step.
  void ResolveAll(int64_t now_unix_nanos);

  // Recovery after a restart, before any other call: the run's lead
  // RunStart and last stored step; then RestoreAlert() for each alert stored
  // as firing, and the lead's history between BeginReplay() and EndReplay(),
  // during which nothing fires and the observer hears only OnWindows() (at
  // EndReplay()).
  void Recover(const v1::RunStart& lead, uint64_t last_step);
  // `firing` must name an alert of the catalog.
  void RestoreAlert(const v1::Alert& firing);
  void BeginReplay();
  // A stored lead-rank record; records of attempts after the lead's are
  // ignored.
  void Replay(uint32_t attempt, const v1::StepRecord& record,
              int64_t now_unix_nanos);
  void EndReplay();

  // The reference runs the lead is judged against from now on (null: none),
  // loaded by the engine off the shard.
  void SetBaselines(std::shared_ptr<const BaselineReferences> refs);

  // The live health for GetRunHealth; empty before the first lead record.
  HealthSnapshot Snapshot() const;

  const std::string& run_id() const { return run_id_; }
  // Null until the run's first record.
  const RunHealth* health() const { return health_.get(); }
  // Whether a stream leads the run (none yet while a higher rank waits).
  bool has_lead() const { return lead_rank_ != kNoLead; }
  uint64_t last_step() const { return last_step_; }
  uint32_t lead_rank() const { return lead_rank_; }
  uint32_t lead_attempt() const { return lead_attempt_; }

 private:
  void SetLead(const v1::RunStart& start);
  // Whether `rank` may lead now: rank 0, or every rank below it is missing.
  bool CanLead(uint32_t rank) const;
  // The stream of `start` leads from now on.
  void TakeLead(const v1::RunStart& start, int64_t now_unix_nanos);
  // The waiting stream leads, and its records are fed.
  void PromotePending(int64_t now_unix_nanos);
  // A lead record: the health, spike verdicts, timing, the observer.
  void LeadRecord(uint32_t attempt, const v1::StepRecord& r,
                  int64_t now_unix_nanos);
  void EnsureHealth(const v1::RunStart& start);
  // Feeds one lead-stream record to the health, rewinding first on a new
  // attempt that restarts at or before the last step.
  void FeedLead(uint32_t attempt, const v1::StepRecord& record,
                int64_t now_unix_nanos);
  void OnSpikeVerdicts(const std::vector<SpikeOutcome>& outcomes, uint64_t step);
  // A transition of the tracker, to the observer in the alert's one shape.
  void Report(const AlertEpisode& episode);

  const std::string run_id_;
  const HealthConfig& config_;
  RunObserver* const observer_;
  std::unique_ptr<RunHealth> health_;
  std::shared_ptr<const BaselineReferences> baseline_refs_;
  static constexpr uint32_t kNoLead = std::numeric_limits<uint32_t>::max();
  uint32_t lead_rank_ = kNoLead;
  uint32_t lead_attempt_ = 0;
  // The attempt whose records the health last took in.
  std::optional<uint32_t> health_attempt_;
  int64_t last_record_unix_nanos_ = 0;
  uint64_t last_step_ = 0;  // of the lead stream
  int64_t now_unix_nanos_ = 0;  // of the batch being processed
  // A stream that would lead but waits for a lower rank, with its records
  // (and when each arrived).
  struct PendingLead {
    v1::RunStart start;
    std::vector<std::pair<v1::StepRecord, int64_t>> records;
  };
  std::optional<PendingLead> pending_;
  // Per stream (rank << 32 | attempt): the last step processed (none yet:
  // nullopt). A key is present once the stream's start is known.
  absl::flat_hash_map<uint64_t, std::optional<uint64_t>> last_processed_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_RUN_RUN_PIPELINE_H_
