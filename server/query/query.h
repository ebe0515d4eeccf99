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
#include "engine/engine.h"
#include "store/store.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

class Query {
 public:
  // `backup_dir`: where Backup stages its copy (the server passes
  // --backup-dir, or the --db's directory).
  Query(const Store* store, Engine* engine, std::string backup_dir = ".")
      : store_(store), engine_(engine), backup_dir_(std::move(backup_dir)) {}

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
  // A restart plan starts from a checkpoint at least this many steps before
  // the spike (docs/detectors.md).
  static constexpr uint64_t kRestartLeadSteps = 100;
  // Hard batches GetRunHealth returns: the last ones.
  static constexpr size_t kMaxHardBatches = 1000;

 private:
  const Store* const store_;
  Engine* const engine_;
  const std::string backup_dir_;
  mutable std::atomic<int> backups_running_{0};
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_QUERY_QUERY_H_
