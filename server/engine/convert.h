// Conversions between the engine's in-memory types and the wire/storage
// forms: RunStart -> RunInfo, AlertEpisode <-> v1::Alert, v1::Alert ->
// AlertNotice (for the notifiers). Pure functions, thread-safe.
#ifndef TRAINWATCH_SERVER_ENGINE_CONVERT_H_
#define TRAINWATCH_SERVER_ENGINE_CONVERT_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "alerting/alert_notice.h"
#include "engine/alert_tracker.h"
#include "engine/detector.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

RunInfo InfoFrom(const v1::RunStart& start);
v1::Alert ToProto(const std::string& run, const AlertEpisode& episode);
// `alert` must name a known alertname.
AlertEpisode FromProto(const v1::Alert& alert);
AlertNotice ToNotice(const v1::Alert& alert,
                     const std::map<std::string, std::string>& run_labels);
// (alertname, severity) of every alert, in catalog order.
std::vector<std::pair<std::string, std::string>> AlertLabels();

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ENGINE_CONVERT_H_
