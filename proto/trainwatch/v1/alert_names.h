// The wire names of an alert's severity and state: the strings of
// Alertmanager's labels, the webhook, trainwatchctl's JSON and the store's
// columns. Inside the code they are the enums of trainwatch.proto. (C
// strings: they go to absl, std and JSON writers alike.)
#ifndef TRAINWATCH_PROTO_TRAINWATCH_V1_ALERT_NAMES_H_
#define TRAINWATCH_PROTO_TRAINWATCH_V1_ALERT_NAMES_H_

#include <optional>
#include <string_view>

#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::v1 {

constexpr const char* SeverityName(Severity s) {
  switch (s) {
    case SEVERITY_INFO: return "info";
    case SEVERITY_WARNING: return "warning";
    case SEVERITY_CRITICAL: return "critical";
    default: return "";
  }
}

constexpr std::optional<Severity> SeverityByName(std::string_view name) {
  if (name == "info") return SEVERITY_INFO;
  if (name == "warning") return SEVERITY_WARNING;
  if (name == "critical") return SEVERITY_CRITICAL;
  return std::nullopt;
}

// critical and warning page; info does not.
constexpr bool Pages(Severity s) {
  return s == SEVERITY_WARNING || s == SEVERITY_CRITICAL;
}

constexpr const char* StateName(AlertState s) {
  switch (s) {
    case ALERT_STATE_FIRING: return "firing";
    case ALERT_STATE_RESOLVED: return "resolved";
    default: return "";
  }
}

constexpr std::optional<AlertState> StateByName(std::string_view name) {
  if (name == "firing") return ALERT_STATE_FIRING;
  if (name == "resolved") return ALERT_STATE_RESOLVED;
  return std::nullopt;
}

inline bool Firing(const Alert& a) { return a.state() == ALERT_STATE_FIRING; }

}  // namespace trainwatch::v1

#endif  // TRAINWATCH_PROTO_TRAINWATCH_V1_ALERT_NAMES_H_
