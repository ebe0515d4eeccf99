// The restart plan of a run's latest spike (docs/detectors.md; `trainwatchctl plan`, docs/contracts.md): where
// to resume, which batches to skip, and why; for a launcher or a data loader
// to act on. `trainwatchctl plan` prints it; the Python package's
// trainwatch.restart_plan() returns it.
//
// Thread-safety: free functions, safe from any thread.
#ifndef TRAINWATCH_RESTART_PLAN_H_
#define TRAINWATCH_RESTART_PLAN_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

struct RestartPlan {
  std::string run;
  uint64_t spike_step = 0;
  // The last checkpoint at least 100 steps before the spike; absent when the
  // run reported none (restart from the start, or from any checkpoint older
  // than the spike).
  std::optional<uint64_t> restart_from_step;
  std::string checkpoint;  // that checkpoint event's detail
  std::vector<int64_t> skip_batch_ids;
  // "" until a new attempt replayed the spike's steps; then "recovered" or
  // "recurred", and whether that attempt skipped the batches.
  std::string outcome;
  bool batches_skipped = false;
  // One or two sentences: what happened and what to do.
  std::string why;
};

// The plan of the latest spike in `health` (GetRunHealth's answer); nullopt
// when the run has no spike.
std::optional<RestartPlan> PlanFromHealth(const v1::GetRunHealthResponse& health);

// Asks the server at `address` (GetRunHealth) for `run`'s plan. NOT_FOUND for
// an unknown run; nullopt when the run has no spike.
absl::StatusOr<std::optional<RestartPlan>> FetchRestartPlan(
    const std::string& address, const ConnectionSecurity& security,
    const std::string& run,
    std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace trainwatch

#endif  // TRAINWATCH_RESTART_PLAN_H_
