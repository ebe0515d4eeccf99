// The closed loop (docs/closed-loop.md): what the server asks a trainer to do
// when a critical alert with a restart plan fires, and the record of it.
//
// A critical alert that has a plan (LossDivergence, NonFiniteUpdate,
// LossScaleCollapse, ScalerStuck) gets a PROPOSED directive per the ladder
// (policy.h). A person approves or rejects it (trainwatchctl approve/reject),
// or, in auto mode, the policy approves the actions closed_loop.auto lists
// unless a hold is on. An approved directive rides on the run's Report
// streams' responses until every rank has acked it APPLIED:
//
//   PROPOSED -> APPROVED -> DELIVERED -> APPLIED
//            \-> REJECTED | EXPIRED | SUPERSEDED
//
// Every transition is stored (who, when, why) with the directive, and counted
// on trainwatch_directives_total{action,state}. Per-rank acks are kept as
// transitions too (RANK_RECEIVED, RANK_APPLIED) that leave the state as it is.
//
// Exactly once, on the server's side: a stream is never sent a directive
// whose seq is <= its RunStart's last_applied_directive, nor one its rank
// acked APPLIED; apply_at_step is fixed when a directive is first delivered
// (the highest step any rank reported + lead_steps), so every rank gets the
// same one; a rank that was past it answers REJECTED "late" and, when no rank
// has applied it yet, it is reissued with a new step.
//
// Thread-safe: every method may be called from any thread. Store ops are
// submitted after mu_ is released (a closed store runs their callbacks
// inline, and the ingest callbacks take a stream's lock, which is held around
// ToDeliver). The store, metrics and clock are borrowed.
#ifndef TRAINWATCH_SERVER_CLOSEDLOOP_CLOSED_LOOP_H_
#define TRAINWATCH_SERVER_CLOSEDLOOP_CLOSED_LOOP_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "closedloop/policy.h"
#include "common/clock.h"
#include "health/health_config.h"
#include "metrics/metrics.h"
#include "store/store.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

class ClosedLoop {
 public:
  ClosedLoop(ClosedLoopConfig config, Store* store, Metrics* metrics, const Clock* clock);
  ClosedLoop(const ClosedLoop&) = delete;
  ClosedLoop& operator=(const ClosedLoop&) = delete;

  // Reads every stored directive back (before serving).
  absl::Status Load();

  const ClosedLoopConfig& config() const { return config_; }

  // What answered an alert: the sentence its description gains (the
  // directive's id and the command that approves it), and, when the
  // ladder ran out (the directive is the Stop), why.
  struct Answer {
    std::string note;
    bool exhausted = false;
    std::string reason;  // the Stop's, when exhausted
  };
  // A critical alert fired on `attempt` of its run (the engine, on the run's
  // shard). `recent`: the lead's batch ids of its latest steps. Reads the
  // run's events from the store (a small read, once per incident); nullopt
  // when no directive was proposed.
  std::optional<Answer> OnAlertFired(const v1::Alert& alert, uint32_t attempt,
                                     const RecentBatches& recent);

  // Ingest: a stream opened (a newer attempt expires what was not delivered
  // to the older one), and the highest step of a batch.
  void OnStreamStart(const v1::RunStart& start);
  void OnProgress(const std::string& run_id, uint64_t step);
  // A CHECKPOINT_SAVED as it arrives: an alert in the batch read after it
  // may be judged before the event's commit reaches the store.
  void OnEvent(const std::string& run_id, const v1::RunEvent& event);

  // The directives a response of this stream carries: approved, seq >
  // last_applied, not yet acked APPLIED by `rank`. The first delivery of one
  // fixes its apply_at_step and moves it to DELIVERED.
  std::vector<v1::Directive> ToDeliver(const std::string& run_id, uint32_t rank,
                                       uint64_t last_applied);

  // A rank's DirectiveAck; `done` runs once what it changed is stored (in the
  // store's order, after the stream's earlier batches).
  void OnAck(const std::string& run_id, const v1::DirectiveAck& ack,
             std::function<void(absl::Status)> done);

  // trainwatchctl directives / approve / reject / hold / release.
  std::vector<v1::DirectiveRecord> List(const std::string& run_id) const;
  // Idempotent: approving what is approved (or further) and rejecting what
  // is rejected change nothing. NOT_FOUND for an unknown id;
  // FAILED_PRECONDITION for a decision its state no longer allows.
  absl::StatusOr<v1::DirectiveRecord> Decide(const std::string& id, bool approve,
                                             const std::string& who, const std::string& note);
  // Nothing of the run is approved by policy for `seconds` (0 releases;
  // then what the policy would have approved is). Stored (who, when): a
  // restart keeps it. Returns when it ends (unix nanos; 0: no hold).
  int64_t Hold(const std::string& run_id, uint64_t seconds, const std::string& who);

  // The run was deleted (its rows went with it).
  void ForgetRun(const std::string& run_id);

  // The run of a directive id ("RUN#SEQ"); INVALID_ARGUMENT for another shape.
  static absl::StatusOr<std::pair<std::string, uint64_t>> ParseId(const std::string& id);

 private:
  struct RunLoop {
    std::vector<v1::DirectiveRecord> directives;  // by seq
    uint64_t next_seq = 1;
    uint64_t max_step = 0;       // any rank's
    uint32_t world_size = 1;
    uint32_t attempt = 0;        // the latest seen
    int64_t hold_until_unix_nanos = 0;
    std::vector<v1::RunEvent> checkpoints;  // received by this server
  };
  using Ops = std::vector<WriteOp>;
  static constexpr size_t kMaxCheckpoints = 64;  // per run, the latest

  RunLoop& RunLocked(const std::string& run_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::DirectiveRecord* FindLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HeldLocked(const RunLoop& run) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `d` to `state` (counted), or only adds a per-rank transition when
  // `state` is one; queues the store op.
  void TransitionLocked(v1::DirectiveRecord& d, const std::string& state, const std::string& who,
                        const std::string& why, Ops& ops) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Approves `d` by policy when auto mode lists its action and no hold is on.
  void MaybeApproveByPolicyLocked(const RunLoop& run, v1::DirectiveRecord& d, Ops& ops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Submit(Ops ops, std::function<void(absl::Status)> done = {});

  const ClosedLoopConfig config_;
  Store* const store_;
  const Clock* const clock_;
  // trainwatch_directives_total, [action][state], added once.
  std::vector<std::vector<prometheus::Counter*>> counters_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, RunLoop> runs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_CLOSEDLOOP_CLOSED_LOOP_H_
