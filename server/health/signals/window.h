// Exact step-indexed rolling windows of one run (post-warmup steps only).
//
// ValueWindow keeps the last W values in push order (a ring); its quantiles
// are selections, computed when asked. OrderStatWindow also keeps them
// sorted, in blocks of up to 64 (SortedBlocks): a new value that evicts the
// oldest is an erase and an insert of ~50 ns each at W = 1,000, and a
// quantile is a walk over ~20 block sizes, so there is no sorting per step.
// Storage is allocated on the first push (a run that never reports a field
// pays nothing for its window) and costs 12 bytes a slot, ~23 with the
// sorted copy; 10 and ~21 while a window's steps span under 2^16. RunWindow bundles the series the detectors read (norm, clip
// and skip flags, attention logit, log Z) and can rewind to a step when a job
// restarts from a checkpoint.
//
// Not thread-safe: owned by one engine shard.
#ifndef TRAINWATCH_SERVER_HEALTH_SIGNALS_WINDOW_H_
#define TRAINWATCH_SERVER_HEALTH_SIGNALS_WINDOW_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "health/signals/trend_forecast.h"

namespace trainwatch {

// The steps of the last `capacity` pushes, oldest first, in a ring of 16-bit
// offsets from a base step (2 bytes a slot: a run's windows were a third of
// its memory). Steps normally grow, but any order is kept exactly: a step
// below the base or past 2^16 above it rebases the ring, a window whose
// steps span more than 2^16 switches to 32-bit offsets and one past 2^32 to
// 64-bit steps (until Clear). Owners keep their values in arrays indexed by
// the same slots.
class StepRing {
 public:
  explicit StepRing(size_t capacity) : capacity_(capacity) {}

  size_t capacity() const { return capacity_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  bool full() const { return size_ == capacity_; }
  // Slot of the i-th oldest entry (i < size()).
  size_t Slot(size_t i) const {
    size_t s = head_ + i;
    return s >= capacity_ ? s - capacity_ : s;
  }
  size_t oldest_slot() const { return head_; }
  size_t newest_slot() const { return Slot(size_ - 1); }
  uint64_t StepAt(size_t slot) const {
    if (!narrow_.empty()) return base_ + narrow_[slot];
    return wide_.empty() ? base_ + offsets_[slot] : wide_[slot];
  }

  // Appends `step` and returns its slot. When full, that is the oldest
  // entry's slot: the owner's value there is the one evicted. Requires
  // capacity() > 0.
  size_t Append(uint64_t step);
  void PopNewest() { --size_; }
  void Clear();

 private:
  // Makes `step` representable: rebases the offsets, or widens them.
  void MakeRoom(uint64_t step);
  // The largest offset the ring's width holds (0: 64-bit steps).
  uint64_t MaxOffset() const;
  void SetStep(size_t slot, uint64_t step);

  size_t capacity_;
  // One of the three holds the steps, allocated on the first Append.
  std::vector<uint16_t> narrow_;   // offsets while the steps span < 2^16
  std::vector<uint32_t> offsets_;  // then 32-bit offsets
  std::vector<uint64_t> wide_;     // then the steps, once they span 2^32
  size_t head_ = 0;                // slot of the oldest entry
  size_t size_ = 0;
  uint64_t base_ = 0;              // <= every step held
};

// The last `capacity` values by step, in push order only: a push is a ring
// write, and a quantile is a selection over the window (O(W), a few
// microseconds at W = 1,000). For series whose quantiles are read rarely
// next to their pushes: the grad norm (its quantiles once a batch, or once
// every few dozen steps for small batches; a sorted copy kept up to date
// cost ~140 ns a push, a tenth of the server's CPU at 16 streams), the logit
// and log Z baselines (once). Non-finite values take a slot (so the window
// stays step-indexed) but are not ranked.
class ValueWindow {
 public:
  explicit ValueWindow(size_t capacity) : ring_(capacity) {}

  // Appends; the evicted value, when the window was full.
  std::optional<double> Push(uint64_t step, double value);
  // Removes the newest value if its step is >= `step`, into `*value`.
  bool PopNewestFrom(uint64_t step, double* value);
  // Drops the values of steps >= `step`.
  void RewindTo(uint64_t step);
  void Clear();

  size_t capacity() const { return ring_.capacity(); }
  size_t slots() const { return ring_.size(); }  // values pushed, in W
  size_t ranked() const { return ranked_; }      // finite ones
  // Pushes ever (rewinds do not take them back): how far the values moved.
  uint64_t pushes() const { return pushes_; }
  // The q-quantile (0 <= q <= 1) of the finite values, nearest-rank; nullopt
  // when there are none.
  std::optional<double> Quantile(double q) const;
  std::optional<double> Median() const { return Quantile(0.5); }
  std::optional<double> Max() const;

 private:
  StepRing ring_;
  std::vector<double> values_;  // by ring slot, allocated on the first push
  size_t ranked_ = 0;
  uint64_t pushes_ = 0;
};

// A sorted multiset of doubles in blocks of at most kBlock values, with
// each block's largest value in a flat array for the search: a change
// searches the maxima, then one block (branch-free binary searches), and
// moves at most kBlock - 1 values, where a flat sorted array moves W/3 on
// average. Blocks
// split when full and merge with a neighbour when nearly empty. Ties are
// interchangeable, so a value may land anywhere among its equals.
class SortedBlocks {
 public:
  static constexpr size_t kBlock = 64;

