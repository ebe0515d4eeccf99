// The body of Alertmanager's v2 API (POST /api/v2/alerts): a JSON array of
// postable alerts, shaped the way Prometheus sends them. A pure function, so
// the shape is unit-tested without a network.
#ifndef TRAINWATCH_SERVER_ALERTING_ALERTMANAGER_PAYLOAD_H_
#define TRAINWATCH_SERVER_ALERTING_ALERTMANAGER_PAYLOAD_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

// The alerts endpoint under an Alertmanager base URL (a trailing '/' is
// allowed): BASE/api/v2/alerts.
std::string AlertmanagerAlertsUrl(const std::string& base_url);

// labels: alertname, run, severity and the run's labels (run_labels) (the three reserved
// names win a clash, so a run label cannot rename or reroute an alert);
// annotations: summary, description, likely_cause, fix, started_step and,
// when there are any, batch_ids (comma-separated). startsAt is the fire time.
// A firing alert's endsAt is now + 4 x the resend interval, as Prometheus
// does: if trainwatch dies, Alertmanager resolves the alert by itself once
// four resends are missed. A resolved alert's endsAt is its resolve time.
std::string AlertmanagerPayload(const std::vector<const v1::Alert*>& alerts,
                                int64_t now_unix_nanos,
                                std::chrono::nanoseconds resend_interval);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ALERTING_ALERTMANAGER_PAYLOAD_H_
