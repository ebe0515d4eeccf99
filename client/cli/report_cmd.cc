// `trainwatchctl report --run R --out FILE.html`: gathers the run's health,
// alerts and lead-rank history from the server and writes report.h's page.

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/commands.h"
#include "cli/fleet.h"
#include "report/report.h"

namespace trainwatch::cli {
namespace {

constexpr std::chrono::milliseconds kUnaryDeadline{30'000};
constexpr std::chrono::milliseconds kStreamDeadline{600'000};

// The lead rank's records (the lowest rank), the latest attempt winning per
// step: what the run-level health follows.
absl::StatusOr<std::vector<v1::StepRecord>> LeadRecords(
    const GlobalOptions& global, const std::string& run_id) {
  v1::QueryStepsRequest request;
  request.set_run_id(run_id);
  auto context = NewContext(global, kStreamDeadline);
  auto stub = NewStub(global);
  std::unique_ptr<grpc::ClientReader<v1::StepRecords>> reader =
      stub->QuerySteps(context.get(), request);
  std::optional<uint32_t> lead;
  std::map<uint64_t, std::pair<uint32_t, v1::StepRecord>> by_step;
  v1::StepRecords chunk;
  while (reader->Read(&chunk)) {
    for (v1::StepRecords::Item& item : *chunk.mutable_items()) {
      if (!lead.has_value() || item.rank() < *lead) {
        if (lead.has_value()) by_step.clear();
        lead = item.rank();
      }
      if (item.rank() != *lead) continue;
      const uint64_t step = item.record().step();
      auto it = by_step.find(step);
      if (it != by_step.end() && it->second.first > item.attempt()) continue;
      by_step[step] = {item.attempt(), std::move(*item.mutable_record())};
    }
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return RpcError("report", "QuerySteps", status);
  std::vector<v1::StepRecord> records;
  records.reserve(by_step.size());
  for (auto& [step, entry] : by_step) records.push_back(std::move(entry.second));
  return records;
}

}  // namespace

absl::Status RunReport(const GlobalOptions& fleet, const ParsedArgs& args) {
  if (absl::Status s = NoArguments(args); !s.ok()) return s;
  absl::StatusOr<std::string> run = RequiredFlag(args, "run");
  if (!run.ok()) return run.status();
  // With --server A,B,C: the server that holds the run.
  absl::StatusOr<GlobalOptions> aimed = ForRun(fleet, "report", *run);
  if (!aimed.ok()) return aimed.status();
  const GlobalOptions& global = *aimed;
  absl::StatusOr<std::string> out_path = RequiredFlag(args, "out");
  if (!out_path.ok()) return out_path.status();

  ReportInput input;
  {
    v1::GetRunHealthRequest request;
    request.set_run_id(*run);
    auto context = NewContext(global, kUnaryDeadline);
    grpc::Status status = NewStub(global)->GetRunHealth(context.get(), request,
                                                        &input.health);
    if (!status.ok()) return RpcError("report", "GetRunHealth", status);
  }
  {
    v1::ListAlertsRequest request;
    request.set_run_id(*run);
    v1::ListAlertsResponse response;
    auto context = NewContext(global, kUnaryDeadline);
    grpc::Status status =
        NewStub(global)->ListAlerts(context.get(), request, &response);
    if (!status.ok()) return RpcError("report", "ListAlerts", status);
    input.alerts.assign(response.alerts().begin(), response.alerts().end());
  }
  {
    // The loss against its baselines, when it has any (none, or none
    // stored: no band, not an error).
    v1::CompareRunsRequest request;
    request.set_run_id(*run);
    request.set_metric("loss");
    auto context = NewContext(global, kUnaryDeadline);
    grpc::Status status = NewStub(global)->CompareRuns(context.get(), request, &input.baseline);
    if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
        status.error_code() == grpc::StatusCode::NOT_FOUND) {
      input.baseline.Clear();
    } else if (!status.ok()) {
      return RpcError("report", "CompareRuns", status);
    }
  }
  absl::StatusOr<std::vector<v1::StepRecord>> records =
      LeadRecords(global, *run);
  if (!records.ok()) return records.status();
  input.records = *std::move(records);

  const std::string html = RenderReport(input);
  std::ofstream out(*out_path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::NotFoundError(absl::StrCat("report: cannot write ", *out_path,
                                            ": ", std::strerror(errno)));
  }
  out << html;
  out.close();
  if (!out) {
    return absl::DataLossError(absl::StrCat("report: writing ", *out_path,
                                            " failed: ", std::strerror(errno)));
  }
  WriteStdout(absl::StrFormat(
      "wrote %s: %d steps, %d alerts, %d spikes, %d KiB\n", *out_path,
      input.records.size(), input.alerts.size(), input.health.spikes_size(),
      html.size() / 1024));
  return absl::OkStatus();
}

}  // namespace trainwatch::cli
