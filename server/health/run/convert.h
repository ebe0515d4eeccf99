// Conversions between the health library's in-memory types and the
// wire/storage forms: RunStart -> RunInfo, AlertEpisode <-> v1::Alert. Pure
// functions, thread-safe.
#ifndef TRAINWATCH_SERVER_HEALTH_RUN_CONVERT_H_
#define TRAINWATCH_SERVER_HEALTH_RUN_CONVERT_H_

#include <string>
#include <utility>
#include <vector>

#include "health/detector.h"
#include "health/run/alert_tracker.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

RunInfo InfoFrom(const v1::RunStart& start);
v1::Alert ToProto(const std::string& run, const AlertEpisode& episode);
// `alert` must name a known alertname.
AlertEpisode FromProto(const v1::Alert& alert);
// (alertname, severity) of every alert, in catalog order.
std::vector<std::pair<std::string, std::string>> AlertLabels();

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_RUN_CONVERT_H_
