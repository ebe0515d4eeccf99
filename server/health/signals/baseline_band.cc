#include "health/signals/baseline_band.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "health/signals/change_detection.h"

namespace trainwatch {

namespace {

// The sd of a normal sample from its median absolute deviation.
constexpr double kMadToSd = 1.4826;
// The sd of a median of n normal values is about this times sd / sqrt(n).
constexpr double kMedianEfficiency = 1.2533;
// Successive differences kept for the run's noise.
constexpr size_t kNoiseDiffs = 400;
// A bin where the references' median moves more than this many sds of the
// bin's noise over its width is steep: there seeds differ most (one is a
// little ahead of another along the axis, and the curve falls fast), and
// that spread says little of theirs where the curve has flattened. The
// band of a flat bin pools the spread of flat bins only, once there are
// kMinFlatBins of them; a steep bin's pools every bin, as before.
constexpr double kSteep = 2.0;
constexpr size_t kMinFlatBins = 3;

// How much wider than a known sd's a band must be when its sd is estimated
// from `df` degrees of freedom, for the same coverage: Student's t over the
// normal's quantile, two-sided 95% (the band is +-2 sds). A spread pooled
// over a few bins is a few draws of a chi-square: at the first bins after
// warmup, with two references, it is as likely as not to be a third of the
// seeds' true spread, and a healthy seed left such a band (the eighth and
// tenth passes' SGD recipes, docs/baselines.md).
double SmallSampleFactor(double df) {
  // t(0.975, df) for df = 1..10, 15, 20, 30; beyond 30, 1.96 + 2.4 / df.
  static constexpr double kT[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447,
                                  2.365,  2.306, 2.262, 2.228};
  double t;
  if (df < 1) {
    t = kT[0];
  } else if (df <= 10) {
    t = kT[static_cast<size_t>(df) - 1];
  } else if (df <= 15) {
    t = 2.228 + (df - 10) / 5 * (2.131 - 2.228);
  } else if (df <= 20) {
    t = 2.131 + (df - 15) / 5 * (2.086 - 2.131);
  } else if (df <= 30) {
    t = 2.086 + (df - 20) / 10 * (2.042 - 2.086);
  } else {
    t = 1.96 + 2.4 / df;
  }
  return t / 1.96;
}

double Median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  double m = v[mid];
  if (v.size() % 2 == 0) {
    m = (m + *std::max_element(v.begin(), v.begin() + mid)) / 2;
  }
  return m;
}

// The robust sd of one value from successive differences d (each of two
// values' noise): MAD(d) * 1.4826 / sqrt(2). A trend shifts every d alike
// and leaves their spread.
double NoiseFromDiffs(const std::vector<double>& d) {
  if (d.size() < 4) return 0;
  const double med = Median(d);
  std::vector<double> dev(d.size());
  for (size_t i = 0; i < d.size(); ++i) dev[i] = std::abs(d[i] - med);
  return Median(std::move(dev)) * kMadToSd / std::sqrt(2.0);
}

}  // namespace

const char* BaselineMetricName(BaselineMetric metric) {
  switch (metric) {
    case BaselineMetric::kLoss:
      return "loss";
    case BaselineMetric::kGradNorm:
      return "grad_norm";
    case BaselineMetric::kLogZ:
      return "log_z";
    case BaselineMetric::kMaxAttnLogit:
      return "max_attn_logit";
  }
  return "?";
}

std::optional<BaselineMetric> BaselineMetricByName(std::string_view name) {
  for (BaselineMetric m : kBaselineMetrics) {
    if (std::string_view(BaselineMetricName(m)) == name) return m;
  }
  return std::nullopt;
}

std::optional<double> BaselineValue(BaselineMetric metric, const v1::StepRecord& r) {
  double v = 0;
  switch (metric) {
    case BaselineMetric::kLoss:
      if (!r.has_loss()) return std::nullopt;
      v = r.loss();
      break;
    case BaselineMetric::kGradNorm:
      if (r.skipped()) return std::nullopt;  // an fp16 overflow's norm is no level
      v = r.grad_norm();
      break;
    case BaselineMetric::kLogZ:
      if (!r.has_log_z() || !std::isfinite(r.log_z())) return std::nullopt;
      return r.log_z();
    case BaselineMetric::kMaxAttnLogit:
      if (!r.has_max_attn_logit()) return std::nullopt;
      v = r.max_attn_logit();
      break;
  }
  if (!std::isfinite(v) || v <= 0) return std::nullopt;
  return std::log(v);
}

std::optional<double> BaselineLr(const v1::StepRecord& r) {
  if (!r.has_lr() || !std::isfinite(r.lr()) || r.lr() <= 0) return std::nullopt;
  return r.lr();
}

