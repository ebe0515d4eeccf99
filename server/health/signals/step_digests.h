// What the ranks of a run said about each step, kept as one small digest per
// step until the step is judged (RankProgress says when every rank's record
// of it is in), so that cross-rank checks compare ranks step by step, once
// per step and in step order, whatever the order their records arrive in.
//
// Steps are kept in a ring indexed by step (steps of one stream are dense or
// nearly so), from the oldest step not judged yet to the newest step any rank
// has sent. The caller judges steps before they fall max_lag_steps behind the
// newest (RankProgress's lag bound), so memory is bounded by max_lag_steps
// digests. Records of an older attempt are ignored; a new attempt starts
// afresh.
//
// Pure and not thread-safe: one instance per run and check.
#ifndef TRAINWATCH_SERVER_HEALTH_SIGNALS_STEP_DIGESTS_H_
#define TRAINWATCH_SERVER_HEALTH_SIGNALS_STEP_DIGESTS_H_

#include <cstdint>
#include <deque>
#include <optional>

namespace trainwatch {

// T must have a member `ranks` (ranks that reported the step, 0 for a step
// nobody reported yet).
template <typename T>
class StepDigests {
 public:
  explicit StepDigests(uint64_t max_lag_steps) : max_lag_(max_lag_steps) {}

  // The digest of `step`, created empty if needed; nullptr for an older
  // attempt's record, a step already judged, or one outside the lag bound.
  T* Get(uint32_t attempt, uint64_t step) {
    if (attempt < attempt_ || max_lag_ == 0) return nullptr;
    if (attempt > attempt_) {
      attempt_ = attempt;
      steps_.clear();
      judged_.reset();
    }
    if (judged_.has_value() && step <= *judged_) return nullptr;
    if (steps_.empty()) base_ = step;
    if (step < base_) {
      // `gap` is checked alone first: gap + size() wraps for a base near the
      // top of uint64_t (a rank reporting step -1).
      const uint64_t gap = base_ - step;
      if (gap > max_lag_ || gap + steps_.size() > max_lag_) return nullptr;
      steps_.insert(steps_.begin(), gap, T{});
      base_ = step;
    }
    // step - base_, not base_ + size(): the latter wraps at the last step
    // of uint64_t.
    if (step - base_ >= max_lag_) return nullptr;
    if (step - base_ >= steps_.size()) steps_.resize(step - base_ + 1);
    return &steps_[step - base_];
  }

  // Judges, in step order, every step <= `through` that some rank reported:
  // judge(step, digest). Those steps are then forgotten.
  template <typename Judge>
  void JudgeThrough(uint64_t through, Judge&& judge) {
    while (!steps_.empty() && base_ <= through) {
      if (steps_.front().ranks > 0) judge(base_, steps_.front());
      steps_.pop_front();
      ++base_;
    }
    if (!judged_.has_value() || through > *judged_) judged_ = through;
  }

  size_t size() const { return steps_.size(); }

 private:
  uint64_t max_lag_;
  uint32_t attempt_ = 0;
  uint64_t base_ = 0;  // the step of steps_.front()
  std::optional<uint64_t> judged_;  // every step <= it was judged
  std::deque<T> steps_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_SIGNALS_STEP_DIGESTS_H_
