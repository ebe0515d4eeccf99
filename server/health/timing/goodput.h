// Goodput of one run (docs/detectors.md): what the run's wall time bought, and
// what it lost to skipped steps, to steps redone after a rewind, and to
// silent gaps. Single-threaded: fed by the run's pipeline with its lead
// records (every attempt) in arrival order.
#ifndef TRAINWATCH_SERVER_HEALTH_TIMING_GOODPUT_H_
#define TRAINWATCH_SERVER_HEALTH_TIMING_GOODPUT_H_

#include <cstdint>
#include <optional>

#include "health/health_config.h"

namespace trainwatch {

struct GoodputTotals {
  uint64_t skipped_steps = 0;   // lead records with skipped set
  uint64_t rewound_steps = 0;   // steps a new attempt redid
  uint64_t productive_steps = 0;  // lead records, less the two above
  double skipped_seconds = 0.0;
  double rewound_seconds = 0.0;  // redone steps x the typical step time
  double silent_seconds = 0.0;
  double wall_seconds = 0.0;     // first lead record to the latest
  // (wall - lost) / wall; 1 until there is wall time.
  double ratio = 1.0;
};

// 64 bytes.
class Goodput {
 public:
  explicit Goodput(const GoodputConfig& config) : config_(config) {}

  // A lead record: its step, whether it was skipped, when it finished
  // (unix nanos; the server's clock when the trainer sent none), and its
  // step_time_s when it has one.
  void OnLeadRecord(uint64_t step, bool skipped, int64_t unix_nanos,
                    std::optional<double> step_time_s);
  // A new attempt restarted at `first_step` after the run had reached
  // `last_step` (>= first_step): last_step - first_step + 1 steps redone.
  void OnRewind(uint64_t first_step, uint64_t last_step);

  GoodputTotals totals() const;
  // Typical seconds a step (EMA of step times), 0 before any.
  double typical_step_seconds() const { return typical_; }

 private:
  const GoodputConfig& config_;
  int64_t first_nanos_ = 0;
  int64_t last_nanos_ = 0;
  uint64_t records_ = 0;
  uint64_t skipped_ = 0;
  uint64_t rewound_ = 0;
  double skipped_seconds_ = 0.0;
  double rewound_seconds_ = 0.0;
  double silent_seconds_ = 0.0;
  double typical_ = 0.0;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_TIMING_GOODPUT_H_
