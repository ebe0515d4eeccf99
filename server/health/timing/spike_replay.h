// The restart loop closed (docs/detectors.md): after a spike, a new attempt that
// restarts at or before the spike's step replays it. This watches the
// replayed range: did the new attempt leave the spike's batch ids out, and
// did the spike come back. Single-threaded: fed by the run's pipeline.
#ifndef TRAINWATCH_SERVER_HEALTH_TIMING_SPIKE_REPLAY_H_
#define TRAINWATCH_SERVER_HEALTH_TIMING_SPIKE_REPLAY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "health/health_config.h"

namespace trainwatch {

// The verdict on one spike's replay.
struct SpikeOutcome {
  uint64_t spike_step = 0;
  bool recurred = false;
  bool batches_skipped = false;  // none of its batch ids was replayed
  uint64_t recurrence_step = 0;  // when recurred
  std::vector<int64_t> batch_ids;
  // "recovered" or "recurred".
  std::string outcome() const { return recurred ? "recurred" : "recovered"; }
  // Recurred although the batches were skipped: not the data.
  bool optimizer_or_lr() const { return recurred && batches_skipped; }
};

// Bounded by the spikes of a run still awaiting their replay (at most
// max_watched; older ones are judged without a replay: never).
class SpikeReplay {
 public:
  static constexpr size_t kMaxWatched = 64;
  explicit SpikeReplay(const SpikeReplayConfig& config) : config_(config) {}

  // A spike fired at `step` with these batch ids (any attempt). Returns the
  // verdict when it is the recurrence of a spike under replay.
  std::vector<SpikeOutcome> OnSpike(uint64_t step,
                                    const std::vector<int64_t>& batch_ids);
  // A new attempt restarted at `first_step`: spikes at or after it (not
  // judged yet) are now being replayed.
  void OnRewind(uint64_t first_step);
  // A lead record of the replaying attempt; returns the verdicts it settles.
  std::vector<SpikeOutcome> OnLeadRecord(uint64_t step,
                                         const std::vector<int64_t>& batch_ids);
  // The run finished at `step`: replays past their spike's step are judged.
  std::vector<SpikeOutcome> OnFinish(uint64_t step);

 private:
  struct Watched {
    uint64_t step = 0;
    std::vector<int64_t> batch_ids;
    absl::flat_hash_set<int64_t> ids;
    bool replaying = false;
    bool batches_seen = false;
    bool judged = false;
  };
  SpikeOutcome Judge(Watched& w, bool recurred, uint64_t recurrence_step);

  const SpikeReplayConfig& config_;
  std::vector<Watched> watched_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_TIMING_SPIKE_REPLAY_H_
