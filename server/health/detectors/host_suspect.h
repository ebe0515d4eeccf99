// HostSuspect (docs/detectors.md): a lemon machine, named by NonFiniteUpdate,
// LossSpike or RankStraggler alerts of at least two different runs within a
// day (HostIncidents keeps the count).
#ifndef TRAINWATCH_SERVER_HEALTH_DETECTORS_HOST_SUSPECT_H_
#define TRAINWATCH_SERVER_HEALTH_DETECTORS_HOST_SUSPECT_H_

#include "health/detector.h"
#include "health/detectors/host_incidents.h"

namespace trainwatch {

// HostSuspect, the one server-wide detector: one for all the runs of a
// server, fed every alert that fires (OnAlertFired) on the thread of the
// caller, which serializes.
class HostSuspectDetector final : public Detector {
 public:
  explicit HostSuspectDetector(const HostSuspectConfig& config)
      : incidents_(config) {}

  // An alert implicating a host fired: an incident; fires HostSuspect on
  // the alert's run when it makes the host suspect.
  void OnAlertFired(const FiredContext& ctx, AlertSink& sink) override;
  // The incidents, to load the stored ones at start.
  HostIncidents& incidents() { return incidents_; }

 private:
  HostIncidents incidents_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_DETECTORS_HOST_SUSPECT_H_
