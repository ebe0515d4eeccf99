#include "alerting/webhook_payload.h"

#include <cmath>
#include <vector>

#include <nlohmann/json.hpp>

#include "alerting/time_format.h"
#include "trainwatch/v1/alert_names.h"

namespace trainwatch {

std::string WebhookPayload(const v1::Alert& a) {
  nlohmann::json labels = nlohmann::json::object();
  for (const auto& [k, v] : a.run_labels()) labels[k] = v;
  nlohmann::json out = {
      {"status", std::string(v1::StateName(a.state()))},
      {"alertname", a.alertname()},
      {"run", a.run()},
      {"severity", std::string(v1::SeverityName(a.severity()))},
      {"labels", std::move(labels)},
      {"summary", a.summary()},
      {"description", a.description()},
      {"likely_cause", a.likely_cause()},
      {"fix", a.fix()},
      {"started_step", a.started_step()},
      {"onset_step", a.onset_step()},
      {"caused_by", a.caused_by()},
      {"resolved_step", nullptr},
      {"peak_value", nullptr},
      {"batch_ids", std::vector<int64_t>(a.batch_ids().begin(), a.batch_ids().end())},
      {"started_at", FormatRfc3339(a.started_unix_nanos())},
      {"resolved_at", nullptr},
  };
  if (std::isfinite(a.peak_value())) out["peak_value"] = a.peak_value();
  if (!v1::Firing(a)) {
    out["resolved_step"] = a.resolved_step();
    out["resolved_at"] = FormatRfc3339(a.resolved_unix_nanos());
  }
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace trainwatch
