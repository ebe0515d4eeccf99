// The time format of both notification payloads.
#ifndef TRAINWATCH_SERVER_ALERTING_TIME_FORMAT_H_
#define TRAINWATCH_SERVER_ALERTING_TIME_FORMAT_H_

#include <cstdint>
#include <string>

namespace trainwatch {

// RFC 3339 in UTC with milliseconds ("2026-11-29T10:04:05.123Z").
std::string FormatRfc3339(int64_t unix_nanos);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ALERTING_TIME_FORMAT_H_
