#include "alerting/webhook_payload.h"

#include <cmath>

#include <nlohmann/json.hpp>

namespace trainwatch {

std::string WebhookPayload(const AlertNotice& a) {
  nlohmann::json out = {
      {"status", a.firing ? "firing" : "resolved"},
      {"alertname", a.alertname},
      {"run", a.run},
      {"severity", a.severity},
      {"labels", nlohmann::json(a.run_labels)},
      {"summary", a.summary},
      {"description", a.description},
      {"likely_cause", a.likely_cause},
      {"fix", a.fix},
      {"started_step", a.started_step},
      {"onset_step", a.onset_step},
      {"caused_by", a.caused_by},
      {"resolved_step", nullptr},
      {"peak_value", nullptr},
      {"batch_ids", a.batch_ids},
      {"started_at", FormatRfc3339(a.started_unix_nanos)},
      {"resolved_at", nullptr},
  };
  if (std::isfinite(a.peak_value)) out["peak_value"] = a.peak_value;
  if (!a.firing) {
    out["resolved_step"] = a.resolved_step;
    out["resolved_at"] = FormatRfc3339(a.resolved_unix_nanos);
  }
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace trainwatch
