#include "health/loss_spike.h"

#include <algorithm>
#include <cmath>

#include "health/select.h"

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
  Result out{.ratio = std::exp(x - *median_), .level = std::exp(*median_)};
  out.high = x - *median_ >= line;
  if (out.high) {
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
    history_[next_] = log_loss;
    next_ = (next_ + 1) % cap;
  }
  if (!median_.has_value() || ++since_refresh_ >= options_.refresh_steps) {
    Refresh();
  }
}

void LossSpikeRule::Refresh() {
  since_refresh_ = 0;
  scratch_.assign(history_.begin(), history_.end());
  median_ = MedianOf(scratch_.data(), scratch_.size());
  for (double& v : scratch_) v = std::abs(v - *median_);
  sd_ = std::max(1.4826 * MedianOf(scratch_.data(), scratch_.size()),
                 options_.min_sd);
}

void LossSpikeRule::Reset() {
  history_.clear();
  next_ = 0;
  since_refresh_ = 0;
  median_.reset();
  high_run_ = 0;
}

}  // namespace trainwatch
