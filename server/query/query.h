// The API besides ingest: the reads (ListRuns, QuerySteps, ...), answered
// from the store, and the data lifecycle (DeleteRun, Backup). Thread-safe;
// each call may block on disk, so it is served from gRPC's sync thread pool,
// never from the callback threads that carry ingest.
#ifndef TRAINWATCH_SERVER_QUERY_QUERY_H_
#define TRAINWATCH_SERVER_QUERY_QUERY_H_

#include <functional>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "store/store.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

class Query {
 public:
  Query(const Store* store, Engine* engine) : store_(store), engine_(engine) {}

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

  // A consistent copy of the database (Store::Backup into a temporary
  // file), sent to `sink` in chunks of kBackupChunkBytes; `sink` returns
  // false to stop.
  absl::Status Backup(const std::function<bool(const v1::BackupChunk&)>& sink) const;

  static constexpr size_t kBackupChunkBytes = 1 << 20;

  static constexpr size_t kRecordsPerMessage = 2048;
  // A restart plan starts from a checkpoint at least this many steps before
  // the spike (docs/detectors.md).
  static constexpr uint64_t kRestartLeadSteps = 100;

 private:
  const Store* const store_;
  Engine* const engine_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_QUERY_QUERY_H_
