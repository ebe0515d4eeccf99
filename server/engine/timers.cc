// The engine's timer (Engine::SilenceLoop, every silence_check_interval):
// RunSilent for runs that stopped reporting, ranks declared missing (the
// cross-rank checks stop waiting for them), runs idle for run_idle_timeout
// leaving the active set, forgetting finished runs once their retention has
// passed, and deleting runs --retention-days no longer keeps (with
// DeleteRun, which trainwatchctl delete-run calls too).
#include <pthread.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/run_state.h"
#include "absl/synchronization/notification.h"
#include "absl/strings/str_cat.h"

namespace trainwatch {

void Engine::CheckSilence() {
  const int64_t now = clock_->NowUnixNanos();
  std::vector<std::shared_ptr<RunState>> runs;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, run] : runs_) {
      if (!run->finished) runs.push_back(run);
    }
  }
  for (std::shared_ptr<RunState>& run : runs) {
    ShardFor(run->run_id)->Post([run = std::move(run), now] {
      run->pipeline.OnTick(now);
      run->pipeline.CheckRanks(now);
    });
  }
}

void Engine::RetireIdleRuns() {
  if (options_.run_idle_timeout.count() <= 0) return;
  const int64_t now = clock_->NowUnixNanos();
  const int64_t idle =
      std::chrono::duration_cast<std::chrono::nanoseconds>(options_.run_idle_timeout)
          .count();
  absl::MutexLock lock(&mu_);
  for (auto& [id, run] : runs_) {
    if (!run->finished &&
        now - run->last_batch_unix_nanos.load(std::memory_order_relaxed) >= idle) {
      // Leaves the active set as a finished run does; a new batch brings
      // it back (FindOrAddRunLocked).
      MarkFinishedLocked(*run);
    }
  }
}

void Engine::ForgetFinishedRuns() {
  const int64_t now = clock_->NowUnixNanos();
  const int64_t keep = options_.health.finished_runs.retention_seconds * 1'000'000'000;
  std::vector<std::shared_ptr<RunState>> forgotten;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = runs_.begin(); it != runs_.end();) {
      const RunState& run = *it->second;
      // use_count 1: no stream, nor work queued on a shard, holds the run,
      // and new holders take it only from runs_, under mu_.
      if (run.finished && now - run.finished_unix_nanos >= keep &&
          it->second.use_count() == 1) {
        forgotten.push_back(std::move(it->second));
        runs_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  // Nothing else can reach these runs now, so this thread may touch them:
  // their firing alerts resolve (stored, sent, exported).
  for (std::shared_ptr<RunState>& run : forgotten) run->pipeline.ResolveAll(now);
  // Destroying a run removes its series from /metrics.
}

absl::StatusOr<v1::DeleteRunResponse> Engine::DeleteRun(const std::string& run_id) {
  std::shared_ptr<RunState> run;
  {
    absl::MutexLock lock(&mu_);
    if (!deleting_.insert(run_id).second) {
      return absl::FailedPreconditionError(
          absl::StrCat("run ", run_id, " is being deleted already"));
    }
    auto it = runs_.find(run_id);
    if (it != runs_.end()) {
      // use_count 1: no stream, nor work queued on a shard, holds the run.
      if (it->second.use_count() > 1) {
        deleting_.erase(run_id);
        return absl::FailedPreconditionError(absl::StrCat(
            "run ", run_id,
            " has an open stream: stop its trainers (or wait until they end) "
            "and delete it then"));
      }
      if (!it->second->finished) MarkFinishedLocked(*it->second);
      run = std::move(it->second);
      runs_.erase(it);
    }
  }
  // Nothing else can reach the run now: its firing alerts resolve (sent and
  // stored before the delete below), and destroying it removes its series.
  if (run != nullptr) {
    run->pipeline.ResolveAll(clock_->NowUnixNanos());
    run.reset();
  }
  absl::Notification committed;
  WriteResult result;
  store_->Submit(WriteOp{.key = StreamKey{.run_id = run_id},
                         .body = WriteOp::DeleteRun{},
                         .received_unix_nanos = clock_->NowUnixNanos(),
                         .done = [&](WriteResult r) {
                           result = std::move(r);
                           committed.Notify();
                         }});
  committed.WaitForNotification();
  {
    absl::MutexLock lock(&mu_);
    deleting_.erase(run_id);
  }
  if (!result.status.ok()) return result.status;
  v1::DeleteRunResponse out;
  out.set_records(result.stored);
  out.set_alerts(result.deleted_alerts);
  return out;
}

void Engine::ApplyRetention() {
  if (options_.retention_days == 0) return;
  const int64_t now = clock_->NowUnixNanos();
  if (now < next_retention_unix_nanos_) return;
  next_retention_unix_nanos_ =
      now + std::chrono::duration_cast<std::chrono::nanoseconds>(
                options_.retention_check_interval)
                .count();
  const int64_t cutoff = now - int64_t{options_.retention_days} * 86400 * 1'000'000'000;
  absl::StatusOr<std::vector<v1::RunSummary>> runs = store_->ListRuns();
  if (!runs.ok()) {
    std::fprintf(stderr, "trainwatch-server: retention: listing runs: %s\n",
                 std::string(runs.status().message()).c_str());
    return;
  }
  for (const v1::RunSummary& r : *runs) {
    if (r.last_seen_unix_nanos() >= cutoff) continue;
    absl::StatusOr<v1::DeleteRunResponse> deleted = DeleteRun(r.run_id());
    // A run with an open stream is kept: it is not over.
    if (deleted.ok()) {
      std::fprintf(stderr,
                   "trainwatch-server: retention: deleted run %s (last record %u "
                   "days ago or more; %llu records)\n",
                   r.run_id().c_str(), options_.retention_days,
                   static_cast<unsigned long long>(deleted->records()));
    }
  }
}

void Engine::SilenceLoop() {
  pthread_setname_np(pthread_self(), "tw-silence");
  mu_.Lock();
  while (!stopping_) {
    stop_cv_.WaitWithTimeout(&mu_, absl::FromChrono(options_.silence_check_interval));
    if (stopping_) break;
    mu_.Unlock();
    CheckSilence();
    RetireIdleRuns();
    ForgetFinishedRuns();
    ApplyRetention();
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace trainwatch
