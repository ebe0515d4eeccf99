// The health engine's options, which are also the server's engine part
// (ServerOptions::engine, server/server.h): each default is written once,
// here, and --help prints the flags' from it (server/server_flags.cc).
#ifndef TRAINWATCH_SERVER_ENGINE_ENGINE_OPTIONS_H_
#define TRAINWATCH_SERVER_ENGINE_ENGINE_OPTIONS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "health/health_config.h"

namespace trainwatch {

struct EngineOptions {
  // Set by the server's flags and --config.

  // Engine threads (--engine-threads); runs are sharded over them, each run
  // living on one.
  size_t threads = 2;
  // Runs that have not finished, at most (--max-active-runs); a new one past
  // this is RESOURCE_EXHAUSTED.
  size_t max_active_runs = 10000;
  // A run with no record for this long leaves the active set, as if it had
  // finished: its history stays, and it can come back (--run-idle-timeout);
  // 0: never.
  std::chrono::milliseconds run_idle_timeout{3'600'000};
  // Runs whose last record is older than this many days, with no open
  // stream, are deleted with everything stored of them (--retention-days);
  // 0: kept forever.
  uint32_t retention_days = 0;
  // Detector thresholds (--config; --closed-loop replaces closed_loop.mode).
  HealthConfig health;

  // The engine's own, which no flag sets.

  // How often retention is applied (and once at start).
  std::chrono::milliseconds retention_check_interval{600'000};
  // A batch of at most this many records (a live trainer's, sent as it
  // trains) is processed before queued larger ones (a replay's, a client
  // catching up): a bad step is not detected behind a healthy backlog. The
  // server sets ingest's small_batch_records from it.
  size_t prompt_batch_records = 256;
  // How often RunSilent is checked; 0 disables the timer (tests call
  // CheckSilence() themselves).
  std::chrono::milliseconds silence_check_interval{1000};
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ENGINE_ENGINE_OPTIONS_H_
