// The body of the plain JSON webhook (--webhook-url), for teams without
// Alertmanager: one object per fire or resolve. A pure function, so the shape
// is unit-tested without a network.
#ifndef TRAINWATCH_SERVER_ALERTING_WEBHOOK_PAYLOAD_H_
#define TRAINWATCH_SERVER_ALERTING_WEBHOOK_PAYLOAD_H_

#include <string>

#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

// {status: firing|resolved, alertname, run, severity, labels (the run's
// labels), summary, description, likely_cause, fix, started_step,
// resolved_step, peak_value, batch_ids, started_at, resolved_at}. While
// firing, resolved_step and resolved_at are null; a non-finite peak_value is
// null (JSON has no NaN).
std::string WebhookPayload(const v1::Alert& alert);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ALERTING_WEBHOOK_PAYLOAD_H_
