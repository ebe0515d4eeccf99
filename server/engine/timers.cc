// The engine's timer (Engine::SilenceLoop, every silence_check_interval):
// RunSilent for runs that stopped reporting, ranks declared missing (the
// cross-rank checks stop waiting for them), runs idle for run_idle_timeout
// leaving the active set, and forgetting finished runs
// once their retention has passed.
#include <pthread.h>

#include <memory>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/run_state.h"

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
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace trainwatch
