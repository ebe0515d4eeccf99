// Recovery from the store at start-up (Engine::Create): unfinished runs get
// their pipeline back (windows, baselines, alert states) without firing
// again; alerts still stored as firing for finished runs resolve.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/alert_router.h"
#include "engine/engine.h"
#include "engine/run_state.h"
#include "health/alert_catalog.h"
#include "health/run/convert.h"

namespace trainwatch {

absl::Status Engine::Rebuild(RunState& run, const v1::RunSummary& summary) {
  RunMetrics& m = *run.metrics;
  m.last_step.Set(static_cast<double>(summary.last_step()));
  m.last_step_timestamp.Set(static_cast<double>(summary.last_seen_unix_nanos()) * 1e-9);
  if (summary.max_norm() > 0) m.clip_threshold.Set(summary.max_norm());

  absl::StatusOr<v1::RunStart> start = store_->GetLeadStart(summary.run_id());
  if (!start.ok()) return start.status();
  // Idle since its last record, not since this start: a run idle for
  // run_idle_timeout leaves the active set at the timer's next tick.
  if (summary.last_seen_unix_nanos() > 0) {
    run.last_batch_unix_nanos.store(summary.last_seen_unix_nanos(),
                                    std::memory_order_relaxed);
  }
  RunPipeline& pipeline = run.pipeline;
  pipeline.Recover(*start, summary.last_step());
  run.router.SetLabels(*start);
  absl::StatusOr<std::vector<v1::Alert>> firing =
      store_->ListAlerts(summary.run_id(), /*active_only=*/true);
  if (!firing.ok()) return firing.status();
  for (const v1::Alert& a : *firing) {
    // Only the run's own alerts (not HostSuspect, the server's, which stays
    // as stored) are the tracker's.
    const std::optional<AlertKind> kind = AlertKindByName(a.alertname());
    if (!kind.has_value() || *kind == AlertKind::kHostSuspect) continue;
    if (*kind == AlertKind::kClosedLoopExhausted) {  // the router's, not the tracker's
      run.router.Restore(a);
      continue;
    }
    pipeline.RestoreAlert(a);
    run.router.Restore(a);
  }
  // Replay history muted: the first W post-warmup steps give the baselines,
  // the last 2W steps the windows and the EMA. Alerts already stored as
  // firing stay firing; nothing fires again.
  pipeline.BeginReplay();
  const uint64_t w = options_.health.window_steps;
  const uint64_t baseline_end = start->warmup_steps() + w;
  const uint64_t tail_from = summary.last_step() > 2 * w ? summary.last_step() - 2 * w : 0;
  auto feed = [&](v1::StepRecords& chunk) {
    for (const v1::StepRecords::Item& item : chunk.items()) {
      pipeline.Replay(item.attempt(), item.record(), clock_->NowUnixNanos());
    }
    return true;
  };
  const uint32_t lead_rank = pipeline.lead_rank();
  absl::Status s = store_->ReadSteps(summary.run_id(), 0, baseline_end,
                                     lead_rank, 4096, feed);
  if (s.ok() && tail_from > baseline_end) {
    s = store_->ReadSteps(summary.run_id(), tail_from, 0, lead_rank, 4096, feed);
  } else if (s.ok()) {
    s = store_->ReadSteps(summary.run_id(), baseline_end + 1, 0, lead_rank, 4096, feed);
  }
  pipeline.EndReplay();
  return s;
}

absl::Status Engine::ResolveAlertsOfFinishedRuns(
    const std::vector<v1::RunSummary>& runs) {
  absl::StatusOr<std::vector<v1::Alert>> firing =
      store_->ListAlerts("", /*active_only=*/true);
  if (!firing.ok()) return firing.status();
  absl::flat_hash_map<std::string, const v1::RunSummary*> finished;
  for (const v1::RunSummary& summary : runs) {
    if (summary.state() != "running") finished[summary.run_id()] = &summary;
  }
  // One router per run (no series: the run is not held in memory), with the
  // lead RunStart's labels read once.
  absl::flat_hash_map<std::string, std::unique_ptr<AlertRouter>> routers;
  const int64_t now = clock_->NowUnixNanos();
  for (v1::Alert& alert : *firing) {
    auto it = finished.find(alert.run());
    if (it == finished.end()) continue;
    alert.set_state(v1::ALERT_STATE_RESOLVED);
    alert.set_resolved_step(std::max(alert.started_step(), it->second->last_step()));
    alert.set_resolved_unix_nanos(now);
    std::unique_ptr<AlertRouter>& router = routers[alert.run()];
    if (router == nullptr) {
      router = std::make_unique<AlertRouter>(alert.run(), store_, metrics_,
                                             nullptr, notifier_);
      if (router->wants_labels()) {
        absl::StatusOr<v1::RunStart> start = store_->GetLeadStart(alert.run());
        if (start.ok()) router->SetLabels(*start);
      }
    }
    router->Route(std::move(alert));
  }
  return absl::OkStatus();
}

}  // namespace trainwatch
