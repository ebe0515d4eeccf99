// HostSuspect on one server (HostSuspectDetector, docs/detectors.md): every
// alert that implicates a host (NonFiniteUpdate, LossSpike, RankStraggler)
// is an incident, counted on /metrics
// (trainwatch_host_incidents_total{host,alertname}, for the fleet-wide
// Prometheus rule), stored (so a restart remembers the day's incidents), and
// judged by the detector: when a host becomes suspect, the alert that tipped
// it over is followed by a HostSuspect alert of its run.
//
// Thread-safe: runs on different shards report here.
#ifndef TRAINWATCH_SERVER_ENGINE_HOST_WATCH_H_
#define TRAINWATCH_SERVER_ENGINE_HOST_WATCH_H_

#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "health/alert_catalog.h"
#include "health/detectors/host_suspect.h"
#include "metrics/metrics.h"
#include "store/store.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

class HostWatch {
 public:
  // All borrowed.
  HostWatch(const HostSuspectConfig& config, Store* store, Metrics* metrics)
      : window_nanos_(config.window_seconds * 1'000'000'000),
        detector_(config),
        store_(store),
        metrics_(metrics) {}

  // At start: the stored incidents of the last window (no alert is raised
  // again for a host that was already suspect).
  absl::Status Load(int64_t now_unix_nanos);

  // `fired`, an alert of `kind`, just fired. Returns the HostSuspect alert
  // to route when it makes its host suspect.
  std::optional<v1::Alert> OnAlertFired(AlertKind kind, const v1::Alert& fired);

  // A deleted run: its incidents are forgotten (no later HostSuspect names
  // it) and taken off trainwatch_host_incidents_total; a series left at
  // zero is removed. (The stored incidents go with the run's rows.)
  void ForgetRun(const std::string& run_id);

 private:
  const int64_t window_nanos_;
  absl::Mutex mu_;
  HostSuspectDetector detector_ ABSL_GUARDED_BY(mu_);
  Store* const store_;
  Metrics* const metrics_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ENGINE_HOST_WATCH_H_