double BaselineUnits(BaselineMetric metric, double value) {
  return metric == BaselineMetric::kLogZ ? value : std::exp(value);
}

const char* BaselineAxisName(BaselineAxis axis) {
  return axis == BaselineAxis::kTokens ? "tokens" : "step";
}

bool ReferenceRun::HasTokens() const {
  if (points.empty()) return false;
  for (const ReferencePoint& p : points) {
    if (!p.tokens.has_value()) return false;
  }
  return true;
}

std::string DescribeRefs(const BaselineReferences& refs) {
  std::string out;
  for (const ReferenceRun& r : refs.runs) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", r.ref.run(), "@", r.ref.attempt());
  }
  return out;
}

BaselineAxis ChooseAxis(const v1::StepRecord& first_record, const BaselineReferences& refs,
                        std::optional<BaselineAxis> wanted) {
  if (wanted == BaselineAxis::kStep) return BaselineAxis::kStep;
  bool tokens = first_record.has_tokens() && !refs.runs.empty();
  for (const ReferenceRun& r : refs.runs) tokens = tokens && r.HasTokens();
  return tokens ? BaselineAxis::kTokens : BaselineAxis::kStep;
}

BaselineBand::BaselineBand(BaselineMetric metric, BaselineAxis axis,
                           std::shared_ptr<const BaselineReferences> refs,
                           uint64_t warmup_steps, BandOptions options)
    : metric_(metric),
      axis_(axis),
      refs_(std::move(refs)),
      options_(options),
      warmup_steps_(warmup_steps) {
  const size_t m = static_cast<size_t>(metric);
  for (const ReferenceRun& run : refs_->runs) {
    RefCurve& c = curves_.emplace_back();
    std::vector<double> diffs;
    for (const ReferencePoint& p : run.points) {
      const double v = p.value[m];
      if (!std::isfinite(v)) continue;
      if (axis_ == BaselineAxis::kTokens && !p.tokens.has_value()) continue;
      const double x = axis_ == BaselineAxis::kTokens ? static_cast<double>(*p.tokens)
                                                      : static_cast<double>(p.step);
      if (!c.x.empty() && x < c.x.back()) continue;  // the axis must not go back
      if (!c.v.empty()) diffs.push_back(v - c.v.back());
      c.x.push_back(x);
      c.v.push_back(v);
      c.lr.push_back(p.lr);
    }
    c.noise = NoiseFromDiffs(diffs);
    if (!c.x.empty() && !(c.x.front() <= refs_start_x_)) refs_start_x_ = c.x.front();
  }
}

void BaselineBand::Reset() {
  bin_.clear();
  last_value_.reset();
}

std::optional<BandBin> BaselineBand::Add(const v1::StepRecord& record) {
  const std::optional<double> v = BaselineValue(metric_, record);
  if (!v.has_value()) return std::nullopt;
  if (axis_ == BaselineAxis::kTokens && !record.has_tokens()) return std::nullopt;
  const double x = axis_ == BaselineAxis::kTokens ? static_cast<double>(record.tokens())
                                                  : static_cast<double>(record.step());
  if (!judge_from_.has_value()) {
    const bool from_warmup_end = record.step() < warmup_steps_ + options_.bin_steps;
    judge_from_ = from_warmup_end && x > refs_start_x_ ? 2 * x - refs_start_x_ : x;
  }
  if (x < *judge_from_) return std::nullopt;
  if (last_value_.has_value()) {
    run_diffs_.push_back(*v - *last_value_);
    if (run_diffs_.size() > kNoiseDiffs) run_diffs_.pop_front();
  }
  last_value_ = *v;
  bin_.push_back(Sample{record.step(), x, *v,
                        BaselineLr(record).value_or(std::numeric_limits<double>::quiet_NaN())});
  if (bin_.size() < options_.bin_steps) return std::nullopt;
  std::optional<BandBin> out = Close();
  bin_.clear();
  return out;
}

