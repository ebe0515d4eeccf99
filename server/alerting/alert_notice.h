// One alert transition as the notifiers see it: plain data, so the alerting
// part does not depend on the engine (dependencies point engine -> alerting).
#ifndef TRAINWATCH_SERVER_ALERTING_ALERT_NOTICE_H_
#define TRAINWATCH_SERVER_ALERTING_ALERT_NOTICE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace trainwatch {

struct AlertNotice {
  std::string alertname;
  std::string run;
  std::string severity;  // info | warning | critical
  bool firing = true;
  // The run's RunStart labels (model, owner, cluster, ...); names are valid
  // Prometheus label names (checked at ingest).
  std::map<std::string, std::string> run_labels;
  std::string summary;
  std::string description;
  std::string likely_cause;
  std::string fix;
  uint64_t started_step = 0;
  uint64_t resolved_step = 0;  // when !firing
  uint64_t onset_step = 0;     // the change-point estimate; 0: none
  std::string caused_by;       // the alert this one is a consequence of
  double peak_value = 0.0;
  std::vector<int64_t> batch_ids;
  int64_t started_unix_nanos = 0;
  int64_t resolved_unix_nanos = 0;  // when !firing
};

// RFC 3339 in UTC with milliseconds ("2026-11-29T10:04:05.123Z"), the time
// format of both payloads.
std::string FormatRfc3339(int64_t unix_nanos);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ALERTING_ALERT_NOTICE_H_
