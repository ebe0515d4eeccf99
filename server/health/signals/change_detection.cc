#include "health/signals/change_detection.h"

#include <algorithm>
#include <cmath>

#include "health/signals/select.h"

namespace trainwatch {
namespace {

// Solves f(h) = arl0 for an increasing f by bisection on [0, 1000].
template <typename F>
double SolveIncreasing(F f, double arl0) {
  double lo = 0.0, hi = 1000.0;
  if (f(lo) >= arl0) return lo;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (f(mid) < arl0 ? lo : hi) = mid;
  }
  return hi;
}

// The smallest CUSUM threshold used, in sd.
constexpr double kMinThreshold = 1.0;

// KL(Bernoulli(p) || Bernoulli(q)).
double BernoulliKl(double p, double q) {
  return p * std::log(p / q) + (1 - p) * std::log((1 - p) / (1 - q));
}

}  // namespace

double GaussianCusumThreshold(double k, double arl0) {
  k = std::max(k, 1e-3);
  auto arl = [k](double h) {
    const double x = 2 * k * (h + 1.166);
    return (std::exp(std::min(x, 700.0)) - x - 1) / (2 * k * k);
  };
  return SolveIncreasing(arl, arl0);
}

double LlrCusumThreshold(double kl, double arl0) {
  kl = std::max(kl, 1e-12);
  auto arl = [kl](double h) {
    const double b = h + 0.5;
    return (std::exp(std::min(b, 700.0)) - b - 1) / kl;
  };
  return SolveIncreasing(arl, arl0);
}

bool Cusum::Add(uint64_t step, double increment) {
  if (statistic_ <= 0.0) onset_step_ = step;
  statistic_ = std::max(0.0, statistic_ + increment);
  return statistic_ > threshold_;
}

ShiftAlarm::State ShiftAlarm::Add(uint64_t step, double up_increment,
                                  double down_increment) {
  State out;
  const bool up_alarm = up_.Add(step, up_increment);
  switch (phase_) {
    case Phase::kIdle:
      if (up_alarm) {
        phase_ = Phase::kFiring;
        onset_step_ = up_.onset_step();
        out.fired_now = true;
        down_.Reset();
      }
      break;
    case Phase::kFiring:
      if (down_.Add(step, down_increment)) {
        phase_ = Phase::kCooling;
        cooling_since_ = step;
        up_.Reset();
      }
      break;
    case Phase::kCooling:
      if (up_alarm) {
        // Back above before the alert resolved: the same episode.
        phase_ = Phase::kFiring;
        down_.Reset();
      } else if (step >= cooling_since_ + resolve_after_steps_) {
        phase_ = Phase::kIdle;
      }
      break;
  }
  out.holds = phase_ == Phase::kFiring;
  out.onset_step = onset_step_;
  return out;
}

void ShiftAlarm::Reset() {
  up_.Reset();
  down_.Reset();
  phase_ = Phase::kIdle;
}

bool Hysteresis::Update(uint64_t step, bool fires, bool holds) {
  if (fires || (firing_ && holds)) {
    firing_ = true;
    last_hold_step_ = step;
    return true;
  }
  if (firing_ && step >= last_hold_step_ + resolve_after_steps_) {
    firing_ = false;
  }
  return false;
}

std::optional<RobustStats> Robust(std::vector<double>& values) {
  if (values.empty()) return std::nullopt;
  RobustStats out{.median = MedianOf(values.data(), values.size())};
  for (double& v : values) v = std::abs(v - out.median);
  out.sd = 1.4826 * MedianOf(values.data(), values.size());
  return out;
}

LevelShiftDetector::LevelShiftDetector(const Options& options)
    : options_(options), up_(0.0, 0), down_(0.0, 0) {}

std::optional<LevelShiftDetector::Result> LevelShiftDetector::Add(
    uint64_t step, double x) {
  if (!std::isfinite(x)) return std::nullopt;
  if (!baseline_.has_value()) {
    baseline_values_.push_back(x);
    baseline_last_step_ = step;
    if (baseline_values_.size() < std::max<uint32_t>(options_.baseline_steps, 1)) {
      return std::nullopt;
    }
    baseline_ = Robust(baseline_values_);
    baseline_->sd = std::max(baseline_->sd, options_.min_sd);
    std::vector<double>().swap(baseline_values_);
    const double sd = baseline_->sd;
    const double shift = std::abs(options_.shift);
    reference_ = shift - std::min(shift / 4, 2 * sd);
    k_ = reference_ / sd;
    // Far-apart hypotheses (a shift of many sd) give a tiny h; the clamp
    // still asks for min_steps steps past the reference.
    h_ = std::max(GaussianCusumThreshold(k_, options_.arl0), kMinThreshold);
    up_ = Side(h_, options_.resolve_after_steps);
    down_ = Side(h_, options_.resolve_after_steps);
    return std::nullopt;
  }
  const double z = (x - baseline_->median) / baseline_->sd;
  Result up = AddSide(up_, step, z, x);
  if (!options_.two_sided) return up;
  Result down = AddSide(down_, step, -z, x);
  down.downward = true;
  if (up.holds || up.fired_now) return up;
  return down.holds || down.fired_now ? down : up;
}

