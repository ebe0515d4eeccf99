// The engine's per-run state, shared by engine.cc and recovery.cc.
#ifndef TRAINWATCH_SERVER_ENGINE_RUN_STATE_H_
#define TRAINWATCH_SERVER_ENGINE_RUN_STATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "alerting/notifier.h"
#include "engine/alert_router.h"
#include "health/health_config.h"
#include "health/run_pipeline.h"
#include "metrics/metrics.h"
#include "store/store.h"

namespace trainwatch {

// Per-run state. `finished` and `finished_unix_nanos` are guarded by
// Engine::mu_; the router and the pipeline are touched only by the run's
// shard thread (or by Create before serving, or by ForgetFinishedRuns once
// nothing else holds the run).
struct RunState {
  RunState(const std::string& id, std::unique_ptr<RunMetrics> run_metrics,
           Store* store, Metrics* metrics, Notifier* notifier,
           HostWatch* hosts, const HealthConfig& config, int64_t now_unix_nanos)
      : run_id(id),
        metrics(std::move(run_metrics)),
        router(id, store, metrics, this->metrics.get(), notifier, hosts),
        pipeline(id, config, &router, now_unix_nanos) {}

  const std::string run_id;
  // Declared before the router and the pipeline, which borrow it.
  std::unique_ptr<RunMetrics> metrics;
  bool finished = false;
  int64_t finished_unix_nanos = 0;  // server clock
  AlertRouter router;
  RunPipeline pipeline;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ENGINE_RUN_STATE_H_
