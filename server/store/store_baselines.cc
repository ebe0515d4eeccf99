// The reads of reference runs (docs/baselines.md): what `trainwatchctl
// baseline set` stored for a run, and the RunStart of one attempt, whose
// warmup and axis a comparison needs.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "store/store.h"

namespace trainwatch {

absl::StatusOr<std::vector<v1::BaselineRef>> Store::GetBaselines(
    const std::string& run_id) const {
  absl::StatusOr<ReadQuery> q = Query(
      "SELECT ref_run, ref_attempt FROM baselines WHERE run_id = ?1 ORDER BY n");
  if (!q.ok()) return q.status();
  q->stmt.Bind(1, run_id);
  std::vector<v1::BaselineRef> out;
  absl::Status status = q->stmt.ForEachRow([&](const sqlite::Stmt& s) {
    v1::BaselineRef& ref = out.emplace_back();
    ref.set_run(std::string(s.Text(0)));
    ref.set_attempt(static_cast<uint32_t>(s.Int(1)));
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, std::vector<v1::BaselineRef>>>>
Store::ListBaselines() const {
  absl::StatusOr<ReadQuery> q =
      Query("SELECT run_id, ref_run, ref_attempt FROM baselines ORDER BY run_id, n");
  if (!q.ok()) return q.status();
  std::vector<std::pair<std::string, std::vector<v1::BaselineRef>>> out;
  absl::Status status = q->stmt.ForEachRow([&](const sqlite::Stmt& s) {
    if (out.empty() || out.back().first != s.Text(0)) {
      out.emplace_back(std::string(s.Text(0)), std::vector<v1::BaselineRef>{});
    }
    v1::BaselineRef& ref = out.back().second.emplace_back();
    ref.set_run(std::string(s.Text(1)));
    ref.set_attempt(static_cast<uint32_t>(s.Int(2)));
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<v1::RunStart> Store::GetAttemptStart(const std::string& run_id,
                                                    uint32_t attempt) const {
  absl::StatusOr<ReadQuery> q = Query(
      "SELECT s.start FROM streams s JOIN runs r ON r.run_key = s.run_key "
      "WHERE r.run_id = ?1 AND s.attempt = ?2 ORDER BY s.rank LIMIT 1");
  if (!q.ok()) return q.status();
  q->stmt.Bind(1, run_id).Bind(2, static_cast<int64_t>(attempt));
  absl::StatusOr<bool> row = q->stmt.Step();
  if (!row.ok()) return row.status();
  if (!*row) {
    return absl::NotFoundError(
        absl::StrCat("run \"", run_id, "\" has no attempt ", attempt));
  }
  v1::RunStart start;
  std::string_view blob = q->stmt.Blob(0);
  if (!start.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
    return absl::DataLossError(absl::StrCat("the RunStart of ", run_id, "@", attempt,
                                            " does not parse"));
  }
  return start;
}

}  // namespace trainwatch