LevelShiftDetector::Result LevelShiftDetector::AddSide(Side& side,
                                                       uint64_t step, double z,
                                                       double x) {
  // Evidence per step is clamped: a shift must persist ~min_steps steps.
  const double reach = h_ / std::max<uint32_t>(options_.min_steps, 1);
  const double up_inc = std::clamp(z, k_ - h_, k_ + reach) - k_;
  const double resolve_k = options_.resolve_ratio * k_;
  const double down_inc = resolve_k - std::clamp(z, resolve_k - reach,
                                                 resolve_k + h_);
  if (!side.alarm.firing() && side.alarm.up().statistic() <= 0.0) {
    side.segment_sum = 0.0;
    side.segment_steps = 0;
  }
  ShiftAlarm::State s = side.alarm.Add(step, up_inc, down_inc);
  if (side.alarm.firing() || side.alarm.up().statistic() > 0.0) {
    side.segment_sum += x;
    ++side.segment_steps;
  }
  Result out{.holds = s.holds, .fired_now = s.fired_now,
             .onset_step = s.onset_step};
  out.level = side.segment_steps > 0 ? side.segment_sum / side.segment_steps : x;
  return out;
}

void LevelShiftDetector::RewindTo(uint64_t step) {
  if (baseline_.has_value() && step > baseline_last_step_) return;
  baseline_.reset();
  baseline_values_.clear();
  up_ = Side(0.0, 0);
  down_ = Side(0.0, 0);
}

RateShiftDetector::RateShiftDetector(const Options& options)
    : alarm_(0.0, 0.0, 0) {
  const double t = std::clamp(options.threshold, 1e-4, 0.24);
  // In control at half the threshold, against 3x it: 19% is named in ~50
  // steps, 25% in ~30, 15% in ~70 (the least possible against 2.5% at this
  // ARL0, ln(ARL0 x KL) / KL(15% || 2.5%), is ~74), and a rate hovering
  // a little above the threshold carries no drift to fire again.
  const double p0 = t / 2, p1 = 3 * t;
  up_hit_ = std::log(p1 / p0);
  up_miss_ = std::log((1 - p1) / (1 - p0));
  const double r = std::clamp(options.resolve_ratio * t, 1e-4, 0.24);
  const double q0 = 2 * r, q1 = r / 2;  // in control: still high
  down_hit_ = std::log(q1 / q0);
  down_miss_ = std::log((1 - q1) / (1 - q0));
  alarm_ = ShiftAlarm(LlrCusumThreshold(BernoulliKl(p0, p1), options.arl0),
                      LlrCusumThreshold(BernoulliKl(q0, q1), options.arl0),
                      options.resolve_after_steps);
}

RateShiftDetector::Result RateShiftDetector::Add(uint64_t step, bool flagged) {
  if (!alarm_.firing() && alarm_.up().statistic() <= 0.0) {
    segment_hits_ = 0;
    segment_steps_ = 0;
  }
  ShiftAlarm::State s = alarm_.Add(step, flagged ? up_hit_ : up_miss_,
                                   flagged ? down_hit_ : down_miss_);
  if (alarm_.firing() || alarm_.up().statistic() > 0.0) {
    segment_hits_ += flagged;
    ++segment_steps_;
  }
  Result out{.holds = s.holds, .fired_now = s.fired_now,
             .onset_step = s.onset_step};
  out.rate = segment_steps_ > 0
                 ? static_cast<double>(segment_hits_) / segment_steps_
                 : 0.0;
  return out;
}

void RateShiftDetector::Reset() {
  alarm_.Reset();
  segment_hits_ = 0;
  segment_steps_ = 0;
}

RateFallTest::RateFallTest(double threshold, double resolve_ratio,
                           double arl0) {
  // As RateShiftDetector clamps it.
  const double q0 = std::clamp(threshold, 1e-4, 0.24);
  const double q1 = resolve_ratio * q0 / 2;
  hit_ = std::log(q1 / q0);
  miss_ = std::log((1 - q1) / (1 - q0));
  cusum_ = Cusum(LlrCusumThreshold(BernoulliKl(q0, q1), arl0));
}

}  // namespace trainwatch