  void Insert(double value);
  // Removes one copy of `value`, which must be present.
  void Erase(double value);
  void Clear();

  size_t size() const { return size_; }
  // The value of rank `i` (0-based, i < size()).
  double At(size_t i) const;
  double Back() const { return maxima_.back(); }

 private:
  // The first block whose maximum is >= value (or > value when `after`);
  // blocks_.size() when there is none.
  size_t FindBlock(double value, bool after) const;
  void EraseBlock(size_t b);

  using Block = std::array<double, kBlock>;
  // Allocated one by one: a split or merge moves pointers, and a window
  // holds only the blocks it fills (~20 at W = 1,000).
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<double> maxima_;     // blocks_[b]'s last value
  std::vector<uint32_t> sizes_;    // values in blocks_[b], 1..kBlock
  size_t size_ = 0;
};

// The last `capacity` values with exact quantiles kept up to date: the
// values in push order (a ValueWindow) and sorted (SortedBlocks), for series
// whose quantiles are read at every step (the fp16 detectors').
class OrderStatWindow {
 public:
  explicit OrderStatWindow(size_t capacity) : values_(capacity) {}

  void Push(uint64_t step, double value);
  // Drops the values of steps >= `step`.
  void RewindTo(uint64_t step);
  void Clear();

  size_t slots() const { return values_.slots(); }  // values pushed, in W
  size_t ranked() const { return sorted_.size(); }  // finite ones
  // Same definitions as ValueWindow's, read off the sorted values.
  std::optional<double> Quantile(double q) const;
  std::optional<double> Median() const { return Quantile(0.5); }
  std::optional<double> Max() const;

 private:
  ValueWindow values_;
  SortedBlocks sorted_;  // the finite values
};

// A rolling count of flags over the last `capacity` pushes, with no steps of
// its own: for flags pushed and rewound in step with another window.
class FlagSeries {
 public:
  explicit FlagSeries(size_t capacity) : capacity_(capacity) {}
  void Push(bool flag);
  // Drops the `n` newest flags (n <= size()).
  void PopNewest(size_t n);
  void Clear();
  size_t size() const { return size_; }
  size_t count() const { return count_; }
  double fraction() const {
    return size_ == 0 ? 0.0 : static_cast<double>(count_) / size_;
  }

 private:
  bool Get(size_t slot) const { return (bits_[slot / 64] >> (slot % 64)) & 1; }
  void Set(size_t slot, bool flag);
  size_t Slot(size_t i) const {
    size_t s = head_ + i;
    return s >= capacity_ ? s - capacity_ : s;
  }

  size_t capacity_;
  std::vector<uint64_t> bits_;  // allocated on the first push
  size_t head_ = 0;             // slot of the oldest flag
  size_t size_ = 0;
  size_t count_ = 0;
};

// A rolling count of flagged steps over the last `capacity` steps.
class FlagWindow {
 public:
  explicit FlagWindow(size_t capacity) : ring_(capacity), flags_(capacity) {}
  void Push(uint64_t step, bool flag);
  void RewindTo(uint64_t step);
  void Clear();
  size_t size() const { return flags_.size(); }
  size_t count() const { return flags_.count(); }
  double fraction() const { return flags_.fraction(); }

 private:
  StepRing ring_;
  FlagSeries flags_;
};

// The windows of one run over its last W post-warmup steps.
struct RunWindow {
  explicit RunWindow(size_t w)
      : grad_norm(w), clipped(w), skipped(w), max_attn_logit(w), log_z(w) {}

  // Every post-warmup lead step pushes these three together, so the flags
  // share the norm window's steps.
  ValueWindow grad_norm;
  FlagSeries clipped;
  FlagSeries skipped;
  // Only steps that carry the field are pushed. Read for their baselines
  // only, so they keep no sorted copy.
  ValueWindow max_attn_logit;
  ValueWindow log_z;

  void RewindTo(uint64_t step) {
    const size_t before = grad_norm.slots();
    grad_norm.RewindTo(step);
    const size_t dropped = before - grad_norm.slots();
    clipped.PopNewest(dropped);
    skipped.PopNewest(dropped);
    max_attn_logit.RewindTo(step);
    log_z.RewindTo(step);
  }
};

// Robust linear trends of the slowly moving signals over their last ~1,000
// post-warmup values, for the forecasts of docs/detectors.md (AttentionLogitGrowth
// reaching the cap, LogZDrift moving its threshold, within a horizon).
struct Trends {
  TrendForecaster max_attn_logit{TrendForecaster::Options{}};
  TrendForecaster log_z{TrendForecaster::Options{}};

  void RewindTo(uint64_t step) {
    max_attn_logit.RewindTo(step);
    log_z.RewindTo(step);
  }
};

// Medians of the first W post-warmup steps, taken once when they are in
// (log Z's is LogZDrift's own: RunHealth::LogZBaseline).
struct Baselines {
  std::optional<double> grad_norm_median;
  std::optional<double> max_attn_logit_median;
  // The last post-warmup step of the baselines; a rewind to or before it
  // retakes them.
  uint64_t through_step = 0;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_SIGNALS_WINDOW_H_
