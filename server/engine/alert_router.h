// Where what a run's pipeline reports goes: alert fires and resolves to the
// store, /metrics and the notifier (Alertmanager, webhook); spikes to the
// store; the run's record and window figures to /metrics through its
// RunExporter (metrics/run_exporter.h). The one path every
// alert leaves by, also the resolves the engine sends at start-up for runs
// that finished before a restart.
//
// Not thread-safe: a run's router is called on the run's shard thread (or
// before serving, or once nothing else holds the run). The store and the
// notifier it hands work to are thread-safe and only enqueue.
#ifndef TRAINWATCH_SERVER_ENGINE_ALERT_ROUTER_H_
#define TRAINWATCH_SERVER_ENGINE_ALERT_ROUTER_H_

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "alerting/notifier.h"
#include "closedloop/closed_loop.h"
#include "engine/host_watch.h"
#include "health/run/run_pipeline.h"
#include "metrics/metrics.h"
#include "metrics/run_exporter.h"
#include "store/store.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

class AlertRouter final : public RunObserver {
 public:
  // All borrowed. `run_metrics` (the run's series) is null for a run not held
  // in memory; `notifier` may be null.
  AlertRouter(std::string run_id, Store* store, Metrics* metrics,
              RunMetrics* run_metrics, Notifier* notifier,
              HostWatch* hosts = nullptr, ClosedLoop* closed_loop = nullptr);

  // The lead RunStart's labels, sent with every notification.
  void SetLabels(const v1::RunStart& lead);
  bool wants_labels() const { return notifier_ != nullptr; }

  // Stores a fire or resolve and hands it to the notifier.
  void Route(v1::Alert alert);
  // An alert stored as firing before a restart: exported as firing and
  // re-sent to Alertmanager (which forgets an alert that is not re-sent),
  // not stored again.
  void Restore(const v1::Alert& firing);

  // RunObserver.
  void OnAlert(AlertKind kind, const v1::Alert& alert, bool update) override;
  void OnSpike(const SpikeInfo& spike) override;
  void OnLeadChanged(const v1::RunStart& start) override;
  void OnLeadRecord(const v1::StepRecord& record) override;
  void OnRecordsAccepted(size_t fresh, uint64_t client_dropped) override;
  void OnLeadBatchDone(const v1::StepRecord& last,
                       int64_t now_unix_nanos) override;
  void OnWindows(const RunHealth& health) override;
  void OnSpikeOutcome(const SpikeOutcome& outcome) override;

 private:
  // `alert` with the run's labels, as the notifier sends it.
  v1::Alert Labelled(const v1::Alert& alert) const;
  // ClosedLoopExhausted, caused by `cause`, unless it fires already; it
  // resolves when the run's lead starts a later attempt.
  std::optional<v1::Alert> Exhausted(const v1::Alert& cause, const std::string& reason);

  const std::string run_id_;
  Store* const store_;
  RunExporter exporter_;  // the run's series on /metrics
  Notifier* const notifier_;
  HostWatch* const hosts_;
  ClosedLoop* const closed_loop_;  // null: no closed loop
  // What the closed loop needs of the lead: its attempt and recent batch ids.
  uint32_t lead_attempt_ = 0;
  RecentBatches recent_batches_;
  // Per alert the closed loop proposed a directive for, the episode
  // (started_step) whose description names it, and that sentence: kept on
  // its updates. Few runs have any (an array of every alert's was ~1.8 KB a
  // run).
  struct DirectiveNote {
    AlertKind kind;
    uint64_t started_step = 0;
    std::string text;
  };
  std::vector<DirectiveNote> directive_notes_;
  struct ExhaustedEpisode {
    v1::Alert alert;
    uint32_t attempt = 0;  // the lead's when it fired
  };
  std::optional<ExhaustedEpisode> exhausted_;
  google::protobuf::Map<std::string, std::string> labels_;
  // The started_step of each alert's episode counted as a host incident.
  std::array<std::optional<uint64_t>, kAlertKindCount> incident_counted_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ENGINE_ALERT_ROUTER_H_