std::optional<std::pair<double, int>> BaselineBand::RefValue(size_t ref, double x0,
                                                             double x1) const {
  const RefCurve& c = curves_[ref];
  if (c.x.empty() || c.x.front() > x0 || c.x.back() < x1) return std::nullopt;
  const auto lo = std::lower_bound(c.x.begin(), c.x.end(), x0);
  const auto hi = std::upper_bound(c.x.begin(), c.x.end(), x1);
  if (hi - lo >= 3) {
    std::vector<double> in(c.v.begin() + (lo - c.x.begin()), c.v.begin() + (hi - c.x.begin()));
    const int n = static_cast<int>(in.size());
    return std::make_pair(Median(std::move(in)), n);
  }
  // Too few of its records in the range: interpolate at the centre.
  const double xc = (x0 + x1) / 2;
  const size_t j = std::lower_bound(c.x.begin(), c.x.end(), xc) - c.x.begin();
  if (j == 0) return std::make_pair(c.v.front(), 1);
  if (j >= c.x.size()) return std::make_pair(c.v.back(), 1);
  const double span = c.x[j] - c.x[j - 1];
  const double t = span > 0 ? (xc - c.x[j - 1]) / span : 0;
  return std::make_pair(c.v[j - 1] + t * (c.v[j] - c.v[j - 1]), 1);
}

double BaselineBand::RefLr(size_t ref, double x0, double x1) const {
  const RefCurve& c = curves_[ref];
  const size_t lo = std::lower_bound(c.x.begin(), c.x.end(), x0) - c.x.begin();
  const size_t hi = std::upper_bound(c.x.begin(), c.x.end(), x1) - c.x.begin();
  std::vector<double> in;
  for (size_t i = lo; i < hi; ++i) {
    if (std::isfinite(c.lr[i])) in.push_back(c.lr[i]);
  }
  return Median(std::move(in));
}

double BaselineBand::RefLrBySteps(size_t ref, uint64_t first, uint64_t last) const {
  const std::vector<ReferencePoint>& points = refs_->runs[ref].points;
  auto it = std::lower_bound(points.begin(), points.end(), first,
                             [](const ReferencePoint& p, uint64_t s) { return p.step < s; });
  std::vector<double> in;
  for (; it != points.end() && it->step <= last; ++it) {
    if (std::isfinite(it->lr)) in.push_back(it->lr);
  }
  return Median(std::move(in));
}

double BaselineBand::RefSlope(double x0, double x1) const {
  const double w = x1 - x0;
  if (!(w > 0)) return 0;
  std::vector<double> slopes;
  for (size_t i = 0; i < curves_.size(); ++i) {
    const auto after = RefValue(i, x1 + 1, x1 + w);
    if (!after.has_value()) continue;
    // From the width before, or from the bin itself at the reference's start.
    if (const auto before = RefValue(i, x0 - w, x0 - 1); before.has_value()) {
      slopes.push_back((after->first - before->first) / 2);
    } else if (const auto at = RefValue(i, x0, x1); at.has_value()) {
      slopes.push_back(after->first - at->first);
    }
  }
  return slopes.empty() ? 0 : std::abs(Median(std::move(slopes)));
}

