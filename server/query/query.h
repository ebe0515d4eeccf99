// The API besides ingest: the reads (ListRuns, QuerySteps, ...), answered
// from the store, and the data lifecycle (DeleteRun, Backup). Thread-safe;
// each call may block on disk, so it is served from gRPC's sync thread pool,
// never from the callback threads that carry ingest.
#ifndef TRAINWATCH_SERVER_QUERY_QUERY_H_
#define TRAINWATCH_SERVER_QUERY_QUERY_H_

#include <atomic>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "closedloop/closed_loop.h"
#include "engine/engine.h"
#include "store/store.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

class Query {
 public:
  // `backup_dir`: where Backup stages its copy (the server passes
  // --backup-dir, or the --db's directory).
  Query(const Store* store, Engine* engine, std::string backup_dir = ".",
        ClosedLoop* closed_loop = nullptr)
      : store_(store),
        engine_(engine),
        backup_dir_(std::move(backup_dir)),
        closed_loop_(closed_loop) {}

  absl::StatusOr<v1::ListRunsResponse> ListRuns(
      const v1::ListRunsRequest& request) const;

  // Sends the records in chunks to `sink`, which returns false to stop.
  absl::Status QuerySteps(
      const v1::QueryStepsRequest& request,
      const std::function<bool(const v1::StepRecords&)>& sink) const;

  // The run from the store, its live windows and active alerts from the
  // engine, and every spike with its restart plan.
  absl::StatusOr<v1::GetRunHealthResponse> GetRunHealth(
      const v1::GetRunHealthRequest& request) const;

  absl::StatusOr<v1::ListAlertsResponse> ListAlerts(
      const v1::ListAlertsRequest& request) const;

  // Engine::DeleteRun, for a valid run id.
  absl::StatusOr<v1::DeleteRunResponse> DeleteRun(
      const v1::DeleteRunRequest& request) const;

  // The closed loop (docs/closed-loop.md): a run's directives, by seq; a
  // decision on one (idempotent); a hold on a run's policy approvals.
  // UNIMPLEMENTED on a server without a closed loop.
  absl::StatusOr<v1::ListDirectivesResponse> ListDirectives(
      const v1::ListDirectivesRequest& request) const;
  absl::StatusOr<v1::DirectiveRecord> DecideDirective(const v1::DecideDirectiveRequest& request,
                                                      bool approve, const std::string& who) const;
  absl::StatusOr<v1::HoldRunResponse> HoldRun(const v1::HoldRunRequest& request,
                                              const std::string& who) const;

  // Reference runs (docs/baselines.md): a run's baselines, set (empty:
  // cleared; at most kMaxBaselines of common/validate.h, valid run ids) and shown with where they
  // come from; and the run's bins against them (compare.cc).
  absl::StatusOr<v1::BaselinesResponse> SetBaselines(const v1::SetBaselinesRequest& request) const;
  absl::StatusOr<v1::BaselinesResponse> GetBaselines(const v1::GetBaselinesRequest& request) const;
  absl::StatusOr<v1::CompareRunsResponse> CompareRuns(const v1::CompareRunsRequest& request) const;

  // A consistent copy of the database (Store::Backup into a staging file of
  // backup_dir, mode 0600, created exclusively, unlinked as soon as it is
  // open, so a kill mid-stream leaves nothing), sent to `sink` in chunks of
  // kBackupChunkBytes; `sink` returns false to stop. At most
  // kMaxConcurrentBackups at once (each pins a copy's space):
  // RESOURCE_EXHAUSTED past it, and when the directory is full;
  // FAILED_PRECONDITION when it cannot be written.
  absl::Status Backup(const std::function<bool(const v1::BackupChunk&)>& sink) const;

  // At start: removes staging files a killed server left in backup_dir.
  // Returns how many it removed.
  absl::StatusOr<int> RemoveStaleBackups() const;

  static constexpr size_t kBackupChunkBytes = 1 << 20;
  static constexpr int kMaxConcurrentBackups = 2;

  static constexpr size_t kRecordsPerMessage = 2048;
  // A decision's note and who made it, at most.
  static constexpr size_t kMaxNoteBytes = 1024;
  // A restart plan starts from a checkpoint at least this many steps before
  // the spike (docs/detectors.md).
  static constexpr uint64_t kRestartLeadSteps = trainwatch::kRestartLeadSteps;
  // Hard batches GetRunHealth returns: the last ones.
  static constexpr size_t kMaxHardBatches = 1000;

 private:
  const Store* const store_;
  Engine* const engine_;
  const std::string backup_dir_;
  ClosedLoop* const closed_loop_;  // null: no closed loop
  mutable std::atomic<int> backups_running_{0};
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_QUERY_QUERY_H_
