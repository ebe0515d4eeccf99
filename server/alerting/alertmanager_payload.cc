#include "alerting/alertmanager_payload.h"

#include <nlohmann/json.hpp>

#include "alerting/time_format.h"
#include "trainwatch/v1/alert_names.h"

namespace trainwatch {

std::string AlertmanagerAlertsUrl(const std::string& base_url) {
  std::string url = base_url;
  while (!url.empty() && url.back() == '/') url.pop_back();
  return url + "/api/v2/alerts";
}

std::string AlertmanagerPayload(const std::vector<const v1::Alert*>& alerts,
                                int64_t now_unix_nanos,
                                std::chrono::nanoseconds resend_interval) {
  nlohmann::json out = nlohmann::json::array();
  for (const v1::Alert* a : alerts) {
    nlohmann::json labels = nlohmann::json::object();
    for (const auto& [k, v] : a->run_labels()) labels[k] = v;
    labels["alertname"] = a->alertname();
    labels["run"] = a->run();
    labels["severity"] = std::string(v1::SeverityName(a->severity()));
    nlohmann::json annotations = {
        {"summary", a->summary()},
        {"description", a->description()},
        {"likely_cause", a->likely_cause()},
        {"fix", a->fix()},
        {"started_step", std::to_string(a->started_step())},
    };
    // Annotations, not labels: the labels stay {alertname, run, severity}
    // (and the run's), so the Prometheus rules' copy of the alert has the
    // same fingerprint; the shipped inhibit_rules match on alertname.
    if (a->onset_step() > 0) {
      annotations["onset_step"] = std::to_string(a->onset_step());
    }
    if (!a->caused_by().empty()) annotations["caused_by"] = a->caused_by();
    if (!a->batch_ids().empty()) {
      std::string ids;
      for (int64_t id : a->batch_ids()) {
        if (!ids.empty()) ids += ",";
        ids += std::to_string(id);
      }
      annotations["batch_ids"] = ids;
    }
    const int64_t ends = v1::Firing(*a) ? now_unix_nanos + 4 * resend_interval.count()
                                   : a->resolved_unix_nanos();
    out.push_back({{"labels", std::move(labels)},
                   {"annotations", std::move(annotations)},
                   {"startsAt", FormatRfc3339(a->started_unix_nanos())},
                   {"endsAt", FormatRfc3339(ends)}});
  }
  // Replace invalid UTF-8 instead of throwing: a bad byte in a description
  // must not cost the notification.
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace trainwatch
