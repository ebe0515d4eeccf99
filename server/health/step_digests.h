// What the ranks of a run said about each step, kept as one small digest per
// step until every rank has reported it, so that cross-rank checks
// (RankNormMismatch, ShardNormMismatch) compare ranks step by step from the
// first step whatever the order their records arrive in: ranks whose streams
// arrive up to max_lag_steps apart (a rank catching up after an outage, ranks
// replayed one after another) are still compared at every step.
//
// Steps are kept in a ring indexed by step (steps of one stream are dense or
// nearly so), from the oldest step some rank has not reported yet to the
// newest step any rank has. Memory is bounded by max_lag_steps digests: a
// step more than that behind the newest is dropped unchecked. A digest is a
// few bytes (a T: the first report's values as floats and a rank count), so
// 100,000 steps of lag cost about 1.2 MB per run, whatever the rank count.
// Records of an older attempt are ignored; a new attempt starts afresh.
//
// Pure and not thread-safe: one instance per run and check.
#ifndef TRAINWATCH_SERVER_HEALTH_STEP_DIGESTS_H_
#define TRAINWATCH_SERVER_HEALTH_STEP_DIGESTS_H_

#include <cstdint>
#include <deque>

namespace trainwatch {

// T must have a member `uint16_t ranks` (ranks that reported the step, 0 for
// a step nobody reported yet).
template <typename T>
class StepDigests {
 public:
  explicit StepDigests(uint64_t max_lag_steps) : max_lag_(max_lag_steps) {}

  // The digest of `step`, created empty if needed; nullptr for an older
  // attempt's record, or a step already dropped (checked by every rank, or
  // more than max_lag_steps behind).
  T* Get(uint32_t attempt, uint64_t step) {
    if (attempt < attempt_) return nullptr;
    if (attempt > attempt_ || max_lag_ == 0) {
      attempt_ = attempt;
      Clear();
      if (max_lag_ == 0) return nullptr;
    }
    if (steps_.empty()) base_ = step;
    if (step < base_) {
      // Before everything held: only while the ring is still young. `gap`
      // is checked alone first: gap + size() wraps for a base near the top
      // of uint64_t (a rank reporting step -1), and the insert below would
      // then ask for ~2^64 digests (std::length_error: the server died).
      const uint64_t gap = base_ - step;
      if (gap > max_lag_ || gap + steps_.size() > max_lag_ || dropped_any_) {
        return nullptr;
      }
      steps_.insert(steps_.begin(), gap, T{});
      base_ = step;
    }
    if (step - base_ >= max_lag_) {
      // Far ahead: what is more than max_lag_ behind `step` goes.
      const uint64_t keep_from = step - max_lag_ + 1;
      while (!steps_.empty() && base_ < keep_from) PopFront();
      if (steps_.empty()) base_ = step;
    }
    // step - base_, not base_ + size(): the latter wraps at the last step
    // of uint64_t and the loop would never end.
    if (step - base_ >= steps_.size()) steps_.resize(step - base_ + 1);
    return &steps_[step - base_];
  }

  // Drops the fully reported steps at the front (call after updating a
  // digest to `world_size` ranks).
  void Trim(uint32_t world_size) {
    while (!steps_.empty() && steps_.front().ranks >= world_size) PopFront();
  }

  void RewindTo(uint64_t step) {
    // Keeps the steps below `step`: [base_, step). Written without
    // base_ + size(), which wraps at the end of uint64_t.
    const uint64_t keep = step > base_ ? step - base_ : 0;
    if (steps_.size() > keep) steps_.resize(keep);
  }

  size_t size() const { return steps_.size(); }

 private:
  void PopFront() {
    steps_.pop_front();
    ++base_;
    dropped_any_ = true;
  }
  void Clear() {
    steps_.clear();
    dropped_any_ = false;
  }

  uint64_t max_lag_;
  uint32_t attempt_ = 0;
  uint64_t base_ = 0;  // the step of steps_.front()
  bool dropped_any_ = false;
  std::deque<T> steps_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_STEP_DIGESTS_H_
