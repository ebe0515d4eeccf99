#include "health/trend_forecast.h"

#include <algorithm>
#include <cmath>

#include "health/select.h"

namespace trainwatch {
namespace {

// Points between two fits.
constexpr size_t kFitEvery = 8;

}  // namespace

TrendForecaster::TrendForecaster(const Options& options) : options_(options) {
  options_.stride = std::max<uint32_t>(options_.stride, 1);
  options_.points = std::max<uint32_t>(options_.points, 2);
  options_.min_points =
      std::clamp<uint32_t>(options_.min_points, 2, options_.points);
}

bool TrendForecaster::Add(uint64_t step, double value) {
  if (!std::isfinite(value)) return false;
  pending_.push_back(value);
  pending_last_step_ = step;
  if (pending_.size() < options_.stride) return false;
  const double point = MedianOf(pending_.data(), pending_.size());
  pending_.clear();
  size_t added;  // points added so far, modulo the ring's size
  if (steps_.size() < options_.points) {
    steps_.push_back(pending_last_step_);
    values_.push_back(point);
    added = steps_.size();
  } else {
    steps_[head_] = pending_last_step_;
    values_[head_] = point;
    head_ = (head_ + 1) % options_.points;
    added = head_;
  }
  // The O(points^2) fit once every kFitEvery points (128 values, ~10 us for
  // 2,016 slopes): the trend moves slowly, and a forecast 64 steps later on
  // a 2,000-step horizon costs nothing, while the fit costs ~0.1 us a value.
  if (steps_.size() == options_.min_points || added % kFitEvery == 0) {
    Fit();
    return true;
  }
  if (steps_.size() < options_.min_points) trend_.reset();
  return false;
}

void TrendForecaster::Fit() {
  // The pairwise slopes (2,016 for 64 points), shared by the runs of a thread.
  thread_local std::vector<double> scratch;
  const size_t n = steps_.size();
  if (n < options_.min_points) {
    trend_.reset();
    return;
  }
  // Relative to the newest point's step, so slopes and intercepts stay exact.
  const size_t newest = (head_ + n - 1) % n;
  const uint64_t last = steps_[newest];
  scratch.clear();
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      if (steps_[i] == steps_[j]) continue;
      const double dx = static_cast<double>(steps_[j]) -
                        static_cast<double>(steps_[i]);
      scratch.push_back((values_[j] - values_[i]) / dx);
    }
  }
  if (scratch.empty()) {
    trend_.reset();
    return;
  }
  const double slope = MedianOf(scratch.data(), scratch.size());
  scratch.clear();
  for (size_t i = 0; i < n; ++i) {
    const double dx =
        static_cast<double>(steps_[i]) - static_cast<double>(last);
    scratch.push_back(values_[i] - slope * dx);
  }
  trend_ = Trend{.slope = slope,
                 .level = MedianOf(scratch.data(), scratch.size()),
                 .step = last};
}

std::optional<uint64_t> TrendForecaster::StepReaching(double target) const {
  if (!trend_.has_value()) return std::nullopt;
  const double gap = target - trend_->level;
  if (gap == 0) return trend_->step;
  // Moving away from it (or past it already): no crossing ahead.
  if (trend_->slope == 0 || (gap > 0) != (trend_->slope > 0)) {
    return std::nullopt;
  }
  const double steps = std::ceil(gap / trend_->slope);
  if (!(steps < 1e15)) return std::nullopt;
  return trend_->step + static_cast<uint64_t>(steps);
}

void TrendForecaster::RewindTo(uint64_t step) {
  pending_.clear();
  // Rebuild the ring oldest-first without the rewound points.
  std::vector<uint64_t> steps;
  std::vector<double> values;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const size_t slot = (head_ + i) % steps_.size();
    if (steps_[slot] < step) {
      steps.push_back(steps_[slot]);
      values.push_back(values_[slot]);
    }
  }
  steps_ = std::move(steps);
  values_ = std::move(values);
  head_ = 0;
  Fit();
}

}  // namespace trainwatch
