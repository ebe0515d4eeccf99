// A run's series on /metrics (docs/metrics.md): what its lead's records,
// windows and alerts say, set as the run's pipeline reports them. The alert
// router (engine/alert_router.h) routes a run's alerts and spikes and hands
// this exporter what /metrics shows; it is the one place a run's values are
// set.
//
// Not thread-safe: called on the run's shard thread, as its router is.
#ifndef TRAINWATCH_SERVER_METRICS_RUN_EXPORTER_H_
#define TRAINWATCH_SERVER_METRICS_RUN_EXPORTER_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "health/alert_catalog.h"
#include "health/run/run_health.h"
#include "metrics/metrics.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

class RunExporter {
 public:
  // Both borrowed. `run_metrics` (the run's series) is null for a run not
  // held in memory: then only SetActive is called, and does nothing.
  RunExporter(Metrics* metrics, RunMetrics* run_metrics)
      : metrics_(metrics), run_metrics_(run_metrics) {}

  // trainwatch_alert_active and trainwatch_alerts_fired_total.
  void SetActive(AlertKind kind, bool firing, bool fired);
  // The clip threshold of the lead's RunStart.
  void OnLeadChanged(const v1::RunStart& start);
  // The lead record's counters and last values (optional fields keep the
  // last value reported), its fp8 and MoE reports' worst.
  void OnLeadRecord(const v1::StepRecord& r);
  void OnRecordsAccepted(size_t fresh, uint64_t client_dropped);
  void OnLeadBatchDone(const v1::StepRecord& last, int64_t now_unix_nanos);
  // The windows' quantiles and fractions, step times, goodput.
  void OnWindows(const RunHealth& health);

 private:
  // trainwatch_fp8_*: the worst tensor of a record's fp8 report.
  static void SetFp8Worst(const v1::StepRecord& r, RunMetrics& m);
  // trainwatch_moe_*: the worst layer of an MoE report.
  static void SetMoeWorst(const v1::MoeStats& report, RunMetrics& m);

  Metrics* const metrics_;
  RunMetrics* const run_metrics_;
  // Lost steps already added to trainwatch_lost_steps_total.
  uint64_t exported_skipped_ = 0, exported_rewound_ = 0;
  // The grad norm window's pushes() when its quantiles were last exported.
  std::optional<uint64_t> quantiles_at_;
  // The last MoE report of the batch in progress (its record's, alive until
  // OnLeadBatchDone).
  const v1::MoeStats* last_moe_ = nullptr;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_METRICS_RUN_EXPORTER_H_