std::optional<BandBin> BaselineBand::Close() {
  BandBin b;
  b.first_step = bin_.front().step;
  b.last_step = bin_.back().step;
  b.x_first = bin_.front().x;
  b.x_last = bin_.back().x;
  b.x = (b.x_first + b.x_last) / 2;
  std::vector<double> values;
  for (const Sample& s : bin_) values.push_back(s.value);
  b.value = Median(std::move(values));
  const double n_run = static_cast<double>(bin_.size());
  std::vector<double> run_lrs;
  for (const Sample& s : bin_) {
    if (std::isfinite(s.lr)) run_lrs.push_back(s.lr);
  }
  const double run_lr = Median(std::move(run_lrs));
  std::vector<double> ref_lrs, ref_lrs_by_step;

  std::vector<double> ref_values;
  double noise_var = 0;  // of the references' median, from their noise
  for (size_t i = 0; i < curves_.size(); ++i) {
    const auto r = RefValue(i, b.x_first, b.x_last);
    if (!r.has_value()) continue;
    ref_values.push_back(r->first);
    const double lr = RefLr(i, b.x_first, b.x_last);
    if (std::isfinite(lr)) ref_lrs.push_back(lr);
    // On the step axis x is the step: the same LR.
    if (axis_ == BaselineAxis::kTokens) {
      const double by_step = RefLrBySteps(i, b.first_step, b.last_step);
      if (std::isfinite(by_step)) ref_lrs_by_step.push_back(by_step);
    }
    const double sd = kMedianEfficiency * curves_[i].noise / std::sqrt(r->second);
    noise_var += sd * sd;
  }
  if (ref_values.empty()) return std::nullopt;
  b.refs = static_cast<int>(ref_values.size());
  const double k = static_cast<double>(ref_values.size());
  b.ref_median = Median(ref_values);
  if (!ref_lrs.empty() && std::isfinite(run_lr)) {
    b.lr_ratio = run_lr / Median(std::move(ref_lrs));
    if (!ref_lrs_by_step.empty()) {
      const double by_step = run_lr / Median(std::move(ref_lrs_by_step));
      // The references' LR at the same step and not at the same tokens:
      // another batch size under a schedule written in steps, here at
      // another point of its schedule than they were at these tokens (mid
      // decay where they had annealed). Its loss at these tokens is not
      // the recipe's: the bin is not judged.
      if (b.lr_changed(options_.lr_changed) && !RatioChanged(by_step, options_.lr_changed)) {
        return std::nullopt;
      }
      if (std::abs(std::log(by_step)) < std::abs(std::log(b.lr_ratio))) b.lr_ratio = by_step;
    }
  }

  // Noise: the run's bin median against the references' (the mean of k
  // independent medians has var sum / k^2; their median is close to it).
  const double run_sd = kMedianEfficiency * NoiseFromDiffs({run_diffs_.begin(), run_diffs_.end()}) /
                        std::sqrt(n_run);
  const double noise_sd = std::sqrt(run_sd * run_sd + noise_var / (k * k));
  // The residual's sd, and the same before the small-sample widening.
  double sd = noise_sd, sd_as_estimated = noise_sd;
  if (ref_values.size() >= 2) {
    // Spread: the references' variance around their median, pooled over
    // recent bins (their mean: the median of one degree of freedom's is
    // biased low); the run is one more draw, so its residual has var
    // s^2 (1 + 1/k).
    double ss = 0;
    for (double v : ref_values) ss += (v - b.ref_median) * (v - b.ref_median);
    const bool steep = RefSlope(b.x_first, b.x_last) > kSteep * noise_sd;
    spreads_.push_back(ss / (k - 1));
    if (spreads_.size() > options_.spread_bins) spreads_.pop_front();
    if (!steep) {
      flat_spreads_.push_back(ss / (k - 1));
      if (flat_spreads_.size() > options_.spread_bins) flat_spreads_.pop_front();
    }
    const std::deque<double>& pool =
        !steep && flat_spreads_.size() >= kMinFlatBins ? flat_spreads_ : spreads_;
    double pooled = 0;
    for (double var : pool) pooled += var;
    const double spread = std::sqrt(pooled / static_cast<double>(pool.size()) * (1 + 1 / k));
    // Each bin seen so far gave k - 1 degrees of freedom (the flat pool is
    // a choice among them, not fewer draws of the recipe).
    const auto with_noise = [&](double s) {
      return ref_values.size() >= 3 ? s : std::max(s, noise_sd);
    };
    sd = with_noise(SmallSampleFactor(static_cast<double>(spreads_.size()) * (k - 1)) * spread);
    sd_as_estimated = with_noise(spread);
  }
  const double min_sd = options_.min_half_width / options_.band_sigmas;
  sd = std::max(sd, min_sd);
  b.half_width = options_.band_sigmas * sd;
  b.lo = b.ref_median - b.half_width;
  b.hi = b.ref_median + b.half_width;
  b.z = (b.value - b.ref_median) / sd;
  b.z_as_estimated = (b.value - b.ref_median) / std::max(sd_as_estimated, min_sd);
  return b;
}

ResidualCusum::ResidualCusum(double arl0_records, uint32_t bin_steps, double k)
    : threshold_(GaussianCusumThreshold(k, std::max(2.0, arl0_records / std::max(1u, bin_steps)))),
      k_(k) {}

void ResidualCusum::Reset() {
  up_ = Side{};
  down_ = Side{};
  beyond_twice_ = 0;
}

bool ResidualCusum::Step(Side& side, double increment, const BandBin& bin, bool outside,
                         double threshold) {
  const double was = side.s;
  side.s = std::max(0.0, side.s + increment);
  if (side.s == 0) {
    side = Side{};
    return false;
  }
  if (was == 0) side.onset = bin.first_step;
  if (outside && side.first_outside == 0) side.first_outside = std::max<uint64_t>(bin.first_step, 1);
  if (side.s > threshold) side.alarmed = true;
  return side.alarmed;
}

ResidualCusum::Verdict ResidualCusum::Add(const BandBin& bin) {
  Verdict v;
  v.worse = Step(up_, bin.z - k_, bin, bin.value > bin.hi, threshold_);
  v.better = Step(down_, -bin.z - k_, bin, bin.value < bin.lo, threshold_);
  beyond_twice_ = bin.value - bin.ref_median > 2 * bin.half_width ? beyond_twice_ + 1 : 0;
  v.beyond_twice = beyond_twice_;
  if (v.worse || v.better) v.onset_step = (v.worse ? up_ : down_).Onset();
  if (v.better) v.better_onset_step = down_.Onset();
  return v;
}

}  // namespace trainwatch
