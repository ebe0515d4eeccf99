// The engine's per-run state, shared by engine.cc and recovery.cc.
#ifndef TRAINWATCH_SERVER_ENGINE_RUN_STATE_H_
#define TRAINWATCH_SERVER_ENGINE_RUN_STATE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "alerting/notifier.h"
#include "engine/alert_router.h"
#include "health/health_config.h"
#include "health/run/run_pipeline.h"
#include "metrics/metrics.h"
#include "store/store.h"

namespace trainwatch {

// Per-run state. `finished`, `finished_unix_nanos` and `quota_token` are
// guarded by
// Engine::mu_; the router and the pipeline are touched only by the run's
// shard thread (or by Create before serving, or by ForgetFinishedRuns once
// nothing else holds the run).
struct RunState {
  RunState(const std::string& id, std::unique_ptr<RunMetrics> run_metrics,
           Store* store, Metrics* metrics, Notifier* notifier,
           HostWatch* hosts, ClosedLoop* closed_loop, const HealthConfig& config,
           int64_t now_unix_nanos)
      : run_id(id),
        metrics(std::move(run_metrics)),
        router(id, store, metrics, this->metrics.get(), notifier, hosts, closed_loop),
        pipeline(id, config, &router, now_unix_nanos),
        last_batch_unix_nanos(now_unix_nanos) {}

  const std::string run_id;
  // Declared before the router and the pipeline, which borrow it.
  std::unique_ptr<RunMetrics> metrics;
  bool finished = false;
  int64_t finished_unix_nanos = 0;  // server clock
  // The token whose runs:N quota this active run counts against.
  std::optional<int> quota_token;
  AlertRouter router;
  RunPipeline pipeline;
  // Report streams of the run whose reactor has not ended (Stream::Close):
  // DeleteRun refuses while one is open, and waits out the work queued for
  // streams that have closed.
  std::atomic<int> open_streams{0};
  // When a batch of the run last arrived (server clock), for
  // run_idle_timeout; written by any stream's thread, read by the timer.
  std::atomic<int64_t> last_batch_unix_nanos{0};
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ENGINE_RUN_STATE_H_
