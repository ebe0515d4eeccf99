// The engine's timer (Engine::SilenceLoop, every silence_check_interval):
// RunSilent for runs that stopped reporting, ranks declared missing (the
// cross-rank checks stop waiting for them), runs idle for run_idle_timeout
// leaving the active set, forgetting finished runs once their retention has
// passed, and deleting runs --retention-days no longer keeps (with
// DeleteRun, which trainwatchctl delete-run calls too).
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <limits>
#include <thread>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/run_state.h"
#include "absl/synchronization/notification.h"
#include "absl/strings/str_cat.h"

namespace trainwatch {
namespace {

// Retention looks again this soon after a run it would delete had a stream
// open (it may have been closing).
constexpr std::chrono::seconds kRetentionRetry{30};

// Whether `run` is held by nothing but the caller within a few seconds
// (nothing can take a new hold: the caller took it out of the engine's map).
bool WaitUntilSoleHolder(const std::shared_ptr<RunState>& run) {
  constexpr auto kPoll = std::chrono::milliseconds(1);
  constexpr int kPolls = 10'000;
  for (int i = 0; i < kPolls; ++i) {
    if (run.use_count() == 1) {
      std::atomic_thread_fence(std::memory_order_acquire);
      return true;
    }
    std::this_thread::sleep_for(kPoll);
  }
  return false;
}

}  // namespace

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
      if (it->second->open_streams.load() > 0) {
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
  // No one can take the run now (it is out of runs_, and deleting_ refuses
  // new streams); work still queued for its closed streams, or a health read,
  // may hold it for a moment: wait until they are done.
  if (run != nullptr && !WaitUntilSoleHolder(run)) {
    absl::MutexLock lock(&mu_);
    runs_.emplace(run_id, std::move(run));
    deleting_.erase(run_id);
    return absl::UnavailableError(absl::StrCat(
        "run ", run_id, " is still busy with its last batches; retry"));
  }
  // Its firing alerts resolve (sent and stored before the delete below),
  // and destroying it removes its series.
  if (run != nullptr) {
    run->pipeline.ResolveAll(clock_->NowUnixNanos());
    run.reset();
  }
  host_watch_.ForgetRun(run_id);
  if (closed_loop_ != nullptr) closed_loop_->ForgetRun(run_id);
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
    if (result.status.ok()) set_baselines_.erase(run_id);  // deleted with the run
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
  // Saturating: a cutoff before the epoch keeps every run (the flag is at
  // most 100 years, so this is the second line of defence, not the first).
  constexpr int64_t kNanosPerDay = int64_t{86400} * 1'000'000'000;
  const int64_t days = int64_t{options_.retention_days};
  const int64_t cutoff =
      days > now / kNanosPerDay ? std::numeric_limits<int64_t>::min()
                                : now - days * kNanosPerDay;
  absl::StatusOr<std::vector<v1::RunSummary>> runs = store_->ListRuns();
  if (!runs.ok()) {
    std::fprintf(stderr, "trainwatch-server: retention: listing runs: %s\n",
                 std::string(runs.status().message()).c_str());
    return;
  }
  for (const v1::RunSummary& r : *runs) {
    if (r.last_seen_unix_nanos() >= cutoff) continue;
    absl::StatusOr<v1::DeleteRunResponse> deleted = DeleteRun(r.run_id());
    // A run with an open stream is kept: it is not over. Its stream may be
    // closing as we look: look again soon rather than a whole interval on.
    if (absl::IsFailedPrecondition(deleted.status())) {
      next_retention_unix_nanos_ = std::min(
          next_retention_unix_nanos_,
          now + std::chrono::duration_cast<std::chrono::nanoseconds>(kRetentionRetry).count());
    }
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
