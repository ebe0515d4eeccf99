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
  // One merge of the values that entered since the last refresh into the
  // sorted ones, then one pass dropping those that left (any copy of an
  // equal value will do): ~2 x 100 moves every refresh_steps, where keeping
  // the order at each push cost two binary searches and two memmoves a step.
  std::sort(entered_.begin(), entered_.end());
  merged_.resize(sorted_.size() + entered_.size());
  std::merge(sorted_.begin(), sorted_.end(), entered_.begin(), entered_.end(),
             merged_.begin());
  entered_.clear();
  std::sort(left_.begin(), left_.end());
  sorted_.clear();
  auto gone = left_.begin();
  for (double v : merged_) {
    if (gone != left_.end() && *gone == v) {
      ++gone;
    } else {
      sorted_.push_back(v);
    }
  }
  left_.clear();
}

void LossSpikeRule::Refresh() {
  since_refresh_ = 0;
  UpdateSorted();
  // The upper median, as MedianOf(): index n / 2 in order.
  const size_t n = sorted_.size(), k = n / 2;
  const double m = sorted_[k];
  median_ = m;
  // The absolute deviations from m, in order, are two sorted runs: m - v for
  // the values from index k down, v - m for those above it (|v - m| rounds
  // to exactly these). Their merge's k-th is MedianOf() of the deviations.
  size_t down = k + 1, up = k + 1;  // next of each run: sorted_[down - 1]
  double mad = 0.0;
  for (size_t taken = 0; taken <= k; ++taken) {
    const double left = down > 0 ? m - sorted_[down - 1]
                                 : std::numeric_limits<double>::infinity();
    const double right = up < n ? sorted_[up] - m
                                : std::numeric_limits<double>::infinity();
    if (left <= right) {
      mad = left;
      --down;
    } else {
      mad = right;
      ++up;
    }
  }
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
