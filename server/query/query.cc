#include "query/query.h"

#include <string>

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

absl::StatusOr<v1::GetRunHealthResponse> Query::GetRunHealth(
    const v1::GetRunHealthRequest& request) const {
  if (absl::Status s = ValidateRunId(request.run_id()); !s.ok()) return s;
  absl::StatusOr<v1::RunSummary> run = store_->GetRun(request.run_id());
  if (!run.ok()) return run.status();
  v1::GetRunHealthResponse response;
  absl::StatusOr<HealthSnapshot> live = engine_->GetHealth(request.run_id());
  if (live.ok()) {
    *response.mutable_window() = live->window;
    response.mutable_slowest_ranks()->Swap(live->timing.mutable_slowest_ranks());
    if (live->timing.has_goodput()) {
      response.mutable_goodput()->Swap(live->timing.mutable_goodput());
    }
    for (v1::Alert& a : live->active_alerts) response.add_active_alerts()->Swap(&a);
    if (live->recommended_max_norm.has_value()) {
      response.set_recommended_max_norm(*live->recommended_max_norm);
    }
  } else if (absl::IsNotFound(live.status())) {
    // No live health (a finished run the engine forgot, or one it has not
    // loaded): the stored firing alerts are what `alerts --active` lists.
    absl::StatusOr<std::vector<v1::Alert>> firing =
        store_->ListAlerts(request.run_id(), /*active_only=*/true);
    if (!firing.ok()) return firing.status();
    for (v1::Alert& a : *firing) response.add_active_alerts()->Swap(&a);
  } else {
    return live.status();
  }
  run->set_active_alerts(static_cast<uint32_t>(response.active_alerts_size()));
  *response.mutable_run() = std::move(*run);

  absl::StatusOr<std::vector<v1::Spike>> spikes = store_->ListSpikes(request.run_id());
  if (!spikes.ok()) return spikes.status();
  absl::StatusOr<std::vector<v1::RunEvent>> events = store_->ListEvents(request.run_id());
  if (!events.ok()) return events.status();
  for (v1::Spike& spike : *spikes) {
    // The last checkpoint at least kRestartLeadSteps before the spike.
    if (const v1::RunEvent* checkpoint = PlanCheckpoint(*events, spike.step());
        checkpoint != nullptr) {
      spike.set_restart_from_step(checkpoint->step());
      spike.set_restart_checkpoint(checkpoint->detail());
    }
    response.add_spikes()->Swap(&spike);
  }
  absl::StatusOr<std::vector<v1::HardBatch>> hard =
      store_->ListHardBatches(request.run_id(), kMaxHardBatches);
  if (!hard.ok()) return hard.status();
  for (v1::HardBatch& h : *hard) response.add_hard_batches()->Swap(&h);
  return response;
}

absl::StatusOr<v1::ListAlertsResponse> Query::ListAlerts(
    const v1::ListAlertsRequest& request) const {
  if (!request.run_id().empty()) {
    if (absl::Status s = ValidateRunId(request.run_id()); !s.ok()) return s;
  }
  absl::StatusOr<std::vector<v1::Alert>> alerts =
      store_->ListAlerts(request.run_id(), request.active_only());
  if (!alerts.ok()) return alerts.status();
  v1::ListAlertsResponse response;
  for (v1::Alert& a : *alerts) response.add_alerts()->Swap(&a);
  return response;
}

absl::StatusOr<v1::ListDirectivesResponse> Query::ListDirectives(
    const v1::ListDirectivesRequest& request) const {
  if (absl::Status s = ValidateRunId(request.run_id()); !s.ok()) return s;
  v1::ListDirectivesResponse response;
  if (closed_loop_ == nullptr) return response;
  for (v1::DirectiveRecord& d : closed_loop_->List(request.run_id())) {
    response.add_directives()->Swap(&d);
  }
  return response;
}

absl::StatusOr<v1::DirectiveRecord> Query::DecideDirective(
    const v1::DecideDirectiveRequest& request, bool approve, const std::string& who) const {
  if (closed_loop_ == nullptr) {
    return absl::UnimplementedError("this server has no closed loop");
  }
  if (request.note().size() > kMaxNoteBytes) {
    return absl::InvalidArgumentError(absl::StrCat("--note is over ", kMaxNoteBytes, " bytes"));
  }
  return closed_loop_->Decide(request.id(), approve, who, request.note());
}

absl::StatusOr<v1::HoldRunResponse> Query::HoldRun(const v1::HoldRunRequest& request,
                                                   const std::string& who) const {
  if (absl::Status s = ValidateRunId(request.run_id()); !s.ok()) return s;
  if (closed_loop_ == nullptr) {
    return absl::UnimplementedError("this server has no closed loop");
  }
  v1::HoldRunResponse response;
  response.set_until_unix_nanos(closed_loop_->Hold(request.run_id(), request.seconds(), who));
  return response;
}

absl::StatusOr<v1::DeleteRunResponse> Query::DeleteRun(
    const v1::DeleteRunRequest& request) const {
  if (absl::Status s = ValidateRunId(request.run_id()); !s.ok()) return s;
  return engine_->DeleteRun(request.run_id());
}

}  // namespace trainwatch
