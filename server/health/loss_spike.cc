#include "health/loss_spike.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace trainwatch {

std::optional<LossSpikeRule::Result> LossSpikeRule::Add(uint64_t step,
                                                        double loss) {
  if (!std::isfinite(loss) || !(loss > 0)) return std::nullopt;
  const double x = std::log(loss);
  if (!median_.has_value() || history_.size() < options_.min_steps) {
    Push(x);
    return std::nullopt;
  }
  const double line =
      std::max(std::log(options_.min_ratio), options_.sigmas * sd_);
  Result out;
  out.high = x - *median_ >= line;
  if (out.high) {
    out.ratio = std::exp(x - *median_);
    out.level = std::exp(*median_);
    if (high_run_ == 0) high_since_ = step;
    ++high_run_;
    out.fired_now = high_run_ == options_.stay_steps;
    out.onset_step = high_since_;
    // Up for longer than the history holds: that is the new level.
    if (high_run_ > options_.recent_steps) Push(x);
  } else {
    high_run_ = 0;
    Push(x);
  }
  return out;
}

void LossSpikeRule::Push(double log_loss) {
  const size_t cap = std::max<uint32_t>(options_.recent_steps, 1);
  if (history_.size() < cap) {
    history_.push_back(log_loss);
  } else {
    left_.push_back(history_[next_]);
    history_[next_] = log_loss;
    next_ = (next_ + 1) % cap;
  }
  entered_.push_back(log_loss);
  if (!median_.has_value() || ++since_refresh_ >= options_.refresh_steps) {
    Refresh();
  }
}

void LossSpikeRule::UpdateSorted() {
  // The few values that entered since the last refresh go in, in one pass,
  // then those that left come out (any copy of an equal value will do), in
  // another. Each pass walks the ~100 values with a branch that changes
  // only at the few values moved, so it is predicted: ~2 cycles a value,
  // where binary searches (one mispredict in two, or a chain of dependent
  // loads without branches) cost several times as much here.
  thread_local std::vector<double> merged;  // scratch, shared by the runs
  std::sort(entered_.begin(), entered_.end());
  const size_t n = sorted_.size();
  merged.resize(n + entered_.size());
  size_t i = 0, out = 0;
  for (double v : entered_) {
    while (i < n && !(v < sorted_[i])) merged[out++] = sorted_[i++];
    merged[out++] = v;
  }
  while (i < n) merged[out++] = sorted_[i++];
  entered_.clear();
  // Each value that left is in merged (it entered before it left); the
  // walk goes past one copy of each.
  std::sort(left_.begin(), left_.end());
  const size_t m = merged.size();
  sorted_.resize(m >= left_.size() ? m - left_.size() : 0);
  i = 0;
  out = 0;
  for (double v : left_) {
    while (i < m && merged[i] < v) sorted_[out++] = merged[i++];
    if (i < m) ++i;  // v itself
  }
  while (i < m) sorted_[out++] = merged[i++];
  sorted_.resize(out);
  left_.clear();
}

void LossSpikeRule::Refresh() {
  since_refresh_ = 0;
  UpdateSorted();
  // The upper median, as MedianOf(): index n / 2 in order.
  const size_t n = sorted_.size(), k = n / 2;
  const double m = sorted_[k];
  median_ = m;
  // The absolute deviations from m grow outwards from index k (|v - m|
  // rounds to exactly m - v below and v - m above, both monotone), so the
  // k + 1 smallest of them are a window [s, s + k] of the sorted values,
  // s <= n - 1 - k, and the k-th smallest (MedianOf() of the deviations) is
  // the least over s of max(m - v[s], v[s + k] - m). The first term falls
  // with s, the second grows: search for the first s where the second is
  // the larger; the least is there or just before.
  const double* v = sorted_.data();
  size_t lo = 0, count = n - k;  // s in [lo, lo + count)
  while (count > 0) {
    const size_t half = count / 2, s = lo + half;
    const bool before = v[s + k] - m < m - v[s];
    lo = before ? s + 1 : lo;
    count = before ? count - half - 1 : half;
  }
  double mad = std::numeric_limits<double>::infinity();
  if (lo < n - k) mad = v[lo + k] - m;
  if (lo > 0) mad = std::min(mad, m - v[lo - 1]);
  sd_ = std::max(1.4826 * mad, options_.min_sd);
}

void LossSpikeRule::Reset() {
  history_.clear();
  sorted_.clear();
  entered_.clear();
  left_.clear();
  next_ = 0;
  since_refresh_ = 0;
  median_.reset();
  high_run_ = 0;
}

}  // namespace trainwatch
