#include "alerting/time_format.h"

#include <time.h>

#include <cstdio>

namespace trainwatch {

std::string FormatRfc3339(int64_t unix_nanos) {
  // Floor division, so times before 1970 still format (tests use them).
  int64_t secs = unix_nanos / 1'000'000'000;
  int64_t nanos = unix_nanos % 1'000'000'000;
  if (nanos < 0) {
    nanos += 1'000'000'000;
    --secs;
  }
  time_t t = static_cast<time_t>(secs);
  struct tm tm;
  gmtime_r(&t, &tm);
  char buf[64];
  snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
           tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
           tm.tm_sec, static_cast<int>(nanos / 1'000'000));
  return buf;
}

}  // namespace trainwatch
