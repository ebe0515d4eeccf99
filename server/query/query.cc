#include "query/query.h"

#include "absl/strings/str_cat.h"
#include "common/validate.h"

namespace trainwatch {

absl::StatusOr<v1::ListRunsResponse> Query::ListRuns(
    const v1::ListRunsRequest& request) const {
  absl::StatusOr<std::vector<v1::RunSummary>> runs = store_->ListRuns();
  if (!runs.ok()) return runs.status();
  v1::ListRunsResponse response;
  for (v1::RunSummary& run : *runs) response.add_runs()->Swap(&run);
  return response;
}

absl::Status Query::QuerySteps(
    const v1::QueryStepsRequest& request,
    const std::function<bool(const v1::StepRecords&)>& sink) const {
  if (absl::Status s = ValidateRunId(request.run_id()); !s.ok()) return s;
  if (request.to_step() != 0 && request.to_step() < request.from_step()) {
    return absl::InvalidArgumentError(
        absl::StrCat("to_step ", request.to_step(), " is below from_step ",
                     request.from_step()));
  }
  std::optional<uint32_t> rank;
  if (request.has_rank()) rank = request.rank();
  return store_->ReadSteps(request.run_id(), request.from_step(),
                           request.to_step(), rank, kRecordsPerMessage,
                           [&](v1::StepRecords& chunk) { return sink(chunk); });
}

}  // namespace trainwatch
