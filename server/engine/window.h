// Exact step-indexed rolling windows of one run (post-warmup steps only).
//
// OrderStatWindow keeps the last W values in insertion order and in an
// order-statistics tree, so a quantile costs O(log W) and a new value O(log W):
// no sorting of the window per step. RunWindow bundles the series the
// detectors read (norm, clip and skip flags, attention logit, log Z) and can
// rewind to a step when a job restarts from a checkpoint.
//
// Not thread-safe: owned by one engine shard.
#ifndef TRAINWATCH_SERVER_ENGINE_WINDOW_H_
#define TRAINWATCH_SERVER_ENGINE_WINDOW_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <utility>

#include "engine/order_stat_set.h"

namespace trainwatch {

// The last `capacity` finite values, with exact quantiles. Non-finite values
// take a slot (so the window stays step-indexed) but are not ranked.
class OrderStatWindow {
 public:
  explicit OrderStatWindow(size_t capacity) : capacity_(capacity) {}

  void Push(uint64_t step, double value);
  // Drops the values of steps >= `step`.
  void RewindTo(uint64_t step);
  void Clear();

  size_t slots() const { return entries_.size(); }    // values pushed, in W
  size_t ranked() const { return tree_.size(); }      // finite ones
  // The q-quantile (0 <= q <= 1) of the finite values, nearest-rank; nullopt
  // when there are none.
  std::optional<double> Quantile(double q) const;
  std::optional<double> Median() const { return Quantile(0.5); }
  std::optional<double> Max() const;

 private:
  void PopFront();

  size_t capacity_;
  std::deque<std::pair<uint64_t, double>> entries_;  // step, value; oldest first
  OrderStatSet tree_;  // finite values, keyed (value, step)
};

// A rolling count of flagged steps over the last `capacity` steps.
class FlagWindow {
 public:
  explicit FlagWindow(size_t capacity) : capacity_(capacity) {}
  void Push(uint64_t step, bool flag);
  void RewindTo(uint64_t step);
  void Clear();
  size_t size() const { return entries_.size(); }
  size_t count() const { return count_; }
  double fraction() const {
    return entries_.empty() ? 0.0 : static_cast<double>(count_) / entries_.size();
  }

 private:
  size_t capacity_;
  std::deque<std::pair<uint64_t, bool>> entries_;
  size_t count_ = 0;
};

// The windows of one run over its last W post-warmup steps.
struct RunWindow {
  explicit RunWindow(size_t w)
      : grad_norm(w), clipped(w), skipped(w), max_attn_logit(w), log_z(w) {}

  OrderStatWindow grad_norm;
  FlagWindow clipped;
  FlagWindow skipped;
  // Only steps that carry the field are pushed.
  OrderStatWindow max_attn_logit;
  OrderStatWindow log_z;

  void RewindTo(uint64_t step) {
    grad_norm.RewindTo(step);
    clipped.RewindTo(step);
    skipped.RewindTo(step);
    max_attn_logit.RewindTo(step);
    log_z.RewindTo(step);
  }
};

// Medians of the first W post-warmup steps, taken once when they are in.
struct Baselines {
  std::optional<double> grad_norm_median;
  std::optional<double> max_attn_logit_median;
  std::optional<double> log_z_median;
  // The last post-warmup step of the baseline; a rewind before it resets
  // the baselines.
  uint64_t through_step = 0;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ENGINE_WINDOW_H_
