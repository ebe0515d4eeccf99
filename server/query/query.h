// Read-side of the API (ListRuns, QuerySteps, ...), answered from the store.
// Thread-safe; each call may block on disk, so it is served from gRPC's sync
// thread pool, never from the callback threads that carry ingest.
#ifndef TRAINWATCH_SERVER_QUERY_QUERY_H_
#define TRAINWATCH_SERVER_QUERY_QUERY_H_

#include <functional>

#include "absl/status/statusor.h"
#include "store/store.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

class Query {
 public:
  explicit Query(const Store* store) : store_(store) {}

  absl::StatusOr<v1::ListRunsResponse> ListRuns(
      const v1::ListRunsRequest& request) const;

  // Sends the records in chunks to `sink`, which returns false to stop.
  absl::Status QuerySteps(
      const v1::QueryStepsRequest& request,
      const std::function<bool(const v1::StepRecords&)>& sink) const;

  static constexpr size_t kRecordsPerMessage = 2048;

 private:
  const Store* const store_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_QUERY_QUERY_H_
