// How far every rank of a run has reported: the step up to which the
// cross-rank checks (RankNormMismatch, ShardNormMismatch, RankStraggler) may
// judge, so that they judge each step once, in step order, with every rank's
// record of it, whatever the order the ranks' streams arrive in (all at once,
// one after another, rank 0 last, one rank far behind). That makes their
// verdicts a function of the records (docs/architecture.md, "Arrival order").
//
// A step is complete once every rank of [0, world_size) has reported it or a
// later step (its stream is in step order, so a rank that logs sparsely has
// passed a step it did not log), or the ranks that have not are missing: a
// rank is declared missing after `missing_after` without a record (a rank
// never seen, counted from the attempt's first record). A missing rank that
// reports again rejoins; what it sends for steps already judged is late and
// left out. Memory bounds the rest: a step more than `max_lag_steps` behind
// the newest step seen is judged with what it has.
//
// Records of an older attempt are ignored; a newer attempt starts afresh.
// Memory: 24 bytes a rank. A record costs O(1) amortized (the minimum over
// ranks is rescanned only when the last rank at it moves on).
//
// Pure and not thread-safe: one instance per run.
#ifndef TRAINWATCH_SERVER_HEALTH_RUN_RANK_PROGRESS_H_
#define TRAINWATCH_SERVER_HEALTH_RUN_RANK_PROGRESS_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace trainwatch {

class RankProgress {
 public:
  explicit RankProgress(uint64_t max_lag_steps) : max_lag_(max_lag_steps) {}

  // A record of `rank` at `step` of `attempt`, received at `now_unix_nanos`,
  // from a run of `world_size` ranks. Steps of one (rank, attempt) come in
  // increasing order (the pipeline drops duplicates). Returns false when the
  // cross-rank checks must leave it out: an older attempt's record, or a
  // step already judged.
  bool Add(uint32_t rank, uint32_t attempt, uint32_t world_size, uint64_t step,
           int64_t now_unix_nanos);
  // Declares missing every rank without a record for `missing_after_nanos`.
  void DeclareMissing(int64_t now_unix_nanos, int64_t missing_after_nanos);
  // `rank` finished (RUN_FINISHED, RUN_FAILED): it will report no later
  // step, so no step waits for it.
  void Finish(uint32_t rank, uint32_t attempt, int64_t now_unix_nanos);
  // Lowers the lag bound (to keep what is pending for many ranks bounded).
  void set_max_lag_steps(uint64_t steps) { max_lag_ = steps; }

  // Every step <= through() may be judged; nullopt: none yet. Never
  // decreases within an attempt.
  std::optional<uint64_t> through() const { return through_; }
  // The attempt whose records count.
  uint32_t attempt() const { return attempt_; }
  // Every rank below `rank` has been declared missing (rank 0: true).
  bool AllMissingBelow(uint32_t rank) const;

 private:
  struct Rank {
    uint64_t next = 0;       // one past the last step reported; 0: none yet
    int64_t last_nanos = 0;  // when it last reported (or the attempt began)
    bool missing = false;
  };
  void Reset(uint32_t attempt, int64_t now_unix_nanos);
  void Grow(uint32_t world_size, int64_t now_unix_nanos);
  // Recomputes min_next_ and at_min_ over the ranks not missing.
  void Rescan();
  // A rank not missing at `next`: into min_next_ and at_min_.
  void CountPresent(uint64_t next);
  // Raises through_ to what the ranks and the lag bound allow.
  void Advance();

  uint64_t max_lag_;
  bool started_ = false;
  uint32_t attempt_ = 0;
  std::vector<Rank> ranks_;
  uint64_t min_next_ = 0;  // least `next` over the ranks not missing
  uint32_t at_min_ = 0;    // how many of them are at it
  bool any_present_ = false;  // some rank is not missing
  std::optional<uint64_t> newest_;
  std::optional<uint64_t> through_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_RUN_RANK_PROGRESS_H_
