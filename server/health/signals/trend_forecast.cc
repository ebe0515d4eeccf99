#include "health/signals/trend_forecast.h"

#include <algorithm>
#include <cmath>

#include "health/signals/select.h"

namespace trainwatch {
namespace {

// Points between two fits.
constexpr size_t kFitEvery = 8;
// Slopes each side of the median that the next fit's bracket aims to hold:
// with 192, ~95% of fits found the median inside on the noisiest series of
// TheFitIsTheilSenExactly (96: ~80%), ~87% on the load generator's noise; a
// miss costs one selection among all the slopes, as every fit did before.
constexpr size_t kAimed = 192;

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

std::optional<double> TrendForecaster::MedianSlopeInOrder(
    std::vector<double>& all) {
  // Only for points in step order, their steps distinct as doubles (which
  // implies distinct steps: the conversion keeps order): then every pair's
  // dx is > 0 and no pair is skipped.
  const size_t n = steps_.size();
  thread_local std::vector<double> xs, vs, inside;
  xs.resize(n);
  vs.resize(n);
  for (size_t t = 0; t < n; ++t) {
    const size_t slot = (head_ + t) % n;
    xs[t] = static_cast<double>(steps_[slot]);
    vs[t] = values_[slot];
    if (t > 0 && !(xs[t] > xs[t - 1])) return std::nullopt;
  }
  // (v[j] - v[i]) / (x[j] - x[i]) is the same double for either order of a
  // pair, so these are the slopes of the ring-order loop exactly. One pass
  // keeps them all and, apart, those inside the bracket.
  const size_t pairs = n * (n - 1) / 2, k = pairs / 2;
  const double lo = last_slope_ - below_width_, hi = last_slope_ + above_width_;
  all.resize(pairs);
  inside.resize(pairs);
  size_t below = 0, in = 0, at = 0;
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      // No branches: a mispredicted one every other slope (half are below)
      // would stall on the division each time. lo <= hi, so a slope below
      // lo is also at most hi.
      const double s = (vs[j] - vs[i]) / (xs[j] - xs[i]);
      const size_t is_below = s < lo, at_most_hi = s <= hi;
      below += is_below;
      all[at++] = s;
      inside[in] = s;
      in += at_most_hi - is_below;
    }
  }
  if (bracket_valid_ && k >= below && k < below + in) {
    const double median = SelectKth(inside.data(), in, k - below);
    ++bracketed_fits_;
    // Aim the next bracket at ~kAimed slopes each side of this median: the
    // slopes near a median are about evenly spread, so scale each width by
    // how far from that count this side was (at most 4x either way).
    const auto rescale = [](double width, size_t count) {
      const double r = static_cast<double>(kAimed) /
                       static_cast<double>(std::max<size_t>(count, 1));
      return width * std::clamp(r, 0.25, 4.0);
    };
    below_width_ = rescale(below_width_, k - below);
    above_width_ = rescale(above_width_, below + in - 1 - k);
    return median;
  }
  const double median = SelectKth(all.data(), pairs, k);
  if (bracket_valid_) {
    // Missed: the median moved further than the bracket reached. Widen both
    // sides to at least that move; the next fits narrow them again.
    const double moved = std::abs(median - last_slope_);
    below_width_ = above_width_ =
        std::max({below_width_, above_width_, moved});
  } else {
    SetBracket(all, median);
  }
  return median;
}

void TrendForecaster::SetBracket(std::vector<double>& slopes, double median) {
  // The slopes kAimed ranks either side of the median.
  const size_t k = slopes.size() / 2, r = std::min(kAimed, k);
  below_width_ = median - SelectKth(slopes.data(), slopes.size(), k - r);
  above_width_ = SelectKth(slopes.data(), slopes.size(),
                           std::min(k + r, slopes.size() - 1)) -
                 median;
  bracket_valid_ = true;
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
  std::optional<double> in_order = MedianSlopeInOrder(scratch);
  double slope;
  if (in_order.has_value()) {
    slope = *in_order;
  } else {
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
      bracket_valid_ = false;
      return;
    }
    slope = SelectKth(scratch.data(), scratch.size(), scratch.size() / 2);
    SetBracket(scratch, slope);
  }
  // A bracket needs finite ends (slopes of huge values can be infinite).
  bracket_valid_ = bracket_valid_ && std::isfinite(slope) &&
                   std::isfinite(below_width_) && std::isfinite(above_width_);
  last_slope_ = slope;
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

std::optional<uint64_t> OutwardCrossing(const TrendForecaster& trend, double base,
                                        double distance) {
  if (!trend.trend().has_value()) return std::nullopt;
  const TrendForecaster::Trend& t = *trend.trend();
  const double away = t.level - base;
  const bool outward = base >= 0 ? t.level > base : t.level < base;
  if (3 * std::abs(away) < 2 * distance || !outward || (away > 0) != (t.slope > 0)) {
    return std::nullopt;
  }
  return trend.StepReaching(base + (away > 0 ? distance : -distance));
}

}  // namespace trainwatch
